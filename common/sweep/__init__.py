"""Scaling sweeps on Slurm: ``python -m common.sweep submit|status|extend`` (usage: common.sweep.cli).

Modules, lowest first: layout (world sizes, backends, each run's nodes x ranks and sbatch resources), variants
(``--variant``: a backend with its own flags), order (repeated, interleaved rounds; ``status --until``), plan (every
run of a submission and the manifest that records it), slurm (sbatch commands, submission, the jobs' states), cli
(the three commands). No TensorFlow here.
"""
