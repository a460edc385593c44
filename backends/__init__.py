"""The backends: implementations of the contract in ``common.core.contract``, one module each, listed in
``common.core.registry`` (the only list of backends). Import nothing here: ``python -m backends.native`` must not
import Horovod. Run them as modules, never by path (``backends/horovod.py`` would shadow the real ``horovod``).
"""
