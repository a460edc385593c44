"""Training: one run in named steps (train), Keras fit and the custom loop (loops), the one objective, observation,
reliability (watchdog, preemption, checkpoints) and input wait. Imports only the layers below it."""
