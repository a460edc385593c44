"""``python -m common.doctor``: can each backend run here, and with what? Exit 1 when a backend cannot run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Any

ENV_PREFIXES = ("SLURM_", "OMPI_COMM_WORLD_", "PMIX_", "PMI_", "HOROVOD_", "NCCL_", "TF_CONFIG", "CUDA_VISIBLE")


def check() -> dict[str, Any]:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    out: dict[str, Any] = {"python": sys.version.split()[0], "missing": []}
    try:
        import tensorflow as tf

        out["tensorflow"] = tf.__version__
        out["keras"] = f"{tf.keras.__name__} {getattr(tf.keras, '__version__', '?')}"
        if not tf.keras.__name__.startswith("tf_keras"):
            out["missing"].append("tf_keras as tf.keras (set TF_USE_LEGACY_KERAS=1, pip install tf-keras==2.18.0)")
        out["gpus"] = [d.name for d in tf.config.list_physical_devices("GPU")]
        out["native"] = "ok"
    except Exception as e:  # noqa: BLE001 - report any import failure
        out["tensorflow"] = None
        out["native"] = f"cannot run: {e}"
        out["missing"].append("tensorflow==2.18.1")
    try:
        import horovod
        import horovod.tensorflow as hvd

        out["horovod"] = horovod.__version__
        out["horovod_controllers"] = {"gloo": bool(hvd.gloo_built()), "mpi": bool(hvd.mpi_built())}
        out["horovod_ops"] = {"nccl": bool(hvd.nccl_built()), "mpi": bool(hvd.mpi_built()),
                              "gloo": bool(hvd.gloo_built())}
        out["horovod_backend"] = "ok" if (hvd.gloo_built() or hvd.mpi_built()) else "cannot run: no controller"
    except Exception as e:  # noqa: BLE001
        out["horovod"] = None
        out["horovod_backend"] = f"cannot run: {e}"
        out["missing"].append("horovod==0.28.1 built with TensorFlow (make setup)")
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
        if k in ("environment", "missing"):
            continue
        print(f"{k:<{width}} {v}")
    print("environment:" if info["environment"] else "environment:        (no Slurm/MPI/Horovod/NCCL variables)")
    for k, v in info["environment"].items():
        print(f"  {k}={v}")
    for m in info["missing"]:
        print(f"MISSING: {m}")
    bad = [b for b in ("native", "horovod_backend") if info.get(b) != "ok"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
