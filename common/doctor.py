"""``python -m common.doctor``: can each backend run here, and with what? Exit 1 when a backend cannot run.

``python -m common.doctor --stack``: can this stack (a container's or a module's Python, twinbench run from its
checkout) run every registered backend as it is, nothing built: one line each for TensorFlow (2.16-2.21) and
tf-keras (TensorFlow's minor, present or installable beside it), then each backend's own lines (its
``BackendSpec.stack``: Horovod's import with TensorFlow support, its controllers and GPU operations, MPI, how
twinbench would launch its ranks), and the verdict; exit 0 when every backend can run, else 2."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from typing import Any

from common.core import buildinfo, registry, tfquiet
from common.core.contract import StackCheck

ENV_PREFIXES = ("SLURM_", "OMPI_COMM_WORLD_", "PMIX_", "PMI_", "HOROVOD_", "NCCL_", "TF_CONFIG", "CUDA_VISIBLE")


def _tensorflow(out: dict[str, Any]) -> str | None:
    """TensorFlow's version (None when it does not import), with Keras and GPUs, into ``out``."""
    pins = buildinfo.pins_for(None)  # the default set-up's pins (requirements.txt) until TF says which apply
    try:
        tf = tfquiet.import_tensorflow()  # without the GPU probe's lines on a machine with no GPU
    except Exception as e:  # noqa: BLE001 - report any import failure
        out["tensorflow"] = None
        out["tensorflow_error"] = str(e)
        out["missing"].append(f"tensorflow=={pins.get('tensorflow', '?')} (make setup)")
        return None
    out["tensorflow"] = tf.__version__
    pins = buildinfo.pins_for(tf.__version__)  # the fallback's pins (requirements-tf*.txt) for its TF
    out["keras"] = f"{tf.keras.__name__} {getattr(tf.keras, '__version__', '?')}"
    if not tf.keras.__name__.startswith("tf_keras"):
        out["missing"].append("tf_keras as tf.keras (set TF_USE_LEGACY_KERAS=1, pip install "
                              f"tf-keras=={pins.get('tf-keras', '?')})")
    out["gpus"] = [d.name for d in tf.config.list_physical_devices("GPU")]
    return tf.__version__


def check() -> dict[str, Any]:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    out: dict[str, Any] = {"python": sys.version.split()[0], "missing": [], "backends": {}}
    tf_version = _tensorflow(out)
    for name in registry.names():
        diag = registry.load(name).doctor(tf_version)
        out.update(diag.details)
        out[f"{name}_backend"] = diag.status
        out["backends"][name] = diag.ok
        out["missing"] += diag.missing
    # where the TensorFlow Horovod was built against came from (scripts/setup.sh's marker): the pinned requirements
    # or the site's own (TWINBENCH_TF=site); markers written before the field existed came from requirements
    marker = buildinfo.read_marker()
    out["tensorflow_source"] = (marker.get("tensorflow_source") or "requirements") if marker else "unknown (no marker)"
    out["horovodrun"] = shutil.which("horovodrun")
    out["mpirun"] = shutil.which("mpirun")
    if out["mpirun"]:
        try:
            v = subprocess.run(["mpirun", "--version"], capture_output=True, text=True, timeout=20).stdout
            out["mpi_version"] = v.splitlines()[0] if v else "?"
        except (OSError, subprocess.TimeoutExpired):
            out["mpi_version"] = "?"
    out["srun"] = shutil.which("srun")
    out["environment"] = {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}
    return out


# -- the stack as it is -------------------------------------------------------------------------------------------
SUPPORTED_TF = ((2, 16), (2, 21))  # TensorFlow minors twinbench runs on (tf-keras exists, Horovod 0.28.1 builds)


def _minor(version: str) -> tuple[int, int] | None:
    parts = version.split(".")
    return (int(parts[0]), int(parts[1])) if len(parts) > 1 and parts[0].isdigit() and parts[1].isdigit() else None


def stack_facts() -> dict[str, Any]:
    """What this Python's shared stack has (Python, TensorFlow, tf-keras), read the way the runs read it; each
    backend then reads its own (``BackendSpec.stack``)."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    facts: dict[str, Any] = {"python": sys.version.split()[0], "tf_keras": buildinfo._installed("tf-keras")}
    try:
        tf = tfquiet.import_tensorflow()

        facts["tensorflow"] = tf.__version__
    except Exception as e:  # noqa: BLE001 - any import failure is the fact
        facts["tensorflow_error"] = f"{type(e).__name__}: {e}".splitlines()[0]
    return facts


def judge_shared(f: dict[str, Any]) -> tuple[list[str], bool]:
    """One line per shared fact, and whether TensorFlow and tf-keras, which every backend needs, can run."""
    lo, hi = (".".join(map(str, v)) for v in SUPPORTED_TF)
    tf, lines = f.get("tensorflow"), [f"python: {f.get('python', '?')}"]
    tf_ok = tf is not None and (_minor(tf) or (0, 0)) >= SUPPORTED_TF[0] and (_minor(tf) or (99, 0)) <= SUPPORTED_TF[1]
    if tf is None:
        lines.append(f"tensorflow: cannot run: TensorFlow does not import ({f.get('tensorflow_error', '?')})")
    else:
        lines.append(f"tensorflow: {tf} " + ("(in 2.16-2.21): ok" if tf_ok else f"cannot run: outside {lo}-{hi}"))
    tfk, keras_ok = f.get("tf_keras"), tf_ok
    if tf_ok and tfk is None:
        lines.append(f"tf-keras: not installed; installable beside the stack: tf-keras~={tf.rsplit('.', 1)[0]}.0 "
                     "(TWINBENCH_STACK=as-is bash scripts/setup.sh)")
        keras_ok = False
    elif tf_ok and _minor(tfk) != _minor(tf):
        lines.append(f"tf-keras: {tfk}: cannot run: not TensorFlow {tf}'s minor (tf-keras X.Y belongs to TF X.Y)")
        keras_ok = False
    elif tf_ok:
        lines.append(f"tf-keras: {tfk} (TensorFlow's minor): ok")
    return lines, tf_ok and keras_ok


def judge_stack(f: dict[str, Any], stacks: Mapping[str, Callable[[bool], StackCheck]]) -> tuple[list[str],
                                                                                            dict[str, bool]]:
    """The shared lines, then each backend's (``stacks``: name -> its ``stack``, in the registry's order), then
    the verdict line; and whether each backend can run on this stack as it is."""
    lines, shared_ok = judge_shared(f)
    can = {}
    for name, check in stacks.items():
        verdict = check(shared_ok)
        lines += verdict.lines
        can[name] = verdict.ok
    lines.append("backends: " + ", ".join(f"{n} {'can run' if ok else 'cannot run'}" for n, ok in can.items()))
    return lines, can


def stack_main() -> int:
    """``--stack``: exit 0 when every registered backend can run on this stack as it is, else 2."""
    lines, can = judge_stack(stack_facts(), {n: registry.spec(n).stack for n in registry.names()})
    print("\n".join(f"stack {line}" for line in lines))
    return 0 if all(can.values()) else 2


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--stack"]:
        return stack_main()
    if argv:
        print("usage: python -m common.doctor [--stack]", file=sys.stderr)
        return 2
    info = check()
    width = 20
    for k, v in info.items():
        if k in ("environment", "missing", "backends"):
            continue
        print(f"{k:<{width}} {v}")
    print("environment:" if info["environment"] else "environment:        (no Slurm/MPI/Horovod/NCCL variables)")
    for k, v in info["environment"].items():
        print(f"  {k}={v}")
    for m in info["missing"]:
        print(f"MISSING: {m}")
    return 0 if all(info["backends"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
