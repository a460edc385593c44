"""One allocation for whole rounds (``common.sweep submit --one-allocation [--rounds-per-job K]``): instead of one
Slurm job per run, one job (or one per K rounds) of the largest layout's nodes runs every run of its rounds as a job
step, one after the other, in the sweep's interleaved order (common.sweep.order). A run of n nodes takes the first n
nodes of the allocation, so both backends of a size run on the same nodes, back to back. The job script is made here
from the template ``allocation.sbatch`` (one block per run); it sources jobs/slurm/env.sh and launches each step as
the per-run scripts do (``tb_run srun ...``: requeue on a checkpoint, and the requeued job skips the runs that have
their results). Each step writes ``logs/<run>.step`` (running, then its exit status); ``status`` reads it, so a
failed step is ``failed`` while the job goes on, and a run waiting its turn is ``pending``. No TensorFlow here.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from common.core import registry
from common.sweep import layout as sl
from common.sweep.layout import SweepError

TEMPLATE = Path(__file__).with_name("allocation.sbatch")
DEFAULT_STEP_MINUTES = 30  # a run's time without --time: the per-run scripts' #SBATCH --time=00:30:00
_SIZED = ("--nodes=", "--ntasks-per-node=", "--gres=", "--time=")  # the options the allocation sets itself


def groups(runs: list[dict[str, Any]], rounds_per_job: int | None) -> list[list[dict[str, Any]]]:
    """The runs of each job, in order: whole rounds, ``rounds_per_job`` of them per job (None: all in one)."""
    out: dict[int, list[dict[str, Any]]] = {}
    first = min((int(r.get("round", 1)) for r in runs), default=1)
    for r in runs:
        k = 0 if not rounds_per_job else (int(r.get("round", 1)) - first) // rounds_per_job
        out.setdefault(k, []).append(r)
    return [out[k] for k in sorted(out)]


def minutes(text: str) -> int:
    """A Slurm --time (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S) in whole minutes, rounded up; ValueError if not one."""
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if not m:
        raise ValueError(text)
    d, a, b, c = (int(x) if x else None for x in m.groups())
    if d is not None:  # D-H[:M[:S]]
        secs = ((d * 24 + a) * 60 + (b or 0)) * 60 + (c or 0)
    elif c is not None:  # H:M:S
        secs = (a * 60 + b) * 60 + c
    elif b is not None:  # M:S
        secs = a * 60 + b
    else:  # M
        secs = a * 60
    return -(-secs // 60)


def request(runs: list[dict[str, Any]]) -> list[str]:
    """The job's sbatch resources: the largest layout's nodes, ranks and GPUs per node, each run's --time summed
    (a run's own, else 30 minutes), and every other option the runs share (partition, account, --cpus-per-task...)."""
    nodes = max(int(r["nodes"]) for r in runs)
    per_node = max(int(r["ntasks_per_node"]) for r in runs)
    gpus = max(int(r.get("gpus_per_node") or 0) for r in runs)
    total = 0
    for r in runs:
        t = next((w.split("=", 1)[1] for w in r["resources"] if w.startswith("--time=")), None)
        try:
            total += minutes(t) if t else DEFAULT_STEP_MINUTES
        except ValueError:
            raise SweepError(f"--time {t!r} is not a Slurm time (M, H:M:S, D-H:M...)") from None
    rest = [w for w in runs[0]["resources"] if not w.startswith(_SIZED)]
    return [f"--nodes={nodes}", f"--ntasks-per-node={per_node}", *([f"--gres=gpu:{gpus}"] if gpus else []),
            f"--time={total // 1440}-{total % 1440 // 60:02d}:{total % 60:02d}:00", *rest]


def step_block(run: dict[str, Any], header: dict[str, Any], position: int) -> str:
    """The script lines of one run: its srun step on the first ``nodes`` nodes, launched as the per-run script of its
    backend launches it (registry: --mpi for Horovod, a port base for native)."""
    entry = registry.entry(run["backend"])
    size, per_node = int(run["size"]), int(run["ntasks_per_node"])
    srun = ["srun", f"--nodes={run['nodes']}", f"--ntasks={size}", f"--ntasks-per-node={per_node}"]
    if run.get("gpus_per_node"):
        srun.append(f"--gres=gpu:{run['gpus_per_node']}")
    dyn = ['--nodelist="$TB_NODELIST"', '${TB_SRUN_HINT[@]+"${TB_SRUN_HINT[@]}"}']
    if entry.srun_mpi:
        dyn.append('--mpi="$TWINBENCH_SRUN_MPI"')
    cmd = [shlex.join([*srun]), *dyn, shlex.join(["python", "-m", entry.module])]
    if entry.port_base:
        cmd.append('--port-base "$TB_STEP_PORT"')
    cmd += [shlex.join(["--job", header["job_file"]]), '--results "$TB_RESULTS"', "--quiet"]
    tail = [w for s in header["sets"] for w in ("--set", s)] + list(header["backend_args"][run["backend"]]) \
        + list(run.get("args", []))
    if tail:
        cmd.append(shlex.join(tail))
    return (f"# {position}: cell {run.get('cell', run['name'])}, round {run.get('round', 1)}, {run['layout']}\n"
            f"if tb_step_begin {shlex.quote(run['name'])} {int(run['nodes'])}; then\n"
            f"  rc=0; tb_run {' '.join(cmd)} >>\"$TB_LOG\" 2>&1 || rc=$?\n"
            f"  tb_step_end \"$rc\"\nfi\n")


def script(runs: list[dict[str, Any]], header: dict[str, Any], results: Path) -> str:
    rounds = sorted({int(r.get("round", 1)) for r in runs})
    what = (f"{len(runs)} run(s) of round(s) {rounds[0]}..{rounds[-1]} of sweep {results}" if rounds[0] != rounds[-1]
            else f"{len(runs)} run(s) of round {rounds[0]} of sweep {results}")
    steps = "\n".join(step_block(r, header, i + 1) for i, r in enumerate(runs))
    text = TEMPLATE.read_text()
    return text.replace("@WHAT@", what).replace("@SWEEP@", shlex.quote(str(results))).replace("@STEPS@", steps)


def sbatch_command(runs: list[dict[str, Any]], header: dict[str, Any], results: Path, path: Path) -> list[str]:
    return ["sbatch", "--parsable", f"--job-name=tb-{path.stem}", f"--chdir={header['repo']}",
            f"--output={results / 'logs' / path.stem}-%j.out", *request(runs), str(path)]


def job_path(runs: list[dict[str, Any]], results: Path) -> Path:
    """Where a job's script is written: ``DIR/jobs/alloc-r<first>-r<last>-<n>.sbatch`` (n: a new one each time)."""
    rounds = sorted({int(r.get("round", 1)) for r in runs})
    stem = f"alloc-r{rounds[0]}" + (f"-r{rounds[-1]}" if rounds[-1] != rounds[0] else "")
    n = 1
    while (results / "jobs" / f"{stem}-{n}.sbatch").exists():
        n += 1
    return results / "jobs" / f"{stem}-{n}.sbatch"


def step_state(run: dict[str, Any], root: Path) -> dict[str, str] | None:
    """What ``logs/<run>.step`` says of a run of its current job: {"state": running | exit, "exit": ..., "nodelist":
    ...}, or None (no such file, or one from an earlier job)."""
    try:
        text = (root / "logs" / f"{run['name']}.step").read_text()
    except OSError:
        return None
    fields = dict(w.split("=", 1) for w in text.split() if "=" in w)
    if fields.get("job") != str(run.get("job_id")):
        return None
    return fields


def add_options(s: Any) -> None:
    """``submit``'s one-allocation options."""
    s.add_argument("--one-allocation", action="store_true",
                   help="one Slurm job of the largest layout runs every run, one job step after the other, in the "
                        "interleaved order; each size on the same first nodes for every backend")
    s.add_argument("--rounds-per-job", type=int, default=None, metavar="K",
                   help="with --one-allocation: one job per K whole rounds (default: every round in one job)")


def check_options(a: Any) -> None:
    """SweepError (one line) on options that do not go together."""
    if a.rounds_per_job is not None and not a.one_allocation:
        raise SweepError("--rounds-per-job needs --one-allocation")
    if a.rounds_per_job is not None and a.rounds_per_job < 1:
        raise SweepError(f"--rounds-per-job must be >= 1, got {a.rounds_per_job}")
    for b, name in sl.chosen_launchers(a).items():
        launch = sl.slurm_launches()[b]
        if a.one_allocation and not launch.named(name, "slurm").job_step:
            raise SweepError(f"--one-allocation launches every run as a job step with srun: {launch.slurm_flag} "
                             f"{name} is not supported with it")
    if a.one_allocation and a.serial:
        raise SweepError("--one-allocation already runs one run at a time: drop --serial")
