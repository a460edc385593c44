"""An example of your own model, data and loss for twinbench (examples/my_job.toml, examples/my_regression.toml).

TensorFlow is imported inside the functions: twinbench imports these modules before TensorFlow starts (to check the
functions exist), and sets TF_USE_LEGACY_KERAS=1 first, so ``tf.keras`` is tf_keras (Keras 2) when they run.
"""
