"""Stream DataSet shards (Parquet + ``_sparkdl.json``) into numpy batches for training workers.

Petastorm's role, rebuilt on current pyarrow. Each training worker gets a disjoint slice of row
groups (:func:`plan_slices`) and reads it with :class:`ShardReader`, which yields exactly
``steps_per_epoch`` batches per epoch on every worker — synchronous collectives deadlock if one
worker runs more steps than another.

Memory is bounded by a few row groups: a background thread reads one row group at a time into
a bounded queue (``prefetch`` row groups), and shuffling mixes rows within a window of
``shuffle_window`` row groups, never the whole data set.

This module runs inside training workers: pyarrow + numpy only; TensorFlow is imported lazily
by :func:`to_tf_dataset`, Spark never.
"""

from __future__ import annotations

import queue
import threading
from collections import OrderedDict, deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sparkdl.data.metadata import ShardMetadata, join, read_metadata, resolve
from sparkdl.errors import ConfigurationError, DataError

FEATURES = "features"
LABEL = "label"

_DONE = object()


@dataclass
class WorkerSlice:
    """The row groups one worker reads each epoch."""

    worker: int
    pieces: list[tuple[str, int]]  # (file path relative to the shard dir, row-group index)
    rows: int


def plan_slices(
    metadata: ShardMetadata, num_workers: int, batch_size: int
) -> tuple[list[WorkerSlice], int]:
    """Split the row groups of a shard directory into disjoint, balanced worker slices.

    Row groups are assigned greedily, largest first, to the worker holding the fewest rows
    (ties: lowest worker index), which is deterministic. Returns the slices and
    ``steps_per_epoch = min(rows of a slice) // batch_size``, the same for every worker.
    """
    if num_workers < 1:
        raise ConfigurationError(f"num_workers must be >= 1, got {num_workers}")
    if batch_size < 1:
        raise ConfigurationError(f"batch_size must be >= 1, got {batch_size}")
    pieces = [
        (f.path, i, n)
        for f in metadata.files
        for i, n in enumerate(f.row_groups)
        if n > 0
    ]
    if len(pieces) < num_workers:
        raise DataError(
            f"the shard data set has {len(pieces)} non-empty row groups, fewer than the "
            f"{num_workers} workers: every worker needs at least one; rewrite the shards with "
            f"more files (num_files >= {num_workers}) or smaller rows_per_group"
        )
    order = {path: k for k, path in enumerate(f.path for f in metadata.files)}
    # Largest first; ties in file / row-group order (sorted() is stable).
    pieces.sort(key=lambda p: -p[2])
    assigned: list[list[tuple[str, int, int]]] = [[] for _ in range(num_workers)]
    rows = [0] * num_workers
    for piece in pieces:
        w = min(range(num_workers), key=lambda k: (rows[k], k))
        assigned[w].append(piece)
        rows[w] += piece[2]
    slices = []
    for w in range(num_workers):
        own = sorted(assigned[w], key=lambda p: (order[p[0]], p[1]))
        slices.append(WorkerSlice(worker=w, pieces=[(p, i) for p, i, _ in own], rows=rows[w]))
    steps = min(rows) // batch_size
    if steps == 0:
        raise DataError(
            f"steps_per_epoch would be 0: {metadata.num_rows} rows over {num_workers} workers "
            f"gives the smallest worker {min(rows)} rows, fewer than batch_size {batch_size} "
            f"(need at least num_workers x batch_size = {num_workers * batch_size} rows, "
            f"evenly spread); use a smaller batch size or fewer workers"
        )
    return slices, steps


# ----------------------------------------------------------------------------------------------
# Arrow -> numpy conversion and validation


def _list_to_numpy(
    column: pa.ChunkedArray | pa.Array, size: int, *, name: str, source: str, first_row: int
) -> np.ndarray:
    """Convert a list<float> column to a (rows, size) float32 array without per-element Python."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    n = len(arr)
    if arr.null_count:
        bad = int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
        raise DataError(f"{source}: column {name!r} is null at row {first_row + bad}")
    if pa.types.is_fixed_size_list(arr.type):
        if arr.type.list_size != size:
            raise DataError(
                f"{source}: column {name!r} has fixed length {arr.type.list_size}, "
                f"expected {size}"
            )
        values = arr.flatten()
    else:
        offsets = arr.offsets.to_numpy()
        lengths = np.diff(offsets)
        wrong = np.flatnonzero(lengths != size)
        if wrong.size:
            r = int(wrong[0])
            raise DataError(
                f"{source}: column {name!r} row {first_row + r} has {int(lengths[r])} values, "
                f"expected {size} ({wrong.size} rows of this row group have the wrong length)"
            )
        values = arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    out = values.to_numpy(zero_copy_only=False)
    if out.dtype != np.float32:
        out = out.astype(np.float32)
    return out.reshape(n, size)


def _is_float_list(t: pa.DataType) -> bool:
    return (
        (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))
        and pa.types.is_floating(t.value_type)
    )


def _validate_schema(schema: pa.Schema, metadata: ShardMetadata, source: str) -> None:
    for name in (FEATURES, LABEL):
        if schema.get_field_index(name) < 0:
            raise DataError(
                f"{source}: missing column {name!r} (columns: {', '.join(schema.names)})"
            )
    ftype = schema.field(FEATURES).type
    if not _is_float_list(ftype):
        raise DataError(f"{source}: column 'features' must be list<float32>, got {ftype}")
    ltype = schema.field(LABEL).type
    if metadata.label_kind == "class":
        if not pa.types.is_integer(ltype):
            raise DataError(f"{source}: column 'label' must be int64 class indices, got {ltype}")
    elif not _is_float_list(ltype):
        raise DataError(
            f"{source}: column 'label' must be list<float32> for regression, got {ltype}"
        )


class _ShardFileHandle:
    """An open Parquet file, validated against the metadata when first opened."""

    def __init__(self, uri: str, path: str, metadata: ShardMetadata) -> None:
        self.source = join(uri, path)
        fs, base = resolve(uri)
        entry = next((f for f in metadata.files if f.path == path), None)
        if entry is None:
            raise DataError(f"{self.source} is not listed in the shard metadata")
        try:
            self._stream = fs.open_input_file(join(base, path))
        except (OSError, pa.ArrowException) as exc:
            raise DataError(f"cannot open shard file {self.source}: {exc}") from None
        try:
            self._file = pq.ParquetFile(self._stream)
        except (OSError, pa.ArrowException) as exc:
            self._stream.close()
            raise DataError(
                f"shard file {self.source} is not a readable Parquet file: {exc}"
            ) from None
        _validate_schema(self._file.schema_arrow, metadata, self.source)
        md = self._file.metadata
        groups = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
        if groups != entry.row_groups:
            raise DataError(
                f"{self.source}: row groups {groups} differ from the metadata "
                f"{entry.row_groups}; the file changed after the shards were written"
            )
        self.starts = np.concatenate([[0], np.cumsum(groups)]).astype(np.int64).tolist()
        self.metadata = metadata

    def read_group(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        try:
            table = self._file.read_row_group(index, columns=[FEATURES, LABEL])
        except (OSError, pa.ArrowException) as exc:
            raise DataError(
                f"cannot read row group {index} of shard file {self.source}: {exc}"
            ) from None
        return _convert(table, self.metadata, self.source, self.starts[index])

    def read_all(self) -> tuple[np.ndarray, np.ndarray]:
        try:
            table = self._file.read(columns=[FEATURES, LABEL])
        except (OSError, pa.ArrowException) as exc:
            raise DataError(f"cannot read shard file {self.source}: {exc}") from None
        return _convert(table, self.metadata, self.source, 0)

    def close(self) -> None:
        self._file.close()
        self._stream.close()


def verify_files(uri: str, metadata: ShardMetadata) -> None:
    """Check every listed file's footer against the metadata, before any data is read.

    Raises :class:`DataError` naming the file for an unreadable (corrupt) file, a missing
    column, a wrong type, row groups that differ from the metadata, or schema drift (a file
    whose ``features`` / ``label`` types differ from the first file's).
    """
    first: tuple[str, pa.DataType, pa.DataType] | None = None
    for entry in metadata.files:
        handle = _ShardFileHandle(uri, entry.path, metadata)
        try:
            schema = handle._file.schema_arrow
            types = (schema.field(FEATURES).type, schema.field(LABEL).type)
        finally:
            handle.close()
        if first is None:
            first = (handle.source, *types)
            continue
        for name, want, got in zip((FEATURES, LABEL), first[1:], types):
            if want != got:
                raise DataError(
                    f"schema drift: shard file {handle.source} has column {name!r} of type "
                    f"{got}, but {first[0]} has {want}"
                )


def _convert(
    table: pa.Table, metadata: ShardMetadata, source: str, first_row: int
) -> tuple[np.ndarray, np.ndarray]:
    x = _list_to_numpy(
        table.column(FEATURES), metadata.feature_size,
        name=FEATURES, source=source, first_row=first_row,
    )
    x = x.reshape(len(x), *metadata.feature_shape)
    label = table.column(LABEL)
    if metadata.label_kind == "class":
        if label.null_count:
            raise DataError(f"{source}: column 'label' has {label.null_count} null values")
        y = label.to_numpy().astype(np.int64, copy=False)
    else:
        y = _list_to_numpy(
            label, metadata.label_size, name=LABEL, source=source, first_row=first_row
        ).reshape(len(x), *metadata.label_shape)
    return x, y


def _empty(metadata: ShardMetadata) -> tuple[np.ndarray, np.ndarray]:
    x = np.empty((0, *metadata.feature_shape), np.float32)
    if metadata.label_kind == "class":
        return x, np.empty((0,), np.int64)
    return x, np.empty((0, *metadata.label_shape), np.float32)


# ----------------------------------------------------------------------------------------------
# The training reader


@dataclass
class ReaderStats:
    """Counters for tests and tuning."""

    row_groups_read: int = 0
    buffered_row_groups: int = 0  # read but not yet fully handed out
    peak_buffered_row_groups: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def acquire(self) -> None:
        with self.lock:
            self.row_groups_read += 1
            self.buffered_row_groups += 1
            self.peak_buffered_row_groups = max(
                self.peak_buffered_row_groups, self.buffered_row_groups
            )

    def release(self, n: int) -> None:
        with self.lock:
            self.buffered_row_groups -= n


class _Producer(threading.Thread):
    """Reads row groups in a given order into a bounded queue; stops when told to."""

    def __init__(self, reader: ShardReader, pieces: list[tuple[str, int]]) -> None:
        super().__init__(name=f"sparkdl-shard-reader-{reader.worker_slice.worker}", daemon=True)
        self.reader = reader
        self.pieces = pieces
        # Reads in flight count towards the prefetch bound (row groups held ahead of use).
        self.threads = max(1, min(reader.decode_threads, reader.prefetch))
        self.queue: queue.Queue[Any] = queue.Queue(
            maxsize=max(1, reader.prefetch - self.threads + 1)
        )
        self.stop_event = threading.Event()

    def _put(self, item: Any) -> bool:
        while not self.stop_event.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run(self) -> None:
        """Decode row groups on up to ``decode_threads`` threads (pyarrow releases the GIL
        while decoding), at most ``prefetch`` reads in flight, and queue the results in
        order."""
        in_flight: deque[Future[Any]] = deque()
        pieces = iter(self.pieces)
        threads = self.threads
        try:
            with ThreadPoolExecutor(threads, thread_name_prefix=self.name) as pool:

                def submit_next() -> None:
                    piece = next(pieces, None)
                    if piece is not None:
                        self.reader.stats.acquire()
                        in_flight.append(pool.submit(self._read, *piece))

                for _ in range(threads):
                    submit_next()
                try:
                    while in_flight:
                        chunk = in_flight[0].result()
                        in_flight.popleft()
                        if self.stop_event.is_set() or not self._put(chunk):
                            self.reader.stats.release(1)
                            return
                        submit_next()
                finally:
                    for future in in_flight:  # stopped or failed: drop what is still coming
                        future.cancel()
                    self.reader.stats.release(len(in_flight))
            self._put(_DONE)
        except BaseException as exc:  # handed to the consumer, re-raised there
            self._put(exc)

    def _read(self, path: str, index: int) -> tuple[np.ndarray, np.ndarray]:
        return self.reader._open(path).read_group(index)

    def stop(self, timeout: float = 10.0) -> None:
        self.stop_event.set()
        drained = 0
        while True:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, tuple):
                drained += 1
        self.reader.stats.release(drained)
        self.join(timeout)


class ShardReader:
    """Reads one worker's slice of a shard directory as exactly ``steps_per_epoch`` batches.

    Use as a context manager (or call :meth:`close`) so the prefetch thread stops when the
    consumer stops early. Each file's schema and row groups are checked against the metadata
    when it is opened; at most ``max_open_files`` files stay open per decoding thread.
    """

    def __init__(
        self,
        uri: str,
        metadata: ShardMetadata,
        worker_slice: WorkerSlice,
        batch_size: int,
        steps_per_epoch: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        prefetch: int = 3,
        shuffle_window: int = 2,
        read_timeout: float = 600.0,
        max_open_files: int = 16,
        decode_threads: int = 3,
    ) -> None:
        if batch_size < 1:
            raise ConfigurationError(f"batch_size must be >= 1, got {batch_size}")
        if steps_per_epoch < 1:
            raise ConfigurationError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}")
        if prefetch < 1 or shuffle_window < 1:
            raise ConfigurationError(
                f"prefetch and shuffle_window must be >= 1, got {prefetch} and {shuffle_window}"
            )
        if worker_slice.rows < steps_per_epoch * batch_size:
            raise DataError(
                f"worker {worker_slice.worker} has {worker_slice.rows} rows, fewer than "
                f"steps_per_epoch x batch_size = {steps_per_epoch} x {batch_size}"
            )
        self.uri = uri
        self.metadata = metadata
        self.worker_slice = worker_slice
        self.batch_size = batch_size
        self.steps_per_epoch = steps_per_epoch
        self.shuffle = shuffle
        self.seed = seed
        self.prefetch = prefetch
        self.shuffle_window = shuffle_window
        self.read_timeout = read_timeout
        self.max_open_files = max(1, max_open_files)
        self.decode_threads = max(1, decode_threads)
        self.stats = ReaderStats()
        # Each decoding thread has its own open files (concurrent reads of one ParquetFile
        # are not guaranteed safe); all of them are closed by close().
        self._local = threading.local()
        self._all_handles: list[OrderedDict[str, _ShardFileHandle]] = []
        self._handles_lock = threading.Lock()
        self._producer: _Producer | None = None

    def _open(self, path: str) -> _ShardFileHandle:
        handles = getattr(self._local, "handles", None)
        if handles is None:
            handles = self._local.handles = OrderedDict()
            with self._handles_lock:
                self._all_handles.append(handles)
        handle = handles.get(path)
        if handle is not None:
            handles.move_to_end(path)
            return handle
        while len(handles) >= self.max_open_files:  # least recently used first
            handles.popitem(last=False)[1].close()
        handle = handles[path] = _ShardFileHandle(self.uri, path, self.metadata)
        return handle

    def _rng(self, epoch: int) -> np.random.Generator:
        return np.random.default_rng(
            np.random.SeedSequence([self.seed, epoch, self.worker_slice.worker])
        )

    def _next(self, producer: _Producer) -> Any:
        waited = 0.0
        while True:
            try:
                return producer.queue.get(timeout=0.1)
            except queue.Empty:
                waited += 0.1
                if not producer.is_alive() and producer.queue.empty():
                    raise DataError(
                        f"shard reader thread for {self.uri} stopped without a result"
                    ) from None
                if waited >= self.read_timeout:
                    raise DataError(
                        f"no row group of {self.uri} arrived within {self.read_timeout:.0f} s"
                    ) from None

    def epoch(self, epoch: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yield exactly ``steps_per_epoch`` batches ``(features, labels)`` for ``epoch``.

        Shuffling (seeded by ``(seed, epoch, worker)``) permutes the order of row groups, then
        rows within windows of ``shuffle_window`` row groups plus the carried remainder.
        """
        self._stop_producer()
        rng = self._rng(epoch)
        pieces = list(self.worker_slice.pieces)
        if self.shuffle:
            pieces = [pieces[i] for i in rng.permutation(len(pieces))]
        producer = self._producer = _Producer(self, pieces)
        producer.start()
        bs = self.batch_size
        carry_x, carry_y = _empty(self.metadata)
        window_x: list[np.ndarray] = []
        window_y: list[np.ndarray] = []
        emitted = 0
        done = False
        try:
            while emitted < self.steps_per_epoch:
                if not done:
                    item = self._next(producer)
                    if item is _DONE:
                        done = True
                    elif isinstance(item, BaseException):
                        raise item
                    else:
                        window_x.append(item[0])
                        window_y.append(item[1])
                window = self.shuffle_window if self.shuffle else 1
                if len(window_x) < window and not done:
                    continue
                if not window_x and done:
                    raise DataError(  # cannot happen when the slice holds enough rows
                        f"worker {self.worker_slice.worker} ran out of rows after "
                        f"{emitted} of {self.steps_per_epoch} batches"
                    )
                if not self.shuffle and window_x:
                    # File order: batches are views into the row group; only a batch that
                    # straddles two row groups is copied.
                    held = len(window_x)
                    gx, gy = window_x[0], window_y[0]
                    window_x.clear()
                    window_y.clear()
                    start = 0
                    if len(carry_x):
                        start = min(bs - len(carry_x), len(gx))
                        carry_x = np.concatenate([carry_x, gx[:start]])
                        carry_y = np.concatenate([carry_y, gy[:start]])
                        if len(carry_x) == bs:
                            yield carry_x, carry_y
                            emitted += 1
                            carry_x, carry_y = gx[:0], gy[:0]
                    full = min((len(gx) - start) // bs, self.steps_per_epoch - emitted)
                    for b in range(full):
                        s0 = start + b * bs
                        yield gx[s0:s0 + bs], gy[s0:s0 + bs]
                    emitted += full
                    if not len(carry_x) or start < len(gx):
                        carry_x = gx[start + full * bs:] if len(gx) > start else carry_x
                        carry_y = gy[start + full * bs:] if len(gy) > start else carry_y
                    self.stats.release(held)
                    continue
                x = np.concatenate([carry_x, *window_x])
                y = np.concatenate([carry_y, *window_y])
                held = len(window_x)
                window_x.clear()
                window_y.clear()
                if self.shuffle:
                    perm = rng.permutation(len(x))
                    x, y = x[perm], y[perm]
                full = min(len(x) // bs, self.steps_per_epoch - emitted)
                for b in range(full):
                    yield x[b * bs:(b + 1) * bs], y[b * bs:(b + 1) * bs]
                emitted += full
                carry_x, carry_y = x[full * bs:], y[full * bs:]
                del x, y
                self.stats.release(held)
        finally:
            self.stats.release(len(window_x))
            producer.stop()
            if self._producer is producer:
                self._producer = None

    def _stop_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.stop()

    def close(self) -> None:
        """Stop the prefetch thread and close open files."""
        self._stop_producer()
        with self._handles_lock:
            for handles in self._all_handles:
                for handle in handles.values():
                    handle.close()
                handles.clear()

    def __enter__(self) -> ShardReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ----------------------------------------------------------------------------------------------
# Whole-data and evaluation readers


def read_all(
    uri: str, metadata: ShardMetadata | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Read every row of a (small) shard directory, in file order."""
    metadata = metadata or read_metadata(uri)
    parts = [_ShardFileHandle(uri, f.path, metadata) for f in metadata.files]
    try:
        arrays = [h.read_all() for h in parts]
    finally:
        for h in parts:
            h.close()
    if not arrays:
        return _empty(metadata)
    return np.concatenate([a[0] for a in arrays]), np.concatenate([a[1] for a in arrays])


def iter_batches(
    uri: str,
    files: list[str],
    batch_size: int,
    *,
    metadata: ShardMetadata | None = None,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield every row of ``files`` in order as batches of ``batch_size`` (the last may be short).

    No shuffling, no dropping: used by distributed evaluation and inference.
    """
    if batch_size < 1:
        raise ConfigurationError(f"batch_size must be >= 1, got {batch_size}")
    metadata = metadata or read_metadata(uri)
    carry_x, carry_y = _empty(metadata)
    for path in files:
        handle = _ShardFileHandle(uri, path, metadata)
        try:
            for index in range(len(handle.starts) - 1):
                gx, gy = handle.read_group(index)
                x = np.concatenate([carry_x, gx]) if len(carry_x) else gx
                y = np.concatenate([carry_y, gy]) if len(carry_y) else gy
                full = len(x) // batch_size
                for b in range(full):
                    s = slice(b * batch_size, (b + 1) * batch_size)
                    yield x[s], y[s]
                carry_x, carry_y = x[full * batch_size:], y[full * batch_size:]
        finally:
            handle.close()
    if len(carry_x):
        yield carry_x, carry_y


def to_tf_dataset(reader: ShardReader, epoch: int) -> Any:
    """A ``tf.data.Dataset`` of one epoch of ``reader`` (TensorFlow imported lazily)."""
    import tensorflow as tf

    meta = reader.metadata
    bs = reader.batch_size
    x_spec = tf.TensorSpec((bs, *meta.feature_shape), tf.float32)
    if meta.label_kind == "class":
        y_spec = tf.TensorSpec((bs,), tf.int64)
    else:
        y_spec = tf.TensorSpec((bs, *meta.label_shape), tf.float32)
    dataset = tf.data.Dataset.from_generator(
        lambda: reader.epoch(epoch), output_signature=(x_spec, y_spec)
    )
    return dataset.apply(tf.data.experimental.assert_cardinality(reader.steps_per_epoch))
