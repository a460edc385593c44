"""ReFrame settings for twinbench's test clusters, Slurm 22.05 without accounting, partition ``debug``:
``twinbench-local``, the single-node Slurm of tests/slurm/start_cluster.sh (picked by default: its host names match
any host), and ``twinbench-emulated``, the 2-node emulated cluster of tests/cluster/cluster.sh (``--system``).

    eval "$(tests/slurm/start_cluster.sh)"       # exports SLURM_CONF
    reframe -C jobs/reframe/settings.py -c jobs/reframe/twinbench_check.py -r --performance-report
    tests/cluster/cluster.sh run DIR login reframe -C jobs/reframe/settings.py --system twinbench-emulated:debug \
        -c jobs/reframe/twinbench_check.py -S num_nodes=2 -S num_tasks_per_node=1 -S cpus_per_task=1 -r

``scheduler: squeue`` is ReFrame's Slurm backend that polls ``squeue`` only: the test cluster has no accounting
(``AccountingStorageType=accounting_storage/none``), so ``sacct``, which the ``slurm`` flavour polls, has nothing.
Jobs run one at a time (``max_jobs: 1``): the machine has 2 cores.

For a real centre, write your own (or add the partition to your existing ReFrame configuration), e.g.:

    'systems': [{
        'name': 'daint', 'hostnames': ['daint'], 'modules_system': 'lmod',
        'partitions': [{
            'name': 'gpu', 'scheduler': 'slurm', 'launcher': 'srun',   # 'slurm' uses sacct: needs accounting
            'access': ['--partition=normal', '--account=ACCOUNT', '--constraint=gpu'],
            'environs': ['builtin'], 'max_jobs': 8,
            'resources': [{'name': '_rfm_gpu', 'options': ['--gres=gpu:{num_gpus_per_node}']}],
        }],
    }]

and give the check a baseline (``-S baseline=DIR``: an earlier run's output directory) for references. The
tests need the ``_rfm_gpu`` resource (one task per GPU: ``--gres=gpu:N``); set ``TWINBENCH_CONDA_ENV`` /
``TWINBENCH_MODULES`` in the environment (``env_vars`` of the environ, or exported before ``reframe``) as for the
sbatch scripts (docs/cluster.md), since every test sources jobs/slurm/env.sh.
"""

site_configuration = {
    "systems": [
        {
            "name": "twinbench-local",
            "descr": "twinbench's single-node test Slurm (tests/slurm/start_cluster.sh)",
            "hostnames": [".*"],
            "modules_system": "nomod",
            "partitions": [
                {
                    "name": "debug",  # start_cluster.sh: PartitionName=debug Nodes=ALL (the one node, `hostname -s`)
                    "descr": "one node, 8 CPUs, 8 fake GPUs",
                    "scheduler": "squeue",
                    "launcher": "srun",
                    "access": ["--partition=debug"],
                    "environs": ["builtin"],
                    "max_jobs": 1,
                    "resources": [{"name": "_rfm_gpu", "options": ["--gres=gpu:{num_gpus_per_node}"]}],
                },
            ],
        },
        {
            # Chosen with --system twinbench-emulated:debug, run on the emulated cluster's login node
            # (tests/cluster/cluster.sh run DIR login reframe ...); its host name never wins the detection above.
            "name": "twinbench-emulated",
            "descr": "twinbench's emulated multi-node cluster (tests/cluster/cluster.sh): node1, node2 behind login",
            "hostnames": ["^login$"],
            "modules_system": "nomod",
            "partitions": [
                {
                    "name": "debug",  # cluster.sh: PartitionName=debug Nodes=ALL
                    "descr": "2 nodes, 2 CPUs and 2 fake GPUs each",
                    "scheduler": "squeue",  # no accounting there either
                    "launcher": "srun",
                    "access": ["--partition=debug"],
                    "environs": ["builtin"],
                    "max_jobs": 1,
                    "resources": [{"name": "_rfm_gpu", "options": ["--gres=gpu:{num_gpus_per_node}"]}],
                },
            ],
        },
    ],
    "environments": [{"name": "builtin", "cc": "cc", "cxx": "", "ftn": ""}],
    # poll squeue at least once a second (ReFrame's default decays to once every 10 s): the runs here take seconds
    "general": [{"check_search_recursive": False, "poll_rate_min": 1}],
}
