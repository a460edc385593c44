"""Scaling sweeps on Slurm (``python -m common.sweep submit|status|extend``): see common.sweep.cli."""
