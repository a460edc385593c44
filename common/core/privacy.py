"""What a published record may say of the environment: the variables that tune the libraries, never a secret, never a
home directory.

A centre publishes its records and reports, so the record takes variables by name, not every ``TF_*``: Terraform's
``TF_VAR_*`` variables commonly hold passwords and tokens, and ``TF_CLI_CONFIG_FILE`` is a path into the home
directory. Kept: the named list and prefixes below (TensorFlow's documented tuning variables, and the collective
libraries' own prefixes), with the value of any name that looks like a secret replaced, and every home directory in
a value written as ``~``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

# The collective libraries' own prefixes (NCCL, Horovod, Open MPI's MCA parameters, UCX) and TensorFlow's tuning
# families: TF_GPU_* (GPU threads and allocator), TF_XLA_* (XLA flags), TF_CPP_* (logging), TF_ENABLE_* (oneDNN and
# other switches), TF_CUDNN_* and TF_DETERMINISTIC_* (determinism).
TUNING_PREFIXES = ("NCCL_", "HOROVOD_", "OMPI_MCA_", "UCX_", "TF_GPU_", "TF_XLA_", "TF_CPP_", "TF_ENABLE_",
                   "TF_CUDNN_", "TF_DETERMINISTIC_")
# Single TensorFlow / XLA variables that change what runs (not TF_CONFIG: the cluster's addresses are recorded apart)
TUNING_NAMES = frozenset({"TF_USE_LEGACY_KERAS", "TF_FORCE_GPU_ALLOW_GROWTH", "TF_NUM_INTEROP_THREADS",
                          "TF_NUM_INTRAOP_THREADS", "TF_USE_CUDNN_AUTOTUNE", "XLA_FLAGS"})
SECRET = re.compile(r"TOKEN|PASSWORD|PASSWD|SECRET|KEY|CREDENTIAL|AUTH", re.IGNORECASE)
REDACTED = "<redacted>"
# Home directories of other users too (a shared results directory holds everyone's runs)
_HOME_PATTERN = re.compile(r"(?<![\w.-])/(?:home|Users|users)/[^/\s\"':,;]+")


def is_tuning(name: str) -> bool:
    """Whether ``name`` tunes TensorFlow or a collective library (and so belongs in a record)."""
    return name in TUNING_NAMES or name.startswith(TUNING_PREFIXES)


def without_home(text: str, home: str | None = None) -> str:
    """``text`` with this user's home directory (``home``, default ``$HOME``) and any ``/home/USER``-like path
    written as ``~``."""
    home = os.path.expanduser("~") if home is None else home
    if home and home not in ("/", "") and home in text:
        text = re.sub(rf"(?<![\w.-]){re.escape(home.rstrip('/'))}(?=/|$|[\s\"':,;])", "~", text)
    return _HOME_PATTERN.sub("~", text)


def public_env(environ: Mapping[str, str] | None = None, home: str | None = None) -> dict[str, str]:
    """The tuning variables of ``environ`` (default: this process's), sorted, secrets redacted, homes as ``~``."""
    environ = os.environ if environ is None else environ
    return {k: REDACTED if SECRET.search(k) else without_home(v, home)
            for k, v in sorted(environ.items()) if is_tuning(k)}


def public(value: Any, home: str | None = None) -> Any:
    """A JSON-like value with every string's home directories written as ``~`` (dict keys too); other values as is."""
    if isinstance(value, str):
        return without_home(value, home)
    if isinstance(value, Mapping):
        return {public(k, home): public(v, home) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [public(v, home) for v in value]
    return value
