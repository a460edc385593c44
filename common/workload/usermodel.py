"""The user's model lives in ``common.workload.usercode`` (with the rest of the user's code). This module only
re-exports the two names ``common/training/compiled.py`` and ``common/training/streamed.py`` import from here, so
they keep working until they import ``usercode.build_model`` and ``usercode.compiled_parts`` directly; then it goes.
"""

from common.workload.usercode import build_model, compiled_parts

__all__ = ["build_model", "compiled_parts"]
