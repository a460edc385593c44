"""The workload: the job file, the model and dataset registries, the input pipeline and its exact sharding, TFRecord
shards. Imports only the contract layer below it."""
