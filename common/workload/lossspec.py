"""The loss keys of a model with several outputs are job keys, checked in ``common.workload.job``
(``_validate_outputs``). This module only re-exports ``weights`` for ``common/training/objective.py`` and
``common/training/outputs.py``, which import it from here until they call ``job.loss_weights_of`` directly; then it
goes.
"""

from common.workload.job import loss_weights_of as weights

__all__ = ["weights"]
