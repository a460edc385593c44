"""``python -m common.doctor``: can each backend run here, and with what? Exit 1 when a backend cannot run.

``python -m common.doctor --stack``: can this stack (a container's or a module's Python, twinbench run from its
checkout) run both backends as it is, nothing built: one line each for TensorFlow (2.16-2.21), tf-keras (TensorFlow's
minor, present or installable beside it), Horovod (imports with TensorFlow support; twinbench's build or found), its
controllers and GPU operations (what ``horovodrun --check-build`` lists), MPI, how twinbench would launch Horovod's
ranks (the controller the build has or TWINBENCH_HOROVOD_CONTROLLER names), and the verdict; exit 0 when both
backends can run, else 2."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Any

from common.core import buildinfo, registry, tfquiet

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
HOROVOD_CONTROLLER_ENV = "TWINBENCH_HOROVOD_CONTROLLER"  # how the ranks are launched (backends/horovod_launch.py)
SUPPORTED_TF = ((2, 16), (2, 21))  # TensorFlow minors twinbench runs on (tf-keras exists, Horovod 0.28.1 builds)


def _minor(version: str) -> tuple[int, int] | None:
    parts = version.split(".")
    return (int(parts[0]), int(parts[1])) if len(parts) > 1 and parts[0].isdigit() and parts[1].isdigit() else None


def stack_facts() -> dict[str, Any]:
    """What this Python's stack has, read the way the runs read it (imports, Horovod's own build queries)."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    facts: dict[str, Any] = {"python": sys.version.split()[0], "tf_keras": buildinfo._installed("tf-keras")}
    try:
        tf = tfquiet.import_tensorflow()

        facts["tensorflow"] = tf.__version__
    except Exception as e:  # noqa: BLE001 - any import failure is the fact
        facts["tensorflow_error"] = f"{type(e).__name__}: {e}".splitlines()[0]
    try:
        import horovod
        import horovod.tensorflow as hvd

        facts["horovod"] = horovod.__version__
        # horovod.common.basics: mpi_built/gloo_built True or False, nccl_built NCCL's version code (0: none)
        facts["horovod_built"] = {"mpi": bool(hvd.mpi_built()), "gloo": bool(hvd.gloo_built()),
                                  "nccl": int(hvd.nccl_built()), "cuda": bool(hvd.cuda_built()),
                                  "rocm": bool(hvd.rocm_built())}
        facts["horovod_build"] = "twinbench's build" if buildinfo.read_marker() else "found in the stack"
        facts["horovod_controller_asked"] = os.environ.get(HOROVOD_CONTROLLER_ENV)
    except Exception as e:  # noqa: BLE001 - any import failure is the fact
        facts["horovod_error"] = f"{type(e).__name__}: {e}".splitlines()[0]
    mpirun = shutil.which("mpirun")
    if mpirun:
        try:
            v = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=20).stdout
            facts["mpi"] = (v.strip().splitlines() or ["?"])[0]
        except (OSError, subprocess.TimeoutExpired):
            facts["mpi"] = "?"
    return facts


def judge_stack(f: dict[str, Any]) -> tuple[list[str], bool, bool]:
    """One line per fact, and whether the native and the Horovod backend can run on this stack as it is."""
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
    built = f.get("horovod_built")
    if built is None:
        lines.append(f"horovod: cannot run: horovod.tensorflow does not import ({f.get('horovod_error', '?')})")
    else:
        lines.append(f"horovod: {f['horovod']} with TensorFlow support, {f.get('horovod_build', '?')}: ok")
        ctl = [n for n in ("mpi", "gloo") if built[n]]
        lines.append("horovod controllers: " + (", ".join(c.upper() if c == "mpi" else c.title() for c in ctl)
                                                if ctl else "none: cannot run (built without MPI and Gloo)"))
        gpu = "NCCL" if built["nccl"] else ("MPI" if built["cuda"] or built["rocm"] else "none (a CPU build)")
        lines.append(f"horovod GPU operations: {gpu}")
    lines.append(f"mpi: {f['mpi']}" if f.get("mpi") else
                 "mpi: no mpirun on PATH (Horovod runs under horovodrun --gloo or srun --mpi=pmix)")
    launch_ok = False
    if built is not None:
        launch_lines, launch_ok = registry.load("horovod").stack_launch(built, f.get("horovod_controller_asked"),
                                                                        f.get("mpi"))
        lines += launch_lines
    native = tf_ok and keras_ok
    hvd = native and launch_ok
    lines.append(f"backends: native {'can run' if native else 'cannot run'}, horovod "
                 f"{'can run' if hvd else 'cannot run'}")
    return lines, native, hvd


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--stack"]:
        lines, native, hvd = judge_stack(stack_facts())
        print("\n".join(f"stack {line}" for line in lines))
        return 0 if native and hvd else 2
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
