"""Stream DataSet shards (Parquet + ``_sparkdl.json``) into numpy batches for training workers.

Petastorm's role, rebuilt on current pyarrow. Each training worker gets a disjoint slice of row
groups (:func:`plan_slices`) and reads it with :class:`ShardReader`, which yields exactly
``steps_per_epoch`` batches per epoch on every worker — synchronous collectives deadlock if one
worker runs more steps than another.

Memory is bounded by a few row groups: up to ``prefetch`` row groups are decoded ahead, on a
few threads (pyarrow releases the GIL while decoding), and shuffling mixes rows within a
window of ``shuffle_window`` row groups, never the whole data set.

This module runs inside training workers: pyarrow + numpy only; TensorFlow is imported lazily
by :func:`to_tf_dataset`, Spark never.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sparkdl.data.files import (
    ShardFileHandle,
    empty_arrays,
    listed_file,
    read_metadata,
)
from sparkdl.data.metadata import ShardMetadata, join
from sparkdl.errors import ConfigurationError, DataError


@dataclass
class WorkerSlice:
    """The row groups one worker reads each epoch."""

    worker: int
    pieces: list[tuple[str, int]]  # (file path relative to the shard dir, row-group index)
    rows: int


#: ``fit(shuffle=...)``: a new seeded assignment of row groups to workers every epoch plus
#: the in-worker shuffle (``global``), the in-worker shuffle of a fixed assignment
#: (``window``: row-group order and rows within a window of row groups), or file order.
SHUFFLE_MODES = ("global", "window", "none")


def shuffle_mode(shuffle: bool | str) -> str:
    """Keras's boolean ``shuffle`` (True: ``global``, False: ``none``) or a mode's name."""
    if shuffle is True or shuffle is False:
        return "global" if shuffle else "none"
    if shuffle not in SHUFFLE_MODES:
        raise ConfigurationError(
            f"shuffle must be True, False or one of {', '.join(SHUFFLE_MODES)}, got {shuffle!r}"
        )
    return str(shuffle)


def plan_slices(
    metadata: ShardMetadata, num_workers: int, batch_size: int, *,
    seed: int | None = None, epoch: int = 0,
) -> tuple[list[WorkerSlice], int]:
    """Split the row groups of a shard directory into disjoint, balanced worker slices.

    Row groups are assigned greedily, largest first, to the worker holding the fewest rows
    (ties: lowest worker index), which is deterministic. Returns the slices and
    ``steps_per_epoch = min(rows of a slice) // batch_size``, the same for every worker.

    With ``seed``, row groups of the same size are taken in an order drawn from
    ``(seed, epoch)`` instead of file order (``shuffle="global"``: every epoch's plan): the
    sequence of sizes is the same, so every worker gets exactly the rows (and steps) of the
    unseeded plan, from other row groups.
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
    if seed is not None:
        rng = np.random.default_rng(np.random.SeedSequence([seed, epoch, 0x5EED]))
        pieces = [pieces[i] for i in rng.permutation(len(pieces))]
    # Largest first; ties in file / row-group order, or the drawn order (sorted() is stable).
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


def global_shuffle(metadata: ShardMetadata, num_workers: int, batch_size: int, worker: int,
                   seed: int) -> Callable[[int], WorkerSlice]:
    """``epoch -> worker``'s slice of that epoch's seeded plan (``shuffle="global"``)."""
    def slice_of(epoch: int) -> WorkerSlice:
        return plan_slices(metadata, num_workers, batch_size, seed=seed, epoch=epoch)[0][worker]

    return slice_of


def rows_dropped_per_epoch(metadata: ShardMetadata, num_workers: int, batch_size: int,
                           steps_per_epoch: int) -> int:
    """Rows no worker reads in an epoch: every worker stops after ``steps_per_epoch`` full
    batches of its slice (equal steps keep the collectives in step). The same every epoch,
    whatever the shuffle: each epoch's plan gives every worker the same number of rows."""
    return metadata.num_rows - num_workers * steps_per_epoch * batch_size


# ----------------------------------------------------------------------------------------------
# Reading row groups ahead, on a few threads


@dataclass
class ReaderStats:
    """Counters for tests and tuning (row groups, not bytes)."""

    row_groups_read: int = 0
    buffered_row_groups: int = 0  # being read, or read but not yet fully handed out
    peak_buffered_row_groups: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def acquire(self) -> None:
        with self.lock:
            self.row_groups_read += 1
            self.buffered_row_groups += 1
            self.peak_buffered_row_groups = max(
                self.peak_buffered_row_groups, self.buffered_row_groups
            )

    def release(self, n: int = 1) -> None:
        with self.lock:
            self.buffered_row_groups -= n


class _RowGroupFetcher:
    """Decodes ``(file, row group)`` pieces on up to ``threads`` threads, in order.

    At most ``ahead`` row groups are being read or waiting to be consumed; pyarrow releases
    the GIL while it decodes, so the threads overlap with each other and with training. The
    consumer waits on each piece directly (no hand-over thread), at most ``timeout`` seconds.
    Each thread keeps its own open files (concurrent reads of one ``ParquetFile`` are not
    documented as safe), at most ``max_open_files`` of them, least recently used closed first.
    """

    def __init__(
        self,
        uri: str,
        metadata: ShardMetadata,
        stats: ReaderStats,
        *,
        threads: int,
        ahead: int,
        timeout: float,
        max_open_files: int,
        name: str,
    ) -> None:
        self.uri = uri
        self.metadata = metadata
        self.stats = stats
        self.threads = max(1, min(threads, ahead))
        self.ahead = max(1, ahead)
        self.timeout = timeout
        self.max_open_files = max(1, max_open_files)
        self.name = name
        self._pool: ThreadPoolExecutor | None = None
        self._local = threading.local()
        self._handles: list[OrderedDict[str, ShardFileHandle]] = []
        self._handles_lock = threading.Lock()

    def _open(self, path: str) -> ShardFileHandle:
        handles = getattr(self._local, "handles", None)
        if handles is None:
            handles = self._local.handles = OrderedDict()
            with self._handles_lock:
                self._handles.append(handles)
        handle = handles.get(path)
        if handle is not None:
            handles.move_to_end(path)
            return handle
        while len(handles) >= self.max_open_files:
            handles.popitem(last=False)[1].close()
        handle = handles[path] = ShardFileHandle(self.uri, path, self.metadata)
        return handle

    def _read(self, path: str, index: int) -> tuple[np.ndarray, ...]:
        return self._open(path).read_group(index)

    def fetch(self, pieces: list[tuple[str, int]]) -> Iterator[tuple[np.ndarray, ...]]:
        """Yield the decoded pieces in order. Each yielded row group stays counted in
        ``stats.buffered_row_groups`` until the consumer calls ``stats.release()``."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix=self.name)
        pool = self._pool
        todo = iter(pieces)
        in_flight: deque[tuple[Future[Any], str, int]] = deque()

        def submit_next() -> None:
            piece = next(todo, None)
            if piece is not None:
                self.stats.acquire()
                in_flight.append((pool.submit(self._read, *piece), *piece))

        try:
            for _ in range(self.ahead):
                submit_next()
            while in_flight:
                future, path, index = in_flight[0]
                try:
                    chunk = future.result(timeout=self.timeout)
                except FutureTimeout:
                    raise DataError(
                        f"row group {index} of {join(self.uri, path)} was not read within "
                        f"{self.timeout:.0f} s"
                    ) from None
                in_flight.popleft()
                submit_next()
                yield chunk
        finally:  # finished, failed or stopped early: drop what is still coming
            for future, _, _ in in_flight:
                future.cancel()
            self.stats.release(len(in_flight))

    def close(self, timeout: float = 10.0) -> None:
        """Stop the threads (a read in progress is waited for, at most ``timeout`` s) and
        close the open files."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
            deadline = time.monotonic() + timeout
            for thread in list(getattr(pool, "_threads", ())):
                thread.join(max(0.0, deadline - time.monotonic()))
        with self._handles_lock:
            for handles in self._handles:
                for handle in handles.values():
                    handle.close()
                handles.clear()
            self._handles.clear()
        self._local = threading.local()


# ----------------------------------------------------------------------------------------------
# Row groups -> batches


Columns = tuple[np.ndarray, ...]  # a row group's or a batch's arrays: x, y[, sample weight]


def _batches_in_order(
    chunks: Iterator[Columns],
    batch_size: int,
    stats: ReaderStats,
    *,
    last_partial: bool,
) -> Iterator[Columns]:
    """Cut row groups (tuples of column arrays) into batches in file order.

    Batches inside one row group are views; only a batch straddling row groups is copied (and
    the tail of a row group is copied, so a consumed row group is never kept alive by it).
    """
    parts: list[list[np.ndarray]] = []
    held = 0
    for group in chunks:
        try:
            rows = len(group[0])
            if not parts:
                parts = [[] for _ in group]
            start = 0
            if held:
                start = min(batch_size - held, rows)
                for part, column in zip(parts, group):
                    part.append(column[:start])
                held += start
                if held == batch_size:
                    batch = tuple(np.concatenate(part) for part in parts)
                    parts, held = [[] for _ in group], 0
                    yield batch
            full = (rows - start) // batch_size
            for b in range(full):
                s = start + b * batch_size
                yield tuple(column[s:s + batch_size] for column in group)
            rest = start + full * batch_size
            if rest < rows:
                for part, column in zip(parts, group):
                    part.append(column[rest:].copy())
                held += rows - rest
        finally:  # also when the consumer stops inside this row group
            del group
            stats.release()
    if last_partial and held:
        yield tuple(np.concatenate(part) for part in parts)


def _batches_shuffled(
    chunks: Iterator[Columns],
    batch_size: int,
    stats: ReaderStats,
    *,
    window: int,
    rng: np.random.Generator,
    empty: Columns,
) -> Iterator[Columns]:
    """Shuffle rows within windows of ``window`` row groups plus the rows carried over from
    the previous window, and cut the result into full batches (the last remainder is dropped).

    Each window is gathered into its shuffled order with one copy (a scatter per row group).
    """
    carry = empty
    groups: list[Columns] = []
    chunks = iter(chunks)
    exhausted = False
    try:
        while not exhausted:
            for group in chunks:
                groups.append(group)
                if len(groups) == window:
                    break
            else:
                exhausted = True
            if not groups:
                break
            shuffled = _scatter_shuffled([carry, *groups], rng)
            stats.release(len(groups))
            groups.clear()
            full = len(shuffled[0]) // batch_size
            for b in range(full):
                s = slice(b * batch_size, (b + 1) * batch_size)
                yield tuple(column[s] for column in shuffled)
            carry = tuple(column[full * batch_size:].copy() for column in shuffled)
            del shuffled
    finally:  # the consumer stopped while row groups were still gathered
        stats.release(len(groups))


def _scatter_shuffled(groups: list[Columns], rng: np.random.Generator) -> Columns:
    """``concatenate(groups)[rng.permutation(n)]`` per column, with one copy instead of two."""
    n = sum(len(g[0]) for g in groups)
    perm = rng.permutation(n)
    where = np.empty_like(perm)
    where[perm] = np.arange(n)  # row i of the concatenation goes to position where[i]
    out = tuple(np.empty((n, *column.shape[1:]), column.dtype) for column in groups[0])
    offset = 0
    for group in groups:
        dest = where[offset:offset + len(group[0])]
        for target, column in zip(out, group):
            target[dest] = column
        offset += len(group[0])
    return out


# ----------------------------------------------------------------------------------------------
# The training reader


class ShardReader:
    """Reads one worker's slice of a shard directory as exactly ``steps_per_epoch`` batches.

    ``epoch_slices(epoch)``, when given, is the slice of each epoch (``shuffle="global"``,
    :func:`global_shuffle`; as many rows as ``worker_slice``), else ``worker_slice`` always.

    Row groups are decoded ahead on up to ``decode_threads`` threads, at most ``prefetch`` of
    them at a time. Use as a context manager (or call :meth:`close`) to stop the threads and
    close the files. Each file's schema and row groups are checked against the metadata when
    it is first opened.
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
        prefetch: int = 4,
        shuffle_window: int = 2,
        read_timeout: float = 600.0,
        max_open_files: int = 16,
        decode_threads: int = 2,
        epoch_slices: Callable[[int], WorkerSlice] | None = None,
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
        self.shuffle_window = shuffle_window
        self.epoch_slices = epoch_slices
        self.stats = ReaderStats()
        self._fetcher = _RowGroupFetcher(
            uri, metadata, self.stats, threads=decode_threads, ahead=prefetch,
            timeout=read_timeout, max_open_files=max_open_files,
            name=f"sparkdl-shard-reader-{worker_slice.worker}",
        )
        self._active: Generator[tuple[Any, ...], None, None] | None = None

    def _rng(self, epoch: int) -> np.random.Generator:
        return np.random.default_rng(
            np.random.SeedSequence([self.seed, epoch, self.worker_slice.worker])
        )

    def epoch(self, epoch: int) -> Iterator[tuple[Any, ...]]:
        """Yield exactly ``steps_per_epoch`` batches ``(features, labels)`` for ``epoch``
        (``(features, labels, sample_weight)`` from weighted shards).

        Shuffling (seeded by ``(seed, epoch, worker)``) permutes the order of row groups, then
        rows within windows of ``shuffle_window`` row groups plus the carried remainder.
        Starting an epoch stops the previous one if it is still being read.
        """
        self._stop_epoch()
        self._active = self._epoch(epoch)
        return self._active

    def _stop_epoch(self) -> None:
        active, self._active = self._active, None
        if active is not None:
            active.close()

    def _epoch(self, epoch: int) -> Generator[tuple[Any, ...], None, None]:
        rng = self._rng(epoch)
        own = self.epoch_slices(epoch) if self.epoch_slices else self.worker_slice
        pieces = list(own.pieces)
        if self.shuffle:
            pieces = [pieces[i] for i in rng.permutation(len(pieces))]
        chunks = self._fetcher.fetch(pieces)
        if self.shuffle:
            batches = _batches_shuffled(
                chunks, self.batch_size, self.stats, window=self.shuffle_window, rng=rng,
                empty=empty_arrays(self.metadata),
            )
        else:
            batches = _batches_in_order(chunks, self.batch_size, self.stats, last_partial=False)
        emitted = 0
        try:
            for batch in batches:
                yield self.metadata.unpack(*batch)
                emitted += 1
                if emitted == self.steps_per_epoch:
                    return
            raise DataError(  # cannot happen when the slice holds enough rows
                f"worker {self.worker_slice.worker} ran out of rows after "
                f"{emitted} of {self.steps_per_epoch} batches"
            )
        finally:
            batches.close()
            chunks.close()

    def close(self) -> None:
        """Stop the epoch being read and the decoding threads; close open files."""
        self._stop_epoch()
        self._fetcher.close()

    def __enter__(self) -> ShardReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ----------------------------------------------------------------------------------------------
# Whole-data and evaluation readers


def read_all(
    uri: str, metadata: ShardMetadata | None = None
) -> tuple[Any, ...]:
    """Read every row of a (small) shard directory, in file order: ``(x, y)``, plus the
    sample weights of weighted shards."""
    metadata = metadata or read_metadata(uri)
    parts = [ShardFileHandle(uri, f.path, metadata) for f in metadata.files]
    try:
        arrays = [h.read_all() for h in parts]
    finally:
        for h in parts:
            h.close()
    if not arrays:
        return metadata.unpack(*empty_arrays(metadata))
    return metadata.unpack(*(np.concatenate(column) for column in zip(*arrays)))


def batch_rows(part: Any) -> int:
    """The rows of one part of a batch (its features or labels): an array, or a dict of
    arrays by input or output name (multi shards)."""
    return len(next(iter(part.values()))) if isinstance(part, dict) else len(part)


def iter_batches(
    uri: str,
    files: list[str],
    batch_size: int,
    *,
    metadata: ShardMetadata | None = None,
    prefetch: int = 4,
    decode_threads: int = 2,
    read_timeout: float = 600.0,
) -> Iterator[tuple[Any, ...]]:
    """Yield every row of ``files`` in order as batches of ``batch_size`` (the last may be short):
    ``(x, y)``, plus the sample weights of weighted shards.

    No shuffling, no dropping: used by distributed evaluation and inference. Row groups are
    decoded ahead as in :class:`ShardReader`.
    """
    if batch_size < 1:
        raise ConfigurationError(f"batch_size must be >= 1, got {batch_size}")
    metadata = metadata or read_metadata(uri, verify=False)  # each file is checked on open
    pieces = [
        (path, i)
        for path in files
        for i in range(len(listed_file(uri, metadata, path).row_groups))
    ]
    stats = ReaderStats()
    fetcher = _RowGroupFetcher(
        uri, metadata, stats, threads=decode_threads, ahead=prefetch, timeout=read_timeout,
        max_open_files=4, name="sparkdl-batch-reader",
    )
    chunks = fetcher.fetch(pieces)
    try:
        for batch in _batches_in_order(chunks, batch_size, stats, last_partial=True):
            yield metadata.unpack(*batch)
    finally:
        chunks.close()
        fetcher.close()


def to_tf_dataset(reader: ShardReader, epoch: int) -> Any:
    """A ``tf.data.Dataset`` of one epoch of ``reader`` (TensorFlow imported lazily)."""
    import tensorflow as tf

    meta = reader.metadata
    bs = reader.batch_size
    if meta.multi:
        x_spec, y_spec = ({t.name: _tensor_spec(tf, bs, t.kind, t.shape) for t in specs}
                          for specs in (meta.inputs, meta.outputs))
        return tf.data.Dataset.from_generator(
            lambda: reader.epoch(epoch), output_signature=(x_spec, y_spec)
        ).apply(tf.data.experimental.assert_cardinality(reader.steps_per_epoch))
    x_spec = tf.TensorSpec((bs, *meta.feature_shape), tf.float32)
    if meta.label_kind == "class":
        y_spec = tf.TensorSpec((bs,), tf.int64)
    else:
        y_spec = tf.TensorSpec((bs, *meta.label_shape), tf.float32)
    signature = (x_spec, y_spec)
    if meta.weight_column is not None:  # Keras's (x, y, sample_weight)
        signature = (x_spec, y_spec, tf.TensorSpec((bs,), tf.float32))
    dataset = tf.data.Dataset.from_generator(
        lambda: reader.epoch(epoch), output_signature=signature
    )
    return dataset.apply(tf.data.experimental.assert_cardinality(reader.steps_per_epoch))


def _tensor_spec(tf: Any, batch_size: int, kind: str, shape: list[int]) -> Any:
    if kind == "class":
        return tf.TensorSpec((batch_size,), tf.int64)
    return tf.TensorSpec((batch_size, *shape), tf.float32)
