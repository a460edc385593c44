"""A user dataset function's ``tf.data.Dataset`` read into arrays, and the check that can run before TensorFlow is
configured.

The pipelines the tutorials and Horovod's examples write are read as they are written: TensorFlow's "Multi-worker
training with Keras" ``from_tensor_slices(...).shuffle(60000).repeat().batch(batch_size)``, Horovod's
``dataset.repeat().shuffle(10000).batch(128)``, a ``shard(hvd.size(), hvd.rank())`` and a ``take(n)`` among them.
twinbench reads ONE pass of the examples and then shuffles (with the job's seed), batches, repeats and shards them
itself, exactly, as any arrays (``common.workload.data``). So the last operations of a pipeline (its *tail*: the
chain of ``batch``, ``repeat``, ``shuffle``, ``shard``, ``take``, ``prefetch`` and options above everything else) are
examined one by one, outermost first (``tail``, ``Reading``):

- ``batch(n)``, ``repeat(...)``, ``prefetch``: removed (they only group and repeat the examples);
- ``shuffle(n)``: replaced by twinbench's seeded shuffle of the whole pass (the examples are read in their source
  order); a ``repeat()`` before it (Horovod's order) is read as one pass too;
- ``shard(n, i)``: ``shard(1, 0)`` is a no-op; another is undone (every example read once): twinbench shards the
  examples exactly itself, so each rank's ``1/n`` would be sharded twice. Undone, the ranks' reads agree even when
  the function took ``n`` and ``i`` from Horovod's rank;
- ``take(n)`` with a ``repeat`` below it: the length of a repeated stream (Horovod's ``dataset.take(steps)``),
  removed: the job's ``steps`` set the run's length; without one, it keeps the first ``n`` elements of a finite
  pass: kept, with everything below it read as it is (a ``shuffle`` there picks which examples, with the job's seed;
  a ``batch`` there is unbatched after the read).

Refused, every problem in one line: a ``batch`` or ``repeat`` below another operation (``.batch(n).map(f)``: what
``f`` sees would change), a ``shard(n, i)`` with ``n > 1`` that cannot be undone (below a kept ``take`` or another
operation: each rank would read other examples), a pass still infinite, elements that are not ``(x, y)`` pairs.

Same examples on every rank and backend: the function runs with TensorFlow's global seed set to the job's ``seed``
right before the call (``common.workload.usercode``), so an unseeded ``shuffle`` that is read (below a kept
``take`` or a ``map``) draws the same op seed in every process.

Held once: a pass that is a ``from_tensor_slices`` of tensors (the usual in-memory pipeline) becomes numpy views of
those tensors (``np.from_dlpack``: no copy); another pass is read into arrays allocated once when tf.data knows its
length, without tf.data's static optimizations (they would serialise the pipeline's captured tensors, a copy).

``probe``: the function called in a throwaway graph (``tf.Graph().as_default()``), which builds the pipeline without
starting TensorFlow's runtime (the eager context is left uninitialised: its thread pools can still be sized by the
backend). What it returns says whether the data needs TensorFlow: arrays are kept, a dataset is read later, in the
ranks, once the backend has configured TensorFlow. In that graph a large numpy array made into a tensor becomes a
placeholder of its dtype and shape (``_light_constants``): the graph is never run, and a constant would copy the
array several times over (its serialised proto and the graph's own copy).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

# the operations of a pipeline's tail (type name -> kind); "" = options, dropped without a word
_TAIL = {"_BatchDataset": "batch", "_ParallelBatchDataset": "batch", "_RepeatDataset": "repeat",
         "_PrefetchDataset": "prefetch", "_OptionsDataset": "", "_ShuffleDataset": "shuffle",
         "_ShardDataset": "shard", "_TakeDataset": "take"}
READ_BATCH = 1024  # examples per read: one host copy per 1024 examples, not per example
LIGHT_BYTES = 1 << 20  # in the probe's graph, a numpy array of this size or more becomes a placeholder


def is_dataset(value: Any) -> bool:
    return type(value).__module__.startswith("tensorflow") and hasattr(value, "element_spec")


@dataclass(frozen=True)
class Op:
    """One operation of a pipeline's tail: its kind, as the user wrote it, its arguments, the dataset it made."""

    kind: str  # batch, repeat, prefetch, shuffle, shard, take, "" (options)
    text: str  # batch(64), repeat(), shard(2, 1), take(100)
    args: tuple[int | str, ...]  # the integers in text ("?" when not a constant)
    ds: Any


def _int(t: Any) -> int | str:
    try:
        return int(t)
    except (TypeError, ValueError):
        return "?"


def _op(ds: Any, kind: str) -> Op:
    """An operation as the user wrote it: ``batch(64)``, ``repeat()``, ``shuffle(10000)``, ``shard(2, 1)``."""
    attrs = {"batch": ("_batch_size",), "repeat": ("_count",), "shuffle": ("_buffer_size",),
             "shard": ("_num_shards", "_index"), "take": ("_count",)}.get(kind, ())
    args = tuple(_int(getattr(ds, a, None)) for a in attrs)
    if kind == "repeat" and args[0] in (-1, "?"):
        return Op(kind, "repeat()", args, ds)
    return Op(kind, f"{kind}({', '.join(str(a) for a in args)})" if attrs else kind, args, ds)


def tail(ds: Any) -> tuple[list[Op], Any]:
    """(the tail's operations, outermost first; the dataset below them)."""
    ops = []
    while type(ds).__name__ in _TAIL and getattr(ds, "_input_dataset", None) is not None:
        ops.append(_op(ds, _TAIL[type(ds).__name__]))
        ds = ds._input_dataset
    return ops, ds


@dataclass(frozen=True)
class Reading:
    """How one pass is read from a pipeline's tail ``ops`` (outermost first): the outermost ``cut`` operations
    are removed or replaced, the rest (from a kept ``take`` down) read as they are."""

    ops: list[Op]
    cut: int

    @classmethod
    def of(cls, ops: list[Op]) -> Reading:
        """The cut: at the outermost ``take`` with no ``repeat`` below it (it keeps a finite pass's first
        elements), else below the whole tail."""
        for i, op in enumerate(ops):
            if op.kind == "take" and not any(o.kind == "repeat" for o in ops[i + 1:]):
                return cls(ops, i)
        return cls(ops, len(ops))

    @property
    def kept(self) -> list[Op]:
        return self.ops[self.cut:]

    def unbatch(self) -> bool:
        """Are the kept operations' elements batches (a ``batch`` below a kept ``take``)?"""
        return any(op.kind == "batch" for op in self.kept)

    def problems(self) -> list[str]:
        """A shard that cannot be undone: below a kept ``take``, each rank would keep other examples."""
        return [f"sharded ({op.text} under {self.ops[self.cut].text}: each rank would keep other examples)"
                for op in self.kept if op.kind == "shard" and op.args != (1, 0)]

    def said(self, examples: int) -> list[str]:
        """What twinbench did with each operation, in the pipeline's order (innermost first)."""
        out = []
        for i in reversed(range(len(self.ops))):
            text = self._removed(i) if i < self.cut else self._kept(i, examples)
            if text:
                out.append(text)
        return out

    def _removed(self, i: int) -> str:
        op = self.ops[i]
        if op.kind == "repeat":
            if any(o.kind == "shuffle" for o in self.ops[:i]):
                return f"{op.text} before shuffle(): one pass read, twinbench repeats and shuffles with the job's seed"
            return f"{op.text}: removed, one pass read (twinbench repeats it)"
        if op.kind == "shard":
            if op.args == (1, 0):
                return f"{op.text}: one shard, a no-op"
            return f"{op.text}: undone, every example read once (twinbench shards them exactly itself)"
        return {"batch": f"{op.text}: removed (twinbench batches)", "prefetch": "prefetch: removed",
                "shuffle": f"{op.text}: replaced by twinbench's seeded shuffle of the whole pass",
                "take": f"{op.text}: the length of a repeated stream, removed (the job's steps set the run's length)",
                }.get(op.kind, "")

    def _kept(self, i: int, examples: int) -> str:
        op = self.ops[i]
        if i == self.cut:
            return f"{op.text}: kept, {examples} examples"
        if op.kind == "shuffle":
            return f"{op.text} under {self.ops[self.cut].text}: kept, it picks the examples (the job's seed)"
        if op.kind == "take":
            return f"{op.text}: kept"
        if op.kind == "shard":
            return f"{op.text}: one shard, a no-op"
        return ""


def _below(ds: Any) -> list[tuple[Op, str]]:
    """(operation, the operation above it) for every batch, repeat or shard (other than ``shard(1, 0)``) in the
    chain below ``ds``."""
    out, above = [], ds
    ds = getattr(ds, "_input_dataset", None)
    while ds is not None:
        kind = _TAIL.get(type(ds).__name__)
        if kind in ("batch", "repeat", "shard"):
            op = _op(ds, kind)
            if op.args != (1, 0):
                out.append((op, type(above).__name__.strip("_").removesuffix("Dataset").lower()))
        above, ds = ds, getattr(ds, "_input_dataset", None)
    return out


def problems(tf: Any, ds: Any, source: Any) -> list[str]:
    """Every reason the dataset ``ds`` below the tail cannot give one pass of ``(x, y)`` examples read from
    ``source`` (``ds``, or a kept ``take`` above it)."""
    found = []
    if int(source.cardinality()) == int(tf.data.INFINITE_CARDINALITY):
        found.append("infinite")
    words = {"batch": "batched", "repeat": "repeated", "shard": "sharded"}
    for op, above in _below(ds):
        found.append(f"{words[op.kind]} ({op.text} under {above}())")
    spec = ds.element_spec
    if not isinstance(spec, tuple) or len(spec) != 2:
        found.append(f"made of {type(spec).__name__} elements, not (x, y) pairs")
    return found


def read(tf: Any, ref: str, ds: Any, split: str, error: type[Exception]) -> tuple[np.ndarray, np.ndarray, str]:
    """(features, labels, what twinbench did to the dataset, in the banner's words) from one pass of ``ds``;
    ``error`` naming every problem at once."""
    ops, core = tail(ds)
    how = Reading.of(ops)
    source = how.ops[how.cut].ds if how.cut < len(ops) else core
    found = problems(tf, core, source) + how.problems()
    if found:
        removed = [op.text for op in ops[:how.cut] if op.kind]
        what = f" (after removing its last {', '.join(removed)})" if removed else ""
        raise error(f"dataset = {ref!r}: the {split} tf.data.Dataset{what} is {' and '.join(found)}: twinbench "
                    "reads one pass of (x, y) examples and shuffles, batches, repeats and shards them itself; it "
                    "takes batch(), repeat(), shuffle(), shard(), take() and prefetch() only as the last "
                    "operations, so move them last or drop them")
    arrays = _slices(core, how) or _read_pass(tf, source, how.unbatch())
    if arrays is None:
        raise error(f"dataset = {ref!r}: the {split} tf.data.Dataset is empty")
    x, y = arrays
    said = "; ".join([*how.said(len(x)), f"read one pass, {len(x)} examples"])
    return x, y, f"{split}: {said}"


def _slices(core: Any, how: Reading) -> tuple[np.ndarray, np.ndarray] | None:
    """The pass as numpy views of the tensors a ``from_tensor_slices`` holds (no copy), limited by kept ``take``\\ s
    and nothing else; None when the pass is anything else (it is read), or its tensors cannot be viewed."""
    if type(core).__name__ != "_TensorSliceDataset" or any(op.kind not in ("take", "prefetch", "")
                                                            for op in how.kept):
        return None
    tensors, spec = getattr(core, "_tensors", None), core.element_spec
    if not isinstance(spec, tuple) or len(spec) != 2 or not isinstance(tensors, list) or len(tensors) != 2:
        return None  # nested features: read
    try:
        x, y = (np.from_dlpack(t) for t in tensors)  # TensorFlow's own buffer, read-only
    except Exception:  # noqa: BLE001 - a device or dtype DLPack cannot carry: read instead
        return None
    limits = [op.args[0] for op in how.kept if op.kind == "take"]
    if any(not isinstance(c, int) for c in limits):
        return None  # a count that is not a constant: read
    n = min([len(x), *(c for c in limits if c >= 0)])  # take(-1): every element
    return (x[:n], y[:n]) if n else None


def _read_pass(tf: Any, ds: Any, unbatch: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """One pass of ``ds`` (unbatched first when its elements are batches) into arrays: allocated once when tf.data
    knows the pass's length, else concatenated; None when it is empty."""
    if unbatch:
        ds = ds.unbatch()
    options = tf.data.Options()
    # tf.data's static optimizations rewrite the pipeline through its serialised graph, which copies every tensor
    # it captures (the from_tensor_slices data): a copy of the data for one pass read
    options.experimental_optimization.apply_default_optimizations = False
    ds = ds.with_options(options)
    n = int(ds.cardinality())
    parts: list[tuple[np.ndarray, np.ndarray]] = []
    out, filled = None, 0
    for x, y in ds.batch(READ_BATCH).as_numpy_iterator():
        if n > 0 and out is None:
            out = (np.empty((n, *x.shape[1:]), x.dtype), np.empty((n, *y.shape[1:]), y.dtype))
        if out is not None:
            out[0][filled:filled + len(x)], out[1][filled:filled + len(y)] = x, y
        else:
            parts.append((x, y))
        filled += len(x)
    if out is not None:
        return out
    if not parts:
        return None
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


@contextlib.contextmanager
def _light_constants(tf: Any) -> Iterator[None]:
    """In the current graph, a numpy array of ``LIGHT_BYTES`` or more made into a tensor is a placeholder of its
    dtype and shape instead of a constant. TensorFlow makes graph constants in one function,
    ``tensorflow.python.framework.ops._create_graph_constant``; where it has none (another version) the probe
    builds constants as before."""
    from tensorflow.python.framework import ops

    make = getattr(ops, "_create_graph_constant", None)
    if make is None:
        yield
        return

    def light(value: Any, dtype: Any, shape: Any, name: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(value, np.ndarray) and value.nbytes >= LIGHT_BYTES:
            return tf.compat.v1.placeholder(dtype or value.dtype, value.shape if shape is None else shape, name)
        return make(value, dtype, shape, name, *args, **kwargs)

    ops._create_graph_constant = light
    try:
        yield
    finally:
        ops._create_graph_constant = make


def probe(call: Any, seed: int) -> tuple[bool, Any]:
    """(True, what ``call()`` returned) when it returned no TensorFlow object, called in a throwaway graph with
    the graph seed ``seed``; (False, None) when it returned a dataset or raised there (it is called again, eagerly,
    in the ranks: its own error comes then)."""
    from common.core import tfquiet

    tf = tfquiet.import_tensorflow()
    with tf.Graph().as_default(), _light_constants(tf):
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
