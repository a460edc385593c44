"""How this environment's Horovod was built: the marker ``scripts/setup.sh`` writes, and the pinned versions.

``scripts/setup.sh`` builds Horovod from its sdist (patched for TensorFlow 2.19+, see ``scripts/patches/``) and then
writes ``<sys.prefix>/twinbench-build.json`` (``python -m common.core.buildinfo write ...``): the TensorFlow, tf-keras
and Horovod versions, the patch files applied with their sha256, the build flags, and the RECORD hash of Horovod's
TensorFlow library, so that a Horovod reinstalled by other means is not mistaken for twinbench's build.
``common.doctor`` and ``common.core.results.versions()`` read it; nothing here imports TensorFlow or Horovod.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import functools
import hashlib
import importlib.metadata as md
import json
import operator
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]  # common/core/buildinfo.py -> the repository
MARKER_NAME = "twinbench-build.json"
HOROVOD_VERSION = "0.28.1"  # scripts/setup.sh builds this one (tests/test_environment.py checks they agree)
REQUIREMENTS = "requirements.txt"  # the default set-up; requirements-tf*.txt are the fallbacks
# environment variables that change what the Horovod build produces (recorded in the marker)
BUILD_FLAG_PREFIXES = ("HOROVOD_WITH", "HOROVOD_GPU", "HOROVOD_CPU_OPERATIONS", "HOROVOD_NCCL", "HOROVOD_CUDA",
                       "HOROVOD_ROCM", "HOROVOD_BUILD", "HOROVOD_DEBUG", "CMAKE_POLICY_VERSION_MINIMUM", "CXXFLAGS")
NO_MARKER = "unknown (no twinbench build marker)"
UNPATCHED = "none (unpatched sdist)"


def marker_path(prefix: str | os.PathLike[str] | None = None) -> Path:
    return Path(prefix if prefix is not None else sys.prefix) / MARKER_NAME


def sha256_file(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _horovod_lib_record() -> dict[str, str] | None:
    """Path and RECORD hash of the installed Horovod's TensorFlow op library (no hashing: pip wrote it)."""
    try:
        files = md.distribution("horovod").files or []
    except md.PackageNotFoundError:
        return None
    for f in files:
        name = str(f)
        if name.startswith("horovod/tensorflow/mpi_lib") and name.endswith(".so"):
            return {"path": name, "hash": f"{f.hash.mode}={f.hash.value}" if f.hash else ""}
    return None


def _installed(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _read_marker_file(path: Path) -> tuple[dict[str, Any] | None, str]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None, "no marker"
    except (OSError, ValueError) as e:
        return None, f"unreadable marker {path}: {e}"
    if not isinstance(data, dict):
        return None, f"unreadable marker {path}: not an object"
    lib = _horovod_lib_record()
    if lib is None or data.get("horovod_lib") != lib:
        return None, "the installed Horovod is not the one the marker describes"
    return data, ""


@functools.lru_cache(maxsize=1)
def read_marker() -> dict[str, Any] | None:
    """The marker of this environment (``sys.prefix``) when it describes the Horovod installed now, else None."""
    return _read_marker_file(marker_path())[0]


def horovod_patch() -> str:
    """For ``versions()``: the applied patches' short sha256 joined by '+', 'none' (unpatched) or 'unknown'."""
    m = read_marker()
    if m is None:
        return "unknown"
    return m.get("patch_id") or "none"


def horovod_patch_description() -> str:
    """For the doctor: which patch files were applied to the Horovod sdist, with their short sha256."""
    m = read_marker()
    if m is None:
        path = marker_path()
        return NO_MARKER if not path.exists() else f"unknown ({_read_marker_file(path)[1]})"
    patches = m.get("patches") or []
    if not patches:
        return UNPATCHED
    return ", ".join(f"{p.get('file')} (sha256 {str(p.get('sha256', ''))[:12]})" for p in patches)


# -- which stack runs: the container it runs in, and whether its Horovod is twinbench's build ----------------------
# Set by twinbench's container launch (common/cluster/container.py): "RUNTIME VERSION", the image, its identity
STACK_ENV = ("TWINBENCH_STACK_RUNTIME", "TWINBENCH_STACK_IMAGE", "TWINBENCH_STACK_IMAGE_ID")
# What the runtimes themselves set inside (when the container was started by hand): Apptainer and Singularity the
# image's path, Charliecloud's ch-run CH_RUNNING ("Weird Al Yankovic"); podman writes /run/.containerenv
RUNTIME_VARS = (("APPTAINER_CONTAINER", "apptainer"), ("SINGULARITY_CONTAINER", "singularity"),
                ("CH_RUNNING", "charliecloud"))
PODMAN_ENV_FILE = "/run/.containerenv"


def _podman_image(path: str) -> str | None:
    """``image="..."`` of podman's /run/.containerenv (empty unless the container is privileged: then unknown)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    m = re.search(r'^image(?:id)?="([^"]+)"', text, re.MULTILINE)
    return m.group(1) if m else "unknown"


def stack_versions(environ: Any = None, podman_file: str = PODMAN_ENV_FILE) -> dict[str, str]:
    """For ``versions()``: ``container`` (runtime and version, as the launcher asked it) and ``container_image``
    (the image's identity: a SIF's sha256, an image directory's manifest digest, a registry reference) when this
    process runs in a container; ``horovod_build`` ("twinbench": the set-up's marker describes the installed
    Horovod; "found": a Horovod the stack brought) when Horovod is imported (Keras 3's version is recorded when it
    trains the model: common/training/keras3.py; NCCL, MPI and CUDA as the process loaded them: the machine
    block's libraries). Without twinbench's launch, a runtime's own variables say which runtime, and its image's
    path."""
    environ = os.environ if environ is None else environ
    out: dict[str, str] = {}
    runtime, image, image_id = (environ.get(k) or "" for k in STACK_ENV)
    if not runtime:
        found = [(name, environ.get(var) or "") for var, name in RUNTIME_VARS if environ.get(var)]
        podman = _podman_image(podman_file) if not found else None
        if podman is not None:
            found = [("podman", podman)]
        if found:
            runtime = f"{found[0][0]} (version not recorded: started by hand)"
            image_id = found[0][1] if found[0][0] != "charliecloud" else "unknown (ch-run does not say)"
    if runtime:
        out["container"] = runtime
        out["container_image"] = " ".join(dict.fromkeys(x for x in (image_id, f"({image})" if image else "") if x)) \
            or "unknown"
    if "horovod" in sys.modules:
        out["horovod_build"] = "twinbench" if read_marker() is not None else "found"
    return out


_MARKER = re.compile(r"""^python_version\s*(<=|<|>=|>|==|!=)\s*["'](\d+)\.(\d+)["']$""")
_COMPARE = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq,
            "!=": operator.ne}


def marker_holds(marker: str, version: tuple[int, int] | None = None) -> bool:
    """Whether a requirement's environment marker holds for ``version`` (default: this interpreter). Only the
    ``python_version OP "X.Y"`` form the requirements files use is understood; any other marker is taken to hold."""
    m = _MARKER.match(marker.strip())
    if not m:
        return True
    here = version or (sys.version_info[0], sys.version_info[1])
    return _COMPARE[m.group(1)](here, (int(m.group(2)), int(m.group(3))))


def read_pins(path: str | os.PathLike[str], *, every_python: bool = False) -> dict[str, str]:
    """``name==version`` lines of a requirements file (comments, extras and markers stripped); a line whose
    ``python_version`` marker does not hold for this interpreter is left out unless ``every_python``."""
    pins = {}
    for line in Path(path).read_text().splitlines():
        line, _, marker = line.split("#")[0].partition(";")
        line = line.strip()
        if "==" in line and (every_python or marker_holds(marker)):
            name, ver = line.split("==", 1)
            pins[name.split("[")[0].strip()] = ver.strip()
    return pins


def requirements_files() -> list[Path]:
    """The default requirements file first, then the fallbacks (requirements-tf*.txt)."""
    return [REPO / REQUIREMENTS] + sorted(REPO.glob("requirements-tf*.txt"))


def pins_for(tf_version: str | None = None) -> dict[str, str]:
    """Pins of the requirements file whose TensorFlow matches ``tf_version``'s major.minor, else the default's."""
    files = [p for p in requirements_files() if p.exists()]
    if tf_version:
        minor = ".".join(tf_version.split(".")[:2])
        for p in files:
            pins = read_pins(p)
            if ".".join(pins.get("tensorflow", "").split(".")[:2]) == minor:
                return pins
    return read_pins(files[0]) if files else {}


def _write(args: argparse.Namespace) -> int:
    patches = [{"file": Path(p).name, "sha256": sha256_file(p)} for p in args.patch]
    lib = _horovod_lib_record()
    if lib is None:
        print("buildinfo: horovod is not installed in this environment", file=sys.stderr)
        return 1
    flags = {k: v for k, v in sorted(os.environ.items()) if k.startswith(BUILD_FLAG_PREFIXES)}
    data = {
        "build_id": args.build_id,
        "tensorflow": _installed("tensorflow") or args.tf_version,
        # where that TensorFlow came from: "requirements:<file>" (make setup's venv) or "site" (TWINBENCH_TF=site:
        # the one the site's Python already imported, at tensorflow_location)
        "tensorflow_source": args.tf_source,
        "tensorflow_location": args.tf_location or None,
        "tf_keras": _installed("tf-keras"),
        "horovod": _installed("horovod"),
        "python": sys.version.split()[0],
        "patches": patches,
        "patch_id": "+".join(p["sha256"][:12] for p in patches) or None,
        "build_flags": flags,
        "sdist_sha256": args.sdist_sha256,
        "wheel": Path(args.wheel).name if args.wheel else None,
        "wheel_sha256": sha256_file(args.wheel) if args.wheel else None,
        "horovod_lib": lib,
        "written_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    path = marker_path()
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    print(path)
    return 0


def _check(args: argparse.Namespace) -> int:
    data, why = _read_marker_file(marker_path())
    if data is None:
        print(why)
        return 1
    if data.get("build_id") != args.build_id:
        print(f"built as {data.get('build_id')}, wanted {args.build_id}")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m common.core.buildinfo", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="write the marker for the Horovod just installed (scripts/setup.sh)")
    w.add_argument("--build-id", required=True)
    w.add_argument("--patch", action="append", default=[], help="a patch file applied (repeatable, in order)")
    w.add_argument("--wheel", help="the wheel installed")
    w.add_argument("--sdist-sha256")
    w.add_argument("--tf-source", default="requirements:" + REQUIREMENTS,
                   help="where the TensorFlow came from: requirements:FILE or site")
    w.add_argument("--tf-version", help="the TensorFlow version imported (when no distribution metadata names it)")
    w.add_argument("--tf-location", default="", help="the TensorFlow package's directory (site)")
    c = sub.add_parser("check", help="exit 0 when the marker matches BUILD_ID and the installed Horovod")
    c.add_argument("build_id")
    sub.add_parser("show", help="print the marker and what the doctor would report")
    args = p.parse_args(argv)
    if args.cmd == "write":
        return _write(args)
    if args.cmd == "check":
        return _check(args)
    print(json.dumps({"marker": str(marker_path()), "horovod_patch": horovod_patch(),
                      "description": horovod_patch_description(), "data": read_marker()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())


REPO = Path(__file__).resolve().parents[2]  # the checkout twinbench runs from


@functools.lru_cache(maxsize=1)
def source_version() -> str:
    """twinbench's own version: the checkout's commit (12 hex digits), "+modified" when tracked files differ from it
    (a run of uncommitted code is not the commit's), "unknown" without git or outside a checkout (a copied tree)."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0 or not head.stdout.strip():
            return "unknown"
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + ("+modified" if dirty.returncode == 0 and dirty.stdout.strip() else "")


def loaded_modules(environ: Any = None) -> str | None:
    """The environment modules loaded when the run started, as ``module list`` names them (Lmod and Environment
    Modules both keep them in LOADEDMODULES, colon-separated), joined by spaces; None where no module system ran."""
    environ = os.environ if environ is None else environ
    names = [m for m in (environ.get("LOADEDMODULES") or "").split(":") if m]
    return " ".join(names) if names else None
