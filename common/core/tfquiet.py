"""TensorFlow imported without its GPU-probe lines on a machine that has no GPU.

TensorFlow's CUDA build probes for a GPU when it is imported and when it first lists devices, and says so on stderr
even where there is none: ``cudart_stub.cc ... Could not find cuda drivers on your machine, GPU will not be used``
(at import) and ``cuda_platform.cc ... failed call to cuInit: ... (303)`` (listing devices). ``TF_CPP_MIN_LOG_LEVEL``
does not hide them: the first is written before absl's logging is initialised ("All log messages before
absl::InitializeLog() is called are written to STDERR"), whatever the level (TF 2.21: both are printed at level 1
and 2), and the second is an ERROR, hidden only at level 3 with every other error.

So ``import_tensorflow`` does the import and the first device listing with the process's stderr (file descriptor 2:
the lines come from C++) pointed at a temporary file, then writes back every line but the probe's (``NOISE``), only:
- when the machine has no GPU device node (``GPU_NODES``): where a GPU exists, a failed cuInit is a real error;
- when stderr is not a regular file: a run log (the demo's ``logs/``, a Slurm job's output) keeps every line.
``TWINBENCH_TF_NOISE=1`` keeps them everywhere.
"""

from __future__ import annotations

import ast
import contextlib
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any

NOISE = ("Could not find cuda drivers", "failed call to cuInit", "Unable to register cuDNN factory",
         "Unable to register cuFFT factory", "Unable to register cuBLAS factory", "Cannot dlopen some GPU libraries",
         "TF-TRT Warning: Could not find TensorRT")
GPU_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg", "/dev/kfd")  # NVIDIA, WSL's GPU, ROCm


def has_gpu_node() -> bool:
    return any(os.path.exists(p) for p in GPU_NODES)


def _stderr_is_file() -> bool:
    try:
        return stat.S_ISREG(os.fstat(2).st_mode)
    except OSError:
        return True  # no stderr to tidy


def should_filter() -> bool:
    return os.environ.get("TWINBENCH_TF_NOISE") != "1" and not has_gpu_node() and not _stderr_is_file()


def keep(text: str) -> str:
    """``text`` without the GPU probe's lines."""
    return "".join(line for line in text.splitlines(keepends=True) if not any(n in line for n in NOISE))


def import_tensorflow() -> Any:
    """``import tensorflow`` (and its first device listing) without the GPU probe's lines where they mean nothing."""
    if "tensorflow" in sys.modules or not should_filter():
        import tensorflow as tf

        return tf
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            import tensorflow as tf

            with contextlib.suppress(Exception):  # its own failure comes again where devices are used
                tf.config.list_physical_devices("GPU")  # cuInit's line; the runtime itself is not started
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            rest = keep(capture.read().decode(errors="replace"))
            if rest:
                sys.stderr.write(rest)
                sys.stderr.flush()
    return tf


TF_MODULES = ("tensorflow", "tf_keras", "keras")  # importing any of them imports TensorFlow


def mentions(source: Path | None) -> bool:
    """Does this Python file name tensorflow anywhere (imported at its top or inside a function)?"""
    try:
        return source is not None and "tensorflow" in source.read_text()
    except (OSError, UnicodeDecodeError):
        return False


def before_importing(source: Path | None) -> None:
    """``import_tensorflow`` now if the module in ``source`` imports TensorFlow (or a Keras) at its top level: its
    import would otherwise be TensorFlow's first, with the probe's lines. Read, not imported."""
    try:
        tree = ast.parse(source.read_text()) if source is not None else None
    except (OSError, SyntaxError, UnicodeDecodeError):
        return
    names = [a.name for n in (tree.body if tree else []) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in (tree.body if tree else []) if isinstance(n, ast.ImportFrom)]
    if any(name.split(".")[0] in TF_MODULES for name in names):
        import_tensorflow()
