"""An example of a Keras 3 model, optimizer and learning-rate schedule for twinbench (examples/keras3_job.toml).

The job sets ``keras = 3``: twinbench then builds the model, the optimizer and the schedule with Keras 3 (``import
keras``) and trains them in its custom loop on both backends. Keras is imported inside the functions: twinbench
imports these modules before TensorFlow starts (to check the functions exist).
"""
