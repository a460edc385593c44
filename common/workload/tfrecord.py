"""ImageNet-style TFRecord shards: naming, framing, a record index built without TensorFlow, and the tf.data readers.

The format is what the ImageNet build scripts of tf_cnn_benchmarks and the TensorFlow Model Garden write
(``build_imagenet_data.py``): training files ``train-NNNNN-of-MMMMM`` (``train-00000-of-01024`` ...), each a plain
(uncompressed) TFRecord file, i.e. per record: uint64 length (little endian), uint32 masked CRC-32C of those 8
bytes, the data, uint32 masked CRC-32C of the data. Every record is a serialized ``tf.train.Example`` holding at
least ``image/encoded`` (JPEG bytes) and ``image/class/label`` (int64; 1..1000 in ImageNet's build, 0 being the
background class of the Inception-era models); the other keys (``image/height``, ``image/format``, boxes...) are
ignored.

Counting and the exact reading order need every record's byte offset: ``record_index`` walks the framing (one
12-byte positioned read per record, the length checksum verified, the data never read), in threads because the
cost on a parallel file system is latency. Measured here: 2.6 s for ImageNet's 1,281,167 records in 1024 shards
from the page cache; from a cold local disk 70-85 us per record on one thread, 21-24 us on 8, i.e. 30-110 s for
ImageNet (more on Lustre/GPFS). So the result is cached: one ``.npz`` (10 MB for ImageNet, loaded in 0.1 s) per
data directory in ``$TWINBENCH_CACHE/tfrecord-index/`` (default ``~/.cache/twinbench``), valid while every shard
keeps its name, size and mtime; a changed shard is walked again, the others are reused. Ranks starting together
on a fresh directory each walk it once; ``python -m common.workload.tfrecord DATA_DIR`` builds the cache beforehand
(e.g. on a login node) and prints the count.

Reading in the exact global order costs one positioned read per record (``read_by_index``): only this rank's
records are read, at 0.1-0.2 ms of CPU each here, next to about 1.2 ms to decode a 375x500 JPEG and resize it to
224x224 (2 cores: 1430-1590 images/s in exact mode, 1790-1870 streaming whole shards in files mode).

This module imports nothing of the project (``common.workload.datasets`` wraps its ``FormatError`` into ``DataError``)
and TensorFlow only inside the pipeline functions, which take the ``tf`` module as their first argument.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# ImageNet's training shard names: exactly 5 digits each, as build_imagenet_data.py writes them.
SHARD_RE = re.compile(r"train-(\d{5})-of-(\d{5})")
ENCODED, LABEL = "image/encoded", "image/class/label"  # the two Example keys the pipeline reads
INDEX_VERSION = 1  # bump when the cache layout changes: older cache files are then ignored and rebuilt
WALK_THREADS = 16  # shards walked at once: header reads are latency-bound on network file systems
FILES_CYCLE = 10  # shards read at once in files mode (Model Garden's ImageNet input uses cycle_length=10)
FILES_SHUFFLE = 10_000  # records in the per-rank shuffle buffer in files mode (Model Garden's _SHUFFLE_BUFFER)
FILES_READ_BUFFER = 8 << 20  # bytes per sequential read in files mode: large reads suit parallel file systems


class FormatError(ValueError):
    """Shards missing, misnamed or corrupt; the message is one line (``common.workload.datasets`` prefixes
    ``tfrecord:``)."""


@dataclass(frozen=True, eq=False)
class RecordIndex:
    """Where every record is: shards in shard-number order, records numbered shard by shard."""

    paths: tuple[str, ...]
    counts: np.ndarray  # int64 [shards]: records per shard
    offsets: np.ndarray  # int64 [records]: byte offset of each record's header in its shard

    @property
    def size(self) -> int:
        return len(self.offsets)

    def shard_ids(self) -> np.ndarray:
        """int32 [records]: the shard (position in ``paths``) of each record."""
        return np.repeat(np.arange(len(self.paths), dtype=np.int32), self.counts)


# ----------------------------------------------------------------------------------------------------------------
# shard names
# ----------------------------------------------------------------------------------------------------------------
def list_shards(data_dir: Path) -> list[Path]:
    """The ``train-NNNNN-of-MMMMM`` shards of data_dir, in shard order; FormatError unless all M are there."""
    if not data_dir.is_dir():
        raise FormatError(f"data_dir {data_dir} is not a directory: set data_dir (job file or --set data_dir=PATH) "
                          "to the directory of ImageNet's train-00000-of-01024 ... shards; nothing is downloaded")
    found: dict[int, Path] = {}
    totals: dict[int, str] = {}
    for p in sorted(data_dir.iterdir()):
        if not p.name.startswith("train-"):
            continue  # validation-*, labels files, anything else of an ImageNet TFRecord directory
        m = SHARD_RE.fullmatch(p.name)
        if m is None or not p.is_file():
            raise FormatError(f"{p} does not follow ImageNet's shard naming train-NNNNN-of-NNNNN (5 digits each, "
                              "no suffix); rename or move it")
        found[int(m.group(1))] = p
        totals.setdefault(int(m.group(2)), p.name)
    if not found:
        raise FormatError(f"no training shards train-NNNNN-of-NNNNN (e.g. train-00000-of-01024) in {data_dir}")
    if len(totals) > 1:
        raise FormatError(f"shards in {data_dir} disagree on their count: {' vs '.join(totals.values())}")
    (total,) = totals
    missing = sorted(set(range(total)) - set(found))
    if missing:
        raise FormatError(f"{len(missing)} of {total} shards missing in {data_dir}, first "
                          f"train-{missing[0]:05d}-of-{total:05d}")
    extra = sorted(set(found) - set(range(total)))
    if extra:
        raise FormatError(f"{found[extra[0]]} is numbered beyond its own count of {total} shards")
    return [found[i] for i in range(total)]


# ----------------------------------------------------------------------------------------------------------------
# framing
# ----------------------------------------------------------------------------------------------------------------
def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1  # CRC-32C (Castagnoli), reflected polynomial
        table.append(c)
    return table


_CRC_TABLE = _crc_table()


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC-32C (pure Python: only ever run on 8-byte length fields)."""
    c = 0xFFFFFFFF
    for byte in data:
        c = _CRC_TABLE[(c ^ byte) & 0xFF] ^ (c >> 8)
    c ^= 0xFFFFFFFF
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def walk(path: Path) -> np.ndarray:
    """int64 byte offsets of every record of one TFRecord file; FormatError (naming the byte) if the framing is bad.

    Reads 12 bytes per record (length and its checksum) and jumps over the data, whose checksum TensorFlow
    verifies when it reads the record.
    """
    offsets = []
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise FormatError(f"cannot read {path} ({e.strerror})") from None
    try:
        size = os.fstat(fd).st_size
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # headers only: no read-ahead of the image data
        pos = 0
        while pos < size:
            head = os.pread(fd, 12, pos)
            if len(head) < 12:
                raise FormatError(f"{path}: truncated record header at byte {pos} of {size}")
            length, crc = struct.unpack("<QI", head)
            if masked_crc32c(head[:8]) != crc:
                raise FormatError(f"{path}: corrupt record framing at byte {pos} (length checksum mismatch): not an "
                                  "uncompressed TFRecord file, or damaged")
            if pos + 16 + length > size:
                raise FormatError(f"{path}: record at byte {pos} claims {length} bytes, past the end of the file "
                                  f"({size} bytes): truncated")
            offsets.append(pos)
            pos += 16 + length
    except OSError as e:
        raise FormatError(f"cannot read {path} ({e.strerror})") from None
    finally:
        os.close(fd)
    return np.asarray(offsets, dtype=np.int64)


# ----------------------------------------------------------------------------------------------------------------
# the index and its cache
# ----------------------------------------------------------------------------------------------------------------
_MEMO: dict[tuple[Any, ...], RecordIndex] = {}  # per process: dataset_info is asked several times per run


def cache_path(data_dir: Path) -> Path:
    """Where the index of data_dir is cached (one file per directory, named by its resolved path)."""
    root = Path(os.environ.get("TWINBENCH_CACHE") or "~/.cache/twinbench").expanduser()
    key = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:16]
    return root / "tfrecord-index" / f"{key}.npz"


def _signature(paths: list[Path]) -> tuple[tuple[str, int, int], ...]:
    stats = [p.stat() for p in paths]
    return tuple((p.name, s.st_size, s.st_mtime_ns) for p, s in zip(paths, stats, strict=True))


def _load_cache(path: Path) -> dict[tuple[str, int, int], np.ndarray]:
    """{(name, size, mtime_ns): offsets} of a previous index; empty if there is none or it is unreadable."""
    try:
        with np.load(path, allow_pickle=False) as z:
            if int(z["version"]) != INDEX_VERSION:
                return {}
            names, sizes, mtimes, counts, offsets = (z[k] for k in ("names", "sizes", "mtimes", "counts", "offsets"))
    except (OSError, ValueError, KeyError):
        return {}
    if counts.sum() != len(offsets):
        return {}
    parts = np.split(offsets, np.cumsum(counts)[:-1])
    return {(str(n), int(s), int(m)): o for n, s, m, o in zip(names, sizes, mtimes, parts, strict=True)}


def _save_cache(path: Path, sig: tuple[tuple[str, int, int], ...], parts: list[np.ndarray]) -> None:
    """Atomic write (temporary file + rename): ranks building the same index at once never see a partial file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")
        np.savez(tmp, version=INDEX_VERSION, names=np.array([s[0] for s in sig]),
                 sizes=np.array([s[1] for s in sig], np.int64), mtimes=np.array([s[2] for s in sig], np.int64),
                 counts=np.array([len(p) for p in parts], np.int64),
                 offsets=np.concatenate(parts) if parts else np.zeros(0, np.int64))
        os.replace(tmp, path)
    except OSError:
        pass  # an unwritable cache only costs the walk again next time


def record_index(data_dir: Path) -> RecordIndex:
    """The offsets of every training record of data_dir: from memory, the cache, or by walking changed shards."""
    paths = list_shards(data_dir)
    try:
        sig = _signature(paths)
    except OSError as e:
        raise FormatError(f"cannot stat a shard in {data_dir} ({e})") from None
    key = (str(data_dir.resolve()), sig)
    if key in _MEMO:
        return _MEMO[key]
    cache = cache_path(data_dir)
    known = _load_cache(cache)
    todo = [p for p, s in zip(paths, sig, strict=True) if s not in known]
    if todo:
        with ThreadPoolExecutor(min(WALK_THREADS, len(todo))) as pool:
            fresh = dict(zip([p.name for p in todo], pool.map(walk, todo), strict=True))
    parts = [known[s] if s in known else fresh[s[0]] for s in sig]
    if todo:
        _save_cache(cache, sig, parts)
    index = RecordIndex(tuple(str(p) for p in paths), np.array([len(p) for p in parts], np.int64),
                        np.concatenate(parts) if parts else np.zeros(0, np.int64))
    _MEMO[key] = index
    return index


# ----------------------------------------------------------------------------------------------------------------
# tf.data readers (``tf`` is the TensorFlow module, imported by the caller)
# ----------------------------------------------------------------------------------------------------------------
def read_by_index(tf: Any, index: RecordIndex, ids: Any) -> Any:
    """Serialized records for a dataset of record numbers, in its order: one positioned read per record.

    Each record is a one-element TFRecordDatasetV2 started at the record's byte offset (its data checksum is
    verified); ``get_single_element`` makes a record that is not there an error instead of a silent shift of the
    stream. Parallel and order-preserving (``deterministic=True``).
    """
    paths = tf.constant(list(index.paths))
    shards = tf.constant(index.shard_ids())
    offsets = tf.constant(index.offsets)
    spec = tf.TensorSpec([], tf.string)

    def one(i: Any) -> Any:
        variant = tf.raw_ops.TFRecordDatasetV2(
            filenames=tf.reshape(tf.gather(paths, shards[i]), [1]), compression_type="",
            buffer_size=tf.constant(0, tf.int64),  # unbuffered: read exactly the header, the data and the footer
            byte_offsets=tf.reshape(offsets[i], [1]))
        return tf.data.experimental.from_variant(variant, spec).take(1).get_single_element()

    return ids.map(one, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def read_by_files(tf: Any, index: RecordIndex, pipeline_index: int, num_pipelines: int, seed: int,
                  skip_records: int) -> Any:
    """Infinite serialized records of this pipeline's shards (round robin: shard s goes to pipeline s % P).

    Epoch e reads the shards in an order drawn from (seed, e, pipeline), FILES_CYCLE at a time, through a
    FILES_SHUFFLE-record shuffle buffer seeded the same way; each epoch is a pure function of its number, so a
    resumed run starts at its epoch and skips only within it.
    """
    mine = list(range(pipeline_index, len(index.paths), num_pipelines))
    per_epoch = int(index.counts[mine].sum())
    first_epoch, skip = divmod(skip_records, per_epoch)
    paths = tf.constant([index.paths[i] for i in mine])
    buffer = min(FILES_SHUFFLE, per_epoch)

    def epoch(e: Any) -> Any:
        stream = e * num_pipelines + pipeline_index  # distinct per (epoch, pipeline)
        order = tf.argsort(tf.random.stateless_uniform([len(mine)], seed=tf.stack([tf.constant(seed, tf.int64),
                                                                                    stream])))
        files = tf.data.Dataset.from_tensor_slices(tf.gather(paths, order))
        records = files.interleave(lambda f: tf.data.TFRecordDataset(f, buffer_size=FILES_READ_BUFFER),
                                   cycle_length=min(FILES_CYCLE, len(mine)), block_length=1,
                                   num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return records.shuffle(buffer, seed=stream)

    return tf.data.Dataset.range(first_epoch, 2**62).flat_map(epoch).skip(skip)


def decoder(tf: Any, shape: tuple[int, int, int], num_classes: int, label_offset: int) -> Any:
    """Serialized Example -> (float32 [H,W,C] in [0, 1], int32 label - label_offset), checked in [0, num_classes)."""
    h, w, c = shape
    features = {ENCODED: tf.io.FixedLenFeature([], tf.string), LABEL: tf.io.FixedLenFeature([], tf.int64)}
    why = (f"tfrecord: {LABEL} - tfrecord_label_offset ({label_offset}) is outside [0, {num_classes}) (ImageNet's "
           "build scripts write 1..1000: offset 1; 0-based shards need tfrecord_label_offset = 0); stored label:")

    def decode(record: Any) -> tuple[Any, Any]:
        example = tf.io.parse_single_example(record, features)
        label = example[LABEL] - label_offset
        check = tf.debugging.Assert(tf.logical_and(label >= 0, label < num_classes), [why, example[LABEL]])
        with tf.control_dependencies([check]):
            label = tf.cast(label, tf.int32)
        raw = tf.io.decode_image(example[ENCODED], channels=c, expand_animations=False)
        img = tf.ensure_shape(tf.image.resize(raw, (h, w)), (h, w, c))  # bilinear, float32 still in [0, 255]
        return img / 255.0, label

    return decode


# ----------------------------------------------------------------------------------------------------------------
# python -m common.workload.tfrecord DATA_DIR: build (or check) the cached index once, e.g. on a login node
# ----------------------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m common.workload.tfrecord DATA_DIR  (index ImageNet-style train-*-of-* TFRecord shards)",
              file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        index = record_index(Path(args[0]).expanduser())
    except FormatError as e:
        print(f"tfrecord: error: {e}", file=sys.stderr)
        return 2
    print(f"{index.size} records in {len(index.paths)} shards ({time.perf_counter() - t0:.1f} s); index cached in "
          f"{cache_path(Path(args[0]).expanduser())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
