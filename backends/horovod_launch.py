"""How twinbench starts Horovod's ranks itself: by the controller the installed Horovod was built with.

A Horovod build has Gloo, MPI or both (conda-forge's is MPI only: ``HOROVOD_WITHOUT_GLOO=1``). ``horovodrun
--gloo`` needs Gloo; Horovod's MPI controller needs its ranks started by an MPI launcher.
``TWINBENCH_HOROVOD_CONTROLLER`` chooses:

- ``auto`` (the default, also when unset or empty): Gloo when the build has it (``horovodrun --gloo``), else MPI
  (``mpirun``);
- ``gloo``: ``horovodrun --gloo`` (``-np N -H HOSTS``);
- ``mpi``: ``mpirun`` with the flags horovodrun itself passes to that MPI (horovod/runner/mpi_run.py): Open MPI
  ``-H HOSTS --bind-to none --map-by slot -mca pml ob1 -mca btl ^openib``; MPICH and Intel MPI (Hydra) ``-hosts
  NAMES -ppn N -bind-to none -map-by slot``.

One rank needs no launcher (``hvd.init()`` alone is a world of one, under the build's own default controller).
What the build has is read without importing TensorFlow (``built``: Horovod's own ``horovod_gloo_built`` /
``horovod_mpi_built`` through ctypes, in a child process, about 0.4 CPU-s against ~3 for ``import
horovod.tensorflow``); the commands that start many runs (the demo, ``common.check``, ``make gpu-check``) resolve
the choice once (``resolve_env``: a choice that cannot run is one line and exit 2 before any rank) and hand it to
every launch line through the variable, which a launch line then takes as given. No TensorFlow here.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence

from common.core.contract import Launcher
from common.core.errors import UsageError

ENV = "TWINBENCH_HOROVOD_CONTROLLER"
CHOICES = ("auto", "gloo", "mpi")
LAUNCHER = {"gloo": "horovodrun --gloo", "mpi": "mpirun"}  # what starts 2+ ranks under each controller
TITLE = {"gloo": "Gloo", "mpi": "MPI"}
PROBE_TIMEOUT = 60.0  # seconds: loading TensorFlow's two shared libraries takes under a second
# Environment a remote rank needs from the launching shell: Open MPI forwards only what -x names (MPICH's Hydra
# forwards everything), as horovodrun forwards its whole environment.
FORWARD_NAMES = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV")
FORWARD_PREFIXES = ("TF_", "HOROVOD_", "TWINBENCH_", "NCCL_", "OMPI_ALLOW_RUN_AS_ROOT")

# How Horovod's ranks start, in order of precedence for the rank variables (horovodrun and mpirun may run inside a
# Slurm allocation, whose SLURM_PROCID is the batch step's: theirs count first). Under Slurm, jobs/slurm/horovod.sbatch
# starts them by HVD_LAUNCH (the first, srun, by default; tests/test_registry.py checks its choices are these).
# horovodrun exports HOROVOD_RANK / HOROVOD_LOCAL_RANK / HOROVOD_LOCAL_SIZE to Gloo ranks
# (horovod/runner/gloo_run.py); Open MPI OMPI_COMM_WORLD_*, Open MPI 5 PMIX_RANK, MPICH's Hydra PMI_RANK and
# MPI_LOCALRANKID / MPI_LOCALNRANKS; srun SLURM_PROCID / SLURM_LOCALID and, by its --mpi plugin, PMIX_RANK or PMI_RANK.
LAUNCHERS = (
    Launcher("srun", ("slurm",), "srun --mpi=$TWINBENCH_SRUN_MPI: one job-step task per rank (MPI controller)",
             rank=("PMIX_RANK", "PMI_RANK", "SLURM_PROCID"), local_rank=("SLURM_LOCALID",),
             local_size=("SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"), job_step=True),
    Launcher("horovodrun", ("local", "hosts", "slurm"),
             "horovodrun -np N -H HOSTS (--gloo here; in an allocation the controller horovodrun picks)",
             rank=("HOROVOD_RANK",), local_rank=("HOROVOD_LOCAL_RANK",), local_size=("HOROVOD_LOCAL_SIZE",)),
    Launcher("mpirun", ("local", "hosts"), "mpirun with horovodrun's own flags (MPI controller)",
             rank=("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"),
             local_rank=("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"),
             local_size=("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")),
)

# Run by the Python that will run the ranks: Horovod's TensorFlow extension, loaded with the two TensorFlow libraries
# it links (found by their packages' locations, nothing imported), asked what it was compiled with.
PROBE = r"""
import ctypes, importlib.util, json, os, sysconfig
def where(name):
    spec = importlib.util.find_spec(name)
    return spec.submodule_search_locations[0] if spec and spec.submodule_search_locations else None
hvd, tf = where("horovod"), where("tensorflow")
try:
    if hvd is None:
        raise ImportError("horovod is not installed")
    for lib in ("libtensorflow_framework.so.2", "libtensorflow_cc.so.2"):
        if tf and os.path.exists(os.path.join(tf, lib)):
            ctypes.CDLL(os.path.join(tf, lib), mode=ctypes.RTLD_GLOBAL)
    ext = ctypes.CDLL(os.path.join(hvd, "tensorflow", "mpi_lib" + sysconfig.get_config_var("EXT_SUFFIX")))
    out = {}
    for name in ("gloo", "mpi"):
        fn = getattr(ext, "horovod_%s_built" % name)
        fn.restype = ctypes.c_bool
        out[name] = bool(fn())
except Exception as e:
    out = {"error": ("%s: %s" % (type(e).__name__, e)).splitlines()[0]}
print(json.dumps(out))
"""


class LaunchError(UsageError):
    """No launch can start the ranks of this Horovod as asked: one line, exit 2, before any rank starts."""


def requested(environ: Mapping[str, str] | None = None) -> str:
    """The controller asked for (``auto`` when unset); LaunchError on a value that is none of CHOICES."""
    raw = (os.environ if environ is None else environ).get(ENV, "")
    value = raw.strip().lower() or "auto"
    if value not in CHOICES:
        raise LaunchError(f"{ENV}={raw!r}: must be one of {', '.join(CHOICES)}")
    return value


def has(built_: Mapping[str, bool]) -> str:
    """The build's controllers for a message: "MPI, Gloo", "MPI only", "none"."""
    names = [TITLE[c] for c in ("mpi", "gloo") if built_.get(c)]
    return "none" if not names else names[0] + " only" if len(names) == 1 else ", ".join(names)


def resolve(request: str, built_: Mapping[str, bool]) -> str:
    """``gloo`` or ``mpi``: what launches this build's ranks when ``request`` is asked; LaunchError when none can."""
    if not (built_.get("gloo") or built_.get("mpi")):
        raise LaunchError("Horovod was built without Gloo and without MPI: no controller can run its ranks "
                          "(rebuild it: make setup)")
    if request == "auto":
        return "gloo" if built_.get("gloo") else "mpi"
    if not built_.get(request):
        return _refuse(request, built_)
    return request


def _refuse(request: str, built_: Mapping[str, bool]) -> str:
    other = "mpi" if request == "gloo" else "gloo"
    raise LaunchError(f"{ENV}={request}: this Horovod was built without {TITLE[request]} ({has(built_)}): "
                      f"use {ENV}={other} or auto")


def probe_command(python: str, wrap: Callable[[list[str]], list[str]] | None = None) -> list[str]:
    cmd = [python, "-c", PROBE]
    return wrap(cmd) if wrap else cmd


@functools.cache
def built(probe: tuple[str, ...]) -> dict[str, bool]:
    """What the Horovod of the probe's Python was built with ({"gloo": bool, "mpi": bool}), once per process and
    Python; LaunchError (one line) when that cannot be read (no Horovod, an extension that does not load)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    try:
        proc = subprocess.run(list(probe), capture_output=True, text=True, timeout=PROBE_TIMEOUT, env=env)
        out = json.loads((proc.stdout.strip().splitlines() or ["{}"])[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError) as e:
        out = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
    if "error" in out or set(out) != {"gloo", "mpi"}:
        raise LaunchError(f"cannot tell which controllers Horovod was built with ({out.get('error', out)}): "
                          "run `python -m common.doctor`")
    return {"gloo": bool(out["gloo"]), "mpi": bool(out["mpi"])}


def controller(python: str, wrap: Callable[[list[str]], list[str]] | None = None,
               environ: Mapping[str, str] | None = None) -> str:
    """The controller one launch line uses: ``gloo`` or ``mpi`` as asked (taken as given: ``resolve_env`` checked
    it), else (``auto``) by what the build has, read once per process. A build that cannot be read here (no such
    Python, no Horovod, a container's Python: the commands that start many runs read it once, inside the image, with
    ``resolve_env``) gets the Gloo line, whose launcher then says what is wrong."""
    request = requested(environ)
    if request != "auto":
        return request
    if wrap is not None:
        return "gloo"  # not a container start per line
    try:
        return resolve(request, built(tuple(probe_command(python, wrap))))
    except LaunchError:
        return "gloo"


def resolve_env(python: str, wrap: Callable[[list[str]], list[str]] | None = None,
                environ: Mapping[str, str] | None = None) -> tuple[dict[str, str], str]:
    """Resolve once for a command that starts many runs: the variable to export to them (the controller, checked
    against the build even when forced) and the line that says it; LaunchError when nothing can run."""
    request = requested(environ)
    built_ = built(tuple(probe_command(python, wrap)))
    chosen = resolve(request, built_)
    why = f"{ENV}={request}" if request != "auto" else f"auto: this Horovod has {has(built_)}"
    return {ENV: chosen}, f"horovod ranks: {LAUNCHER[chosen]} ({TITLE[chosen]} controller; {why})"


# -- the MPI launch line -----------------------------------------------------------------------------------------

@functools.cache
def mpi_flavour(mpirun: str = "mpirun") -> str:
    """``openmpi`` or ``hydra`` (MPICH, Intel MPI), from ``mpirun --version`` as horovodrun tells them apart;
    LaunchError when there is no mpirun or it is another MPI."""
    try:
        proc = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=20)
        text = proc.stdout + proc.stderr
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LaunchError(f"Horovod's MPI controller needs mpirun, which does not run here ({e}): install an MPI "
                          f"(make setup installs Open MPI) or use {ENV}=gloo with a Gloo build") from None
    if "Open MPI" in text or "OpenRTE" in text or "IBM Spectrum MPI" in text:
        return "openmpi"
    if "MPICH" in text or "Intel(R) MPI" in text or "HYDRA" in text:
        return "hydra"
    first = (text.strip().splitlines() or ["no output"])[0]
    raise LaunchError(f"mpirun is neither Open MPI nor MPICH/Intel MPI ({first}): start Horovod's ranks with that "
                      f"MPI's own launcher, or use {ENV}=gloo with a Gloo build")


def _hosts(hosts: str) -> list[tuple[str, int]]:
    out = []
    for h in hosts.split(","):
        name, _, slots = h.partition(":")
        out.append((name, int(slots) if slots else 1))
    return out


def is_local(hosts: str) -> bool:
    return all(name in ("localhost", "127.0.0.1") for name, _ in _hosts(hosts))


def mpirun_command(hosts: str, n: int, command: Sequence[str], *, iface: str | None = None,
                   mpirun: str = "mpirun", flavour: str | None = None,
                   environ: Mapping[str, str] | None = None) -> list[str]:
    """``mpirun`` starting ``n`` ranks of ``command`` on ``hosts`` (``localhost:2``, ``node1:2,node2:2``), unbound
    as under horovodrun. Local ranks inherit this environment and yield the CPU when they wait
    (``mpi_yield_when_idle``: Open MPI busy-polls unless a node is oversubscribed, and local runs share their cores
    with the launching machine's other work, as Gloo's ranks do not spin); remote ones get ``FORWARD_*`` by ``-x``
    (Open MPI) and the data interface ``iface`` as horovodrun passes it."""
    flavour = flavour or mpi_flavour(mpirun)
    local = is_local(hosts)
    pairs = _hosts(hosts)
    unbound = ["-bind-to", "none", "-map-by", "slot"]
    if flavour == "hydra":
        if len({s for _, s in pairs}) != 1:
            raise LaunchError(f"hosts {hosts}: MPICH's and Intel MPI's -ppn needs the same number of ranks on every "
                              "host")
        nic = ["-genv", "NCCL_SOCKET_IFNAME", iface] if iface and not local else []
        return [mpirun, "-np", str(n), "-hosts", ",".join(name for name, _ in pairs), "-ppn", str(pairs[0][1]),
                *unbound, *nic, *command]
    line = [mpirun, "-np", str(n), "-H", hosts, *unbound, "-mca", "pml", "ob1", "-mca", "btl", "^openib"]
    if local:
        return [*line, "--oversubscribe", "-mca", "mpi_yield_when_idle", "1", *command]
    env = os.environ if environ is None else environ
    forward = sorted(k for k in env if k in FORWARD_NAMES or k.startswith(FORWARD_PREFIXES))
    nic = ["-mca", "btl_tcp_if_include", iface, "-mca", "oob_tcp_if_include", iface,
           "-x", f"NCCL_SOCKET_IFNAME={iface}"] if iface else []
    return [*line, *nic, *[a for k in forward for a in ("-x", k)], *command]


def which_mpirun(python: str) -> str:
    """The mpirun beside ``python`` (a venv or a module's bin) if there is one, else the one on PATH."""
    beside = os.path.join(os.path.dirname(python), "mpirun")
    return beside if os.access(beside, os.X_OK) else (shutil.which("mpirun") or "mpirun")


def stack_lines(built_: Mapping[str, bool], asked: str | None, mpirun: str | None) -> tuple[list[str], bool]:
    """The doctor's lines on how twinbench would start this build's ranks (asked: the variable's raw value, None
    when unset; mpirun: the first line of ``mpirun --version`` or None), and whether they can start."""
    try:
        request = requested({ENV: asked or ""})
        chosen = resolve(request, built_)
    except LaunchError as e:
        return [f"horovod launch: cannot run: {e}"], False
    why = f"{ENV}={request}" if request != "auto" else f"{ENV} auto, the build has {has(built_)}"
    if chosen == "mpi" and not mpirun:
        return [f"horovod launch: cannot run: the MPI controller ({why}) needs mpirun: none on PATH"], False
    lines = [f"horovod launch, local and multi-host: {LAUNCHER[chosen]} ({TITLE[chosen]} controller; {why})",
             "horovod launch, Slurm job steps: srun --mpi=pmix " + (
                 "(MPI controller)" if built_.get("mpi") else
                 "cannot run (Gloo only: srun gives Gloo no rendezvous; use the sweep's --hvd-launch horovodrun)")]
    return lines, True
