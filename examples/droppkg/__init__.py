"""A model with Dropout, as Horovod's TensorFlow 2 examples have (examples/dropout_job.toml): native = Horovod bit for
bit at each size, while 1 worker x 2b and 2 workers x b differ from step 1 (each replica draws its own masks)."""
