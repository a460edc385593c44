"""A user dataset function's ``tf.data.Dataset`` read into arrays, and the check that can run before TensorFlow is
configured.

Two shapes are read as they are: an unbatched finite dataset of ``(x, y)``, and the tutorials' shape, a dataset
ending in ``.repeat()``, ``.batch(n)`` and ``.prefetch(...)`` in any order (TensorFlow's "Multi-worker training with
Keras" ``mnist_dataset(batch_size)``: ``from_tensor_slices(...).shuffle(60000).repeat().batch(batch_size)``). Those
last operations only repeat and group the examples, so twinbench removes them (``strip``) and reads one pass of the
examples below, in their order; it then shuffles, batches and shards them itself with the job's seed
(``common.workload.data``), as any arrays. A ``batch`` or ``repeat`` below another operation (``.batch(n).map(f)``)
changes what that operation sees and is refused, naming it.

Same examples on every rank and backend: the function runs with TensorFlow's global seed set to the job's ``seed``
right before the call (``common.workload.usercode``), so an unseeded ``shuffle`` draws the same op seed in every
process; one pass of it is read, so its order is the same everywhere too.

``probe``: the function called in a throwaway graph (``tf.Graph().as_default()``), which builds the pipeline without
starting TensorFlow's runtime (the eager context is left uninitialised: its thread pools can still be sized by the
backend). What it returns says whether the data needs TensorFlow: arrays are kept, a dataset is read later, in the
ranks, once the backend has configured TensorFlow.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# the last operations of a pipeline that only group or repeat its examples: (type name, what the banner calls it)
_TAIL = {"_BatchDataset": "batch", "_ParallelBatchDataset": "batch", "_RepeatDataset": "repeat",
         "_PrefetchDataset": "prefetch", "_OptionsDataset": ""}
READ_BATCH = 1024  # examples per read: one host copy per 1024 examples, not per example


def is_dataset(value: Any) -> bool:
    return type(value).__module__.startswith("tensorflow") and hasattr(value, "element_spec")


def _op(ds: Any, kind: str) -> str:
    """``batch(64)``, ``repeat()``, ``repeat(3)``, ``prefetch``: an operation as the user wrote it."""
    if kind == "batch":
        return f"batch({_int(getattr(ds, '_batch_size', None))})"
    if kind == "repeat":
        count = _int(getattr(ds, "_count", None))
        return "repeat()" if count in (-1, "?") else f"repeat({count})"
    return kind


def _int(t: Any) -> int | str:
    try:
        return int(t)
    except (TypeError, ValueError):
        return "?"


def strip(ds: Any) -> tuple[Any, list[str]]:
    """(the dataset below its last batch / repeat / prefetch / options operations, those operations, outermost
    first, without the options)."""
    removed = []
    while type(ds).__name__ in _TAIL and getattr(ds, "_input_dataset", None) is not None:
        kind = _TAIL[type(ds).__name__]
        if kind:
            removed.append(_op(ds, kind))
        ds = ds._input_dataset
    return ds, removed


def _below(ds: Any) -> list[tuple[str, str]]:
    """(operation, the operation above it) for every batch or repeat left in the chain below ``ds``."""
    out, above = [], ds
    ds = getattr(ds, "_input_dataset", None)
    while ds is not None:
        kind = _TAIL.get(type(ds).__name__)
        if kind in ("batch", "repeat"):
            out.append((_op(ds, kind), type(above).__name__.strip("_").removesuffix("Dataset").lower()))
        above, ds = ds, getattr(ds, "_input_dataset", None)
    return out


def problems(tf: Any, ds: Any) -> list[str]:
    """Every reason the (stripped) dataset cannot be read as one pass of ``(x, y)`` examples."""
    found = []
    if int(ds.cardinality()) == int(tf.data.INFINITE_CARDINALITY):
        found.append("infinite")
    for op, above in _below(ds):
        found.append(f"{'batched' if op.startswith('batch') else 'repeated'} ({op} under {above}())")
    spec = ds.element_spec
    if not isinstance(spec, tuple) or len(spec) != 2:
        found.append(f"made of {type(spec).__name__} elements, not (x, y) pairs")
    return found


def read(tf: Any, ref: str, ds: Any, split: str, error: type[Exception]) -> tuple[np.ndarray, np.ndarray, str]:
    """(features, labels, what twinbench did to the dataset, in the banner's words) from one pass of ``ds``;
    ``error`` naming every problem at once."""
    inner, removed = strip(ds)
    found = problems(tf, inner)
    if found:
        what = f" (after removing its last {', '.join(removed)})" if removed else ""
        raise error(f"dataset = {ref!r}: the {split} tf.data.Dataset{what} is {' and '.join(found)}: twinbench reads "
                    "one pass of (x, y) examples; it removes batch(), repeat() and prefetch() only as the last "
                    "operations, so move them last or drop them")
    xs, ys = [], []
    for x, y in inner.batch(READ_BATCH).as_numpy_iterator():
        xs.append(x)
        ys.append(y)
    if not xs:
        raise error(f"dataset = {ref!r}: the {split} tf.data.Dataset is empty")
    x = np.concatenate(xs)
    did = f"removed its last {', '.join(removed)}; " if removed else ""
    did = f"{split}: {did}read one pass, {len(x)} examples"
    return x, np.concatenate(ys), did


def probe(call: Any, seed: int) -> tuple[bool, Any]:
    """(True, what ``call()`` returned) when it returned no TensorFlow object, called in a throwaway graph with
    the graph seed ``seed``; (False, None) when it returned a dataset or raised there (it is called again, eagerly,
    in the ranks: its own error comes then)."""
    from common.core import tfquiet

    tf = tfquiet.import_tensorflow()
    with tf.Graph().as_default():
        tf.random.set_seed(seed)
        try:
            out = call()
        except Exception:  # noqa: BLE001 - eager-only code, or an error the eager call will report
            return False, None
    parts = out.values() if isinstance(out, dict) else [out]
    if any(is_dataset(p) or any(is_dataset(v) or "tensorflow" in type(v).__module__ for v in _items(p))
           for p in parts):
        return False, None
    return True, out


def _items(part: Any) -> list[Any]:
    return list(part) if isinstance(part, tuple | list) else [part]
