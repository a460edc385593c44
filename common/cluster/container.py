"""Running the ranks inside a site's container image, and where launchers may write in one.

No TensorFlow here: the launchers build their command lines from this module before anything starts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HOROVODRUN_CACHE = ".horovod"  # horovodrun's cache of its start-up checks: ~/.horovod (horovod/runner/launch.py)


def writable_dir(path: str | os.PathLike[str]) -> bool:
    """Whether a file can be created in ``path``, or ``path`` can be created (its nearest existing parent is
    writable): an image's home is often read-only, and a bound home may be another user's."""
    p = Path(path)
    while not p.exists():
        if p.parent == p:
            return False
        p = p.parent
    if not p.is_dir():
        return False
    try:  # by trying: os.access says yes to root on a read-only mount's directory, or on /proc
        fd, name = tempfile.mkstemp(prefix=".twinbench-w", dir=p)
    except OSError:
        return False
    os.close(fd)
    os.unlink(name)
    return True


def horovodrun_cache_flags(home: str | None = None) -> list[str]:
    """``--disable-cache`` when horovodrun could not write its cache (``$HOME/.horovod``, fixed at its import from
    ``$HOME``): it would stop with ``OSError: Read-only file system``. The cache only spares the ssh and network
    checks of a later launch within 60 minutes, never part of a measured run."""
    home = home if home is not None else os.path.expanduser("~")
    return [] if writable_dir(Path(home) / HOROVODRUN_CACHE) else ["--disable-cache"]


# -- the site's container: one setting, the same for every rank of both backends ----------------------------------
SETTING = "TWINBENCH_CONTAINER"  # RUNTIME:IMAGE, e.g. apptainer:/sw/images/tf-24.03.sif
BINDS_SETTING = "TWINBENCH_CONTAINER_BINDS"  # SRC[:DST],... besides the checkout (results, data)
PYTHON_SETTING = "TWINBENCH_CONTAINER_PYTHON"  # the image's Python
DEFAULT_PYTHON = "python3"  # NGC's TensorFlow images and Debian-based ones have it on PATH
# The runtimes, by the name the setting uses, and the executable each needs on the launching host
RUNTIMES = {"apptainer": "apptainer", "singularity": "singularity", "pyxis": "srun", "podman-hpc": "podman-hpc",
            "charliecloud": "ch-run"}
# What the launcher tells the ranks of the stack it started them in (common.core.buildinfo.stack_versions reads it)
STACK_ENV = ("TWINBENCH_STACK_RUNTIME", "TWINBENCH_STACK_IMAGE", "TWINBENCH_STACK_IMAGE_ID")
REPO = Path(__file__).resolve().parents[2]  # the checkout, bound into the image at its own path


class ContainerError(ValueError):
    """A container setting that cannot work: the message is the one line the user sees (exit 2)."""


@dataclass(frozen=True)
class Container:
    runtime: str  # a key of RUNTIMES
    image: str  # a path (SIF, squashfs, image directory) or a registry reference, as the runtime takes it
    binds: tuple[tuple[str, str], ...]  # (host path, path inside), the checkout first
    python: str  # the image's Python, as the ranks are started with it

    def prefix(self, env: dict[str, str]) -> list[str]:
        """The words that run a command inside the image with ``env`` set there, by the runtime's documented
        command line; pyxis has none (it is options of srun: ``srun_options``)."""
        binds = [f"{s}:{d}" for s, d in self.binds]
        setenv = ["env", *(f"{k}={v}" for k, v in env.items())] if env else []
        if self.runtime in ("apptainer", "singularity"):
            # `apptainer exec --nv`: the host's NVIDIA driver libraries inside (a warning only on a node without)
            return [self.runtime, "exec", "--nv", "--bind", ",".join(binds), "--pwd", str(REPO), self.image, *setenv]
        if self.runtime == "podman-hpc":
            # --env-host: the launcher's variables (SLURM_*, TF_CONFIG, PMIx) as the runtimes that share them do
            return ["podman-hpc", "run", "--rm", "--gpu", "--env-host", "--net", "host", "--ipc", "host",
                    *(w for b in binds for w in ("-v", b)), "-w", str(REPO), self.image, *setenv]
        if self.runtime == "charliecloud":
            return ["ch-run", *(w for b in binds for w in ("-b", b)), "-c", str(REPO), self.image, "--", *setenv]
        raise ContainerError(f"{SETTING}={self.runtime}:...: pyxis starts containers only through srun "
                             "(srun --container-image); launch with srun, or use another runtime here")

    def srun_options(self) -> list[str]:
        """Pyxis' options of srun (each task in the image); empty for the other runtimes (their prefix follows)."""
        if self.runtime != "pyxis":
            return []
        return [f"--container-image={self.image}",
                f"--container-mounts={','.join(f'{s}:{d}' for s, d in self.binds)}",
                f"--container-workdir={REPO}"]


def _looks_like_path(image: str) -> bool:
    return image.startswith(("/", "./", "../", "~")) or image.endswith((".sif", ".sqsh", ".squashfs", ".simg"))


def parse(environ: dict[str, str] | os._Environ[str] | None = None) -> Container | None:
    """The site's container from the environment (None: the ranks run on the host); ContainerError naming the
    setting when the runtime is unknown or not installed, the image or a bind source is missing."""
    environ = os.environ if environ is None else environ
    text = (environ.get(SETTING) or "").strip()
    if not text:
        return None
    runtime, sep, image = text.partition(":")
    runtime = runtime.strip().lower()
    if not sep or not image.strip():
        raise ContainerError(f"{SETTING}={text!r} must be RUNTIME:IMAGE, RUNTIME one of {', '.join(RUNTIMES)}")
    if runtime not in RUNTIMES:
        raise ContainerError(f"{SETTING}={text!r}: unknown runtime {runtime!r} (one of {', '.join(RUNTIMES)})")
    if shutil.which(RUNTIMES[runtime]) is None:
        raise ContainerError(f"{SETTING}={text!r}: {RUNTIMES[runtime]} is not on PATH (load the site's module?)")
    image = os.path.expanduser(image.strip())
    is_ref = "://" in image or (runtime in ("pyxis", "podman-hpc") and not _looks_like_path(image))
    if not is_ref and not os.path.exists(image):
        raise ContainerError(f"{SETTING}={text!r}: no such image {image!r}")
    if not is_ref:
        image = os.path.abspath(image)
    binds = [(str(REPO), str(REPO))]
    for item in filter(None, (b.strip() for b in (environ.get(BINDS_SETTING) or "").split(","))):
        src, _, dst = item.partition(":")
        src = os.path.abspath(os.path.expanduser(src))
        if not os.path.exists(src):
            raise ContainerError(f"{BINDS_SETTING}: bind source {src!r} does not exist")
        binds.append((src, dst or src))
    python = (environ.get(PYTHON_SETTING) or DEFAULT_PYTHON).strip()
    return Container(runtime, image, tuple(binds), python)


# -- what ran: the runtime's version and the image's identity, as the launcher sees them ---------------------------
DEPS_DIR = ".stack-deps"  # in the checkout: what `TWINBENCH_STACK=as-is scripts/setup.sh` installs beside a stack
MANIFEST_PREFIX = "manifest-sha256:"  # an image directory's identity: its files' paths, modes, sizes, link targets


def runtime_version(c: Container) -> str:
    """``RUNTIME VERSION`` as the runtime prints it (``ch-run --version`` writes "0.31" to stderr; pyxis has no
    version of its own: srun's)."""
    exe = RUNTIMES[c.runtime]
    try:
        p = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
        words = ((p.stdout or p.stderr).strip().splitlines() or ["?"])[0].split()
    except (OSError, subprocess.TimeoutExpired):
        words = ["?"]
    version = words[-1] if words else "?"
    return f"{c.runtime} {version}" + (" (slurm's srun)" if c.runtime == "pyxis" else "")


def manifest_digest(root: str | os.PathLike[str]) -> str:
    """The identity of an image directory (Charliecloud's, an Apptainer sandbox): sha256 over every file's and
    link's path, mode, size and link target, in sorted order. No file content (a TensorFlow image holds ~1 GB: this
    takes about a second), so it tells images apart, not a tampered file of the same size; no directory, so the
    empty mount points a site adds for its binds leave the identity as it was."""
    h = hashlib.sha256()
    base = Path(root)
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames.sort()
        links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]  # os.walk lists them as dirs
        for name in sorted(filenames + links):
            p = Path(dirpath) / name
            st = p.lstat()
            link = os.readlink(p) if stat.S_ISLNK(st.st_mode) else ""
            size = st.st_size if stat.S_ISREG(st.st_mode) else 0
            h.update(f"{p.relative_to(base)}\0{st.st_mode:o}\0{size}\0{link}\n".encode("utf-8", "surrogateescape"))
    return MANIFEST_PREFIX + h.hexdigest()


def file_digest(path: str | os.PathLike[str], cache: str | os.PathLike[str] | None = None) -> str:
    """``sha256:`` of an image file (a SIF, a squashfs), remembered per path, size and mtime in the cache dir's
    image-ids.json: a 5 GB SIF takes tens of seconds to hash, once."""
    st = os.stat(path)
    key = f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}"
    store = Path(cache or os.environ.get("TWINBENCH_CACHE") or "~/.cache/twinbench").expanduser() / "image-ids.json"
    try:
        known = json.loads(store.read_text())
    except (OSError, ValueError):
        known = {}
    if isinstance(known, dict) and isinstance(known.get(key), str):
        return known[key]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    digest = "sha256:" + h.hexdigest()
    with contextlib.suppress(OSError):  # a read-only cache only costs the next launch the hash again
        store.parent.mkdir(parents=True, exist_ok=True)
        store.write_text(json.dumps({**(known if isinstance(known, dict) else {}), key: digest}, indent=1))
    return digest


def image_id(c: Container) -> str:
    """The image's identity: a file's sha256, a directory's manifest digest, else the reference as given (a
    registry tag or digest: the runtime resolves it when it starts)."""
    if os.path.isdir(c.image):
        return manifest_digest(c.image)
    if os.path.isfile(c.image):
        return file_digest(c.image)
    return c.image


def stack_env(c: Container, environ: dict[str, str] | os._Environ[str] | None = None) -> dict[str, str]:
    """The variables every rank gets inside the image: which stack it is (STACK_ENV, for its record) and a
    PYTHONPATH that finds the checkout (and what the as-is set-up installed beside the stack)."""
    environ = os.environ if environ is None else environ
    path = [str(REPO), *([str(REPO / DEPS_DIR)] if (REPO / DEPS_DIR).is_dir() else []),
            *filter(None, (environ.get("PYTHONPATH") or "").split(os.pathsep))]
    values = [runtime_version(c), c.image, image_id(c)]
    return {**dict(zip(STACK_ENV, values)), "PYTHONPATH": os.pathsep.join(dict.fromkeys(path))}


def wrap(cmd: list[str], c: Container, env: dict[str, str] | None = None) -> list[str]:
    """``cmd`` (a launch line whose Python is ``c.python``) run inside the image. A horovodrun in it gets
    ``--disable-cache``: the image's home is not the host's and is often read-only."""
    if Path(cmd[0]).name == "horovodrun" and "--disable-cache" not in cmd:
        cmd = [cmd[0], "--disable-cache", *cmd[1:]]
    return [*c.prefix(stack_env(c) if env is None else env), *cmd]


def shell_assignments(c: Container | None) -> str:
    """For jobs/slurm/env.sh: TB_CT_SRUN (srun's options: pyxis), TB_CT_PREFIX (the words before the rank's
    command: the other runtimes) and TB_PY (the ranks' Python), as bash assignments."""
    if c is None:
        return "TB_CT_SRUN=()\nTB_CT_PREFIX=()\nTB_PY=python\nTB_CT_TEXT=''"
    env = stack_env(c)
    words = [] if c.runtime == "pyxis" else c.prefix(env)
    srun = c.srun_options()
    if c.runtime == "pyxis":  # srun --export passes the launcher's variables: set ours in the task's environment
        words = ["env", *(f"{k}={v}" for k, v in env.items())]
    text = f"{c.runtime} {c.image} ({env['TWINBENCH_STACK_IMAGE_ID']})"
    return "\n".join([f"TB_CT_SRUN=({' '.join(map(shlex.quote, srun))})",
                      f"TB_CT_PREFIX=({' '.join(map(shlex.quote, words))})",
                      f"TB_PY={shlex.quote(c.python)}", f"TB_CT_TEXT={shlex.quote(text)}"])


def main(argv: list[str]) -> int:
    """``python -m common.cluster.container shell``: TWINBENCH_CONTAINER as bash assignments for the sbatch
    scripts, or one line and exit 2 when it cannot work."""
    if argv != ["shell"]:
        print("usage: python -m common.cluster.container shell", file=sys.stderr)
        return 2
    try:
        print(shell_assignments(parse()))
    except ContainerError as e:
        print(f"[twinbench] error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
