"""``python -m common.doctor``: can each backend run here, and with what? Exit 1 when a backend cannot run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Any

from common.core import buildinfo, registry

ENV_PREFIXES = ("SLURM_", "OMPI_COMM_WORLD_", "PMIX_", "PMI_", "HOROVOD_", "NCCL_", "TF_CONFIG", "CUDA_VISIBLE")


def _tensorflow(out: dict[str, Any]) -> str | None:
    """TensorFlow's version (None when it does not import), with Keras and GPUs, into ``out``."""
    pins = buildinfo.pins_for(None)  # the default set-up's pins (requirements.txt) until TF says which apply
    try:
        import tensorflow as tf
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


def main() -> int:
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
