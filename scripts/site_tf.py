"""The set-up's decisions for a TensorFlow the site already has (``TWINBENCH_TF=site bash scripts/setup.sh``).

scripts/setup.sh runs this with the Python whose TensorFlow it is to use (a module-loaded one, a conda or other
existing environment):

    python scripts/site_tf.py detect [--gpu]    # shell assignments for setup.sh, or one line and exit 2
    python scripts/site_tf.py requirements FILE # FILE without the TensorFlow pins: what setup.sh installs beside it

``detect`` imports TensorFlow, checks that it is 2.16-2.21 (what twinbench supports: tf-keras, the legacy Keras 2
that both backends use, exists for each of them, and Horovod 0.28.1 builds against them, patched from 2.19 on), that
its tf-keras is of the same minor version (tf-keras X.Y belongs to TensorFlow X.Y) or absent (then setup.sh installs
``tf-keras~=X.Y.0`` from PyPI), and says which of scripts/patches the Horovod build applies:
``horovod-0.28.1-tf2.19plus.patch`` for 2.19+ only (the unpatched sdist builds against 2.18 and older), and for a GPU
build on 2.19+ ``horovod-0.28.1-tf2.21-gpu.patch`` after it (XLA's builder header moved in 2.19; compiled here
against 2.21 only); setup.sh then appends ``horovod-0.28.1-gcc13plus.patch``, which every build carries (GCC 13+), so
it is not decided here. The decision itself (``decide``) is plain Python, unit-tested with fake versions
(tests/test_site_tf.py); this file imports nothing outside the standard library and runs on Python 3.10.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

SUPPORTED = ((2, 16), (2, 21))  # TensorFlow minor versions, inclusive
PATCH_DIR = "scripts/patches"
CPU_PATCH = f"{PATCH_DIR}/horovod-0.28.1-tf2.19plus.patch"
GPU_PATCH = f"{PATCH_DIR}/horovod-0.28.1-tf2.21-gpu.patch"
FIRST_PATCHED = (2, 19)  # Horovod 0.28.1's sdist fails to compile from this TensorFlow on
TF_PINS = ("tensorflow", "tf-keras", "tensorboard")  # requirement lines that follow the TensorFlow version


class SiteError(Exception):
    """A TensorFlow or tf-keras twinbench cannot use: the message is the one line setup.sh prints."""


@dataclass(frozen=True)
class Decision:
    tf_version: str
    tf_keras: str | None  # the installed tf-keras, None when absent
    install_tf_keras: str | None  # a pip requirement to install, None when the installed one matches
    patches: list[str] = field(default_factory=list)


def minor(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as 2.21.0, 2.18.0rc1 or 2.17.1+nv24.08; SiteError if unreadable."""
    m = re.match(r"^\s*(\d+)\.(\d+)", version or "")
    if not m:
        raise SiteError(f"cannot read the version '{version}'")
    return int(m.group(1)), int(m.group(2))


def decide(tf_version: str, tf_keras: str | None, gpu: bool) -> Decision:
    """What the set-up does for TensorFlow ``tf_version`` with tf-keras ``tf_keras`` (None: not installed)."""
    tf = minor(tf_version)
    lo, hi = SUPPORTED
    if not lo <= tf <= hi:
        raise SiteError(f"TensorFlow {tf_version} is not supported: TWINBENCH_TF=site needs 2.{lo[1]}-2.{hi[1]} "
                        "(or use the pinned TWINBENCH_TF=2.21 / 2.18)")
    spec = f"tf-keras~={tf[0]}.{tf[1]}.0"
    install = None
    if tf_keras is None:
        install = spec
    elif minor(tf_keras) != tf:
        raise SiteError(f"tf-keras {tf_keras} does not match TensorFlow {tf_version}: install {spec} "
                        "(tf-keras X.Y belongs to TensorFlow X.Y)")
    patches = []
    if tf >= FIRST_PATCHED:
        patches.append(CPU_PATCH)
        if gpu:
            patches.append(GPU_PATCH)
    return Decision(tf_version=tf_version, tf_keras=tf_keras, install_tf_keras=install, patches=patches)


def site_requirements(text: str, tf_version: str, have_tensorboard: bool) -> str:
    """A requirements file's text without its TensorFlow-bound pins (tensorflow, tf-keras, tensorboard): the site's
    TensorFlow stays; tensorboard of its minor version is added when none is importable."""
    keep = []
    for line in text.splitlines():
        name = re.split(r"[\s=<>~!;\[]", line.strip(), maxsplit=1)[0].lower()
        if name in TF_PINS:
            continue
        keep.append(line)
    if not have_tensorboard:
        tf = minor(tf_version)
        keep.append(f"tensorboard~={tf[0]}.{tf[1]}.0")
    return "\n".join(keep) + "\n"


def shell_assignments(d: Decision, location: str, site_id: str) -> str:
    """The lines setup.sh evaluates (every value quoted)."""
    q = shlex.quote
    return "\n".join([
        f"TF_VERSION={q(d.tf_version)}",
        f"TF_KERAS_FOUND={q(d.tf_keras or '')}",
        f"TF_KERAS_INSTALL={q(d.install_tf_keras or '')}",
        f"TF_LOCATION={q(location)}",
        f"TF_SITE_ID={q(site_id)}",
        "PATCHES=(" + " ".join(q(p) for p in d.patches) + ")",
    ])


def _installed(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _detect(gpu: bool) -> str:
    """Import this Python's TensorFlow and decide; the assignments for setup.sh."""
    try:
        import tensorflow as tf  # the one the site provides: what `python -c "import tensorflow"` gets here
    except Exception as e:  # noqa: BLE001 - any import failure is the one line to print
        raise SiteError(f"{sys.executable} cannot import tensorflow ({type(e).__name__}: {e}): load the site's "
                        "TensorFlow module or activate its environment first") from None
    location = str(Path(tf.__file__).resolve().parent)
    flags = " ".join(tf.sysconfig.get_compile_flags() + tf.sysconfig.get_link_flags())
    # Horovod compiles against this TensorFlow's headers and links its library: a site build of the same version
    # is not the PyPI wheel, so the cached Horovod wheel is keyed by where it lives and how it was built too.
    site_id = hashlib.sha256(f"{location}\n{flags}".encode()).hexdigest()[:10]
    return shell_assignments(decide(tf.__version__, _installed("tf-keras"), gpu), location, site_id)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/site_tf.py", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    det = sub.add_parser("detect", help="check this Python's TensorFlow; print the shell assignments for setup.sh")
    det.add_argument("--gpu", action="store_true", help="a GPU build of Horovod (HOROVOD_GPU_* set)")
    det.add_argument("--tf-version", help="decide for this TensorFlow version instead of importing it (a dry run)")
    det.add_argument("--tf-keras", help="with --tf-version: the installed tf-keras ('' for none)")
    req = sub.add_parser("requirements", help="FILE without TensorFlow, tf-keras and tensorboard pins")
    req.add_argument("file", type=Path)
    req.add_argument("--tf-version", required=True)
    args = p.parse_args(argv)
    try:
        if args.cmd == "detect" and args.tf_version:
            print(shell_assignments(decide(args.tf_version, args.tf_keras or None, args.gpu), "", ""))
        elif args.cmd == "detect":
            print(_detect(args.gpu))
        else:
            if not args.file.is_file():
                raise SiteError(f"{args.file}: no such requirements file")
            have_tb = _installed("tensorboard") is not None
            sys.stdout.write(site_requirements(args.file.read_text(), args.tf_version, have_tb))
    except SiteError as e:
        print(f"[setup] {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
