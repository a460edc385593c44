"""Diagnostics: the allreduce and point-to-point benchmarks, the step breakdown and the scaling model the report
fits. Imports only the layers below it."""
