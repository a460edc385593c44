"""``python -m backends names`` lists the registry; ``python -m backends command NAME N [ARG ...]`` prints, one
argument per line, the command that starts N local ranks of backend NAME with those arguments (for shell scripts
such as scripts/demo.sh, which must not spell backend names themselves). With ``TWINBENCH_CONTAINER`` set, that
command runs the launcher and all its ranks inside the site's image (common/cluster/container.py).
``python -m backends launch-env`` resolves, once for a script that starts many runs, what each backend's launch lines
depend on (its ``LAUNCH.env``; Horovod's controller: backends/horovod_launch.py): ``NAME=VALUE`` lines to export on
stdout, one line per backend saying the choice on stderr; a choice that cannot run is one line and exit 2.
``python -m backends launchers`` lists every backend's launchers (``LAUNCH``: where each starts ranks, what a rank
reads to know its rank)."""

from __future__ import annotations

import sys

from common import launches
from common.cluster import container
from common.core import registry
from common.core.errors import UsageError


def main(argv: list[str]) -> int:
    if argv[:1] == ["names"] and len(argv) == 1:
        print("\n".join(registry.names()))
        return 0
    if argv == ["launch-env"]:
        return launch_env()
    if argv == ["launchers"]:
        return launchers()
    if argv[:1] == ["command"] and len(argv) >= 3 and argv[2].isdigit() and int(argv[2]) >= 1:
        try:
            module = registry.load(argv[1])
        except ValueError as e:
            print(f"backends: error: {e}", file=sys.stderr)
            return 2
        try:
            box = container.parse()
            line = module.local_command(int(argv[2]), argv[3:], **({"python": box.python} if box else {}))
            print("\n".join(container.wrap(line, box) if box else line))
        except (container.ContainerError, UsageError) as e:
            print(f"backends: error: {e}", file=sys.stderr)
            return 2
        return 0
    print("usage: python -m backends names | command NAME N [ARG ...] | launch-env | launchers", file=sys.stderr)
    return 2


def launch_env() -> int:
    try:
        box = container.parse()
        env, said = launches.resolve(registry.names(), box.python if box else sys.executable)
    except (container.ContainerError, UsageError) as e:
        print(f"backends: error: {e}", file=sys.stderr)
        return 2
    print("\n".join(f"{k}={v}" for k, v in env.items()))
    print("\n".join(said), file=sys.stderr)
    return 0


def launchers() -> int:
    """One line per backend and launcher: ``NAME LAUNCHER SCOPES rank: VARIABLES: summary`` (the Slurm ones the
    sbatch script chooses among by the backend's variable, the first its default)."""
    for name in registry.names():
        launch = registry.spec(name).LAUNCH
        for x in launch.launchers:
            choice = f" ({launch.slurm_variable}={x.name})" if launch.slurm_variable and "slurm" in x.scopes else ""
            rank = ",".join(x.rank) or "-"
            print(f"{name} {x.name} {','.join(x.scopes)}{choice} rank: {rank}: {x.summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
