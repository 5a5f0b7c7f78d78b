"""Per-rank Chrome traces of a fit, in the manner of Horovod's Timeline (no TensorFlow).

With ``training.timeline: URI`` (``fit(timeline=URI)``) every worker records *complete*
events (``"ph": "X"``; ``ts``/``dur`` in whole µs of wall-clock time, so the ranks' files
line up and adjacent spans nest exactly; ``pid`` the rank; ``tid`` the thread by name:
the main loop and the overlap thread) and writes them to ``URI/rank-<N>.json`` at the end
of the fit, or with what it recorded when the fit fails. Open the files in ``chrome://tracing`` or https://ui.perfetto.dev.

Where the spans come from: the worker loop (:mod:`sparkdl.training.worker.loop`: ``epoch``,
``step``, ``data wait``, ``exchange``, each callback), the exchange's phases
(:class:`~sparkdl.training.exchanges.exchange.Stopwatch` laps: ``compute``, ``encode``,
``communicate``, ``decode``, ``apply``; with overlap ``hand-off``, a step's message handed
to the exchange thread, counted in ``communicate_s``) and every collective with the bytes it moved
(:class:`TracedCommunicator`). Time inside a span not covered by its children is Python
time between them.

Memory is bounded: a recorder keeps at most ``max_events`` events (default
:data:`MAX_EVENTS`, ~100 bytes each) and counts the rest as dropped (``otherData.dropped``
in the file); being complete events, a parent span ends after its children, so the last
step recorded may lack its ``step`` span.

Recording is process-wide: :func:`recording` makes a :class:`Timeline` the active one, and
:func:`span` / :func:`record` cost one global lookup when none is active.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from sparkdl.comm.communicator import Communicator

log = logging.getLogger("sparkdl.training")

#: Events a recorder keeps by default (~10 MB of JSON); later ones are counted, not kept.
MAX_EVENTS = 100_000


class Timeline:
    """A bounded recorder of complete events for one rank (thread-safe).

    ``tid`` is per thread *name* (``main`` for the main thread): the overlap's short-lived
    threads, one job at a time, share one row.
    """

    def __init__(self, rank: int, *, max_events: int = MAX_EVENTS) -> None:
        if max_events < 0:
            raise ValueError(f"max_events must be >= 0, got {max_events}")
        self.rank = int(rank)
        self.max_events = int(max_events)
        self.events: list[dict[str, Any]] = []
        self.dropped = 0
        self._threads: dict[str, int] = {}  # thread name → tid
        self._lock = threading.Lock()
        # perf_counter (monotonic, precise) shifted to wall-clock µs: ranks line up
        self._origin_us = time.time() * 1e6 - time.perf_counter() * 1e6

    def add(self, name: str, start: float, end: float, args: dict[str, Any] | None = None,
            *, cat: str = "sparkdl") -> None:
        """Record a span from ``start`` to ``end`` (``time.perf_counter()`` seconds) on the
        calling thread."""
        thread = threading.current_thread()
        name_of_thread = "main" if thread is threading.main_thread() else thread.name
        tid = self._threads.get(name_of_thread)
        if tid is None:
            with self._lock:
                tid = self._threads.setdefault(name_of_thread, len(self._threads))
        begin = round(self._origin_us + start * 1e6)
        event = {
            "name": name, "cat": cat, "ph": "X", "pid": self.rank, "tid": tid,
            "ts": begin, "dur": max(round(self._origin_us + end * 1e6) - begin, 0),
        }
        if args:
            event["args"] = args
        with self._lock:
            if len(self.events) >= self.max_events:
                self.dropped += 1
                return
            self.events.append(event)

    @contextlib.contextmanager
    def span(self, name: str, cat: str = "sparkdl", **args: Any) -> Iterator[dict[str, Any]]:
        """Record the ``with`` block; the yielded dict is the span's ``args`` (fill it in)."""
        start = time.perf_counter()
        try:
            yield args
        finally:
            self.add(name, start, time.perf_counter(), args, cat=cat)

    def trace(self) -> dict[str, Any]:
        """The Chrome trace document (JSON object format)."""
        with self._lock:
            events = list(self.events)
            threads = dict(self._threads)
            dropped = self.dropped
        meta: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": self.rank,
             "args": {"name": f"rank {self.rank}"}},
            {"name": "process_sort_index", "ph": "M", "pid": self.rank,
             "args": {"sort_index": self.rank}},
        ]
        for name, tid in threads.items():
            meta.append({"name": "thread_name", "ph": "M", "pid": self.rank, "tid": tid,
                         "args": {"name": name}})
            meta.append({"name": "thread_sort_index", "ph": "M", "pid": self.rank, "tid": tid,
                         "args": {"sort_index": 0 if name == "main" else 1 + tid}})
        return {
            "traceEvents": meta + events,
            "displayTimeUnit": "ms",
            "otherData": {"rank": self.rank, "max_events": self.max_events, "dropped": dropped},
        }

    def write(self, uri: str) -> str:
        """Write ``uri/rank-<N>.json`` atomically (any filesystem); returns its URI."""
        from sparkdl import storage

        target = storage.child(uri, f"rank-{self.rank}.json")
        fs, path = storage.resolve(target)
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        storage.write_bytes(fs, path, json.dumps(self.trace(), separators=(",", ":")).encode())
        return target


_active: Timeline | None = None


def active() -> Timeline | None:
    """The recorder of this process, if one is recording."""
    return _active


@contextlib.contextmanager
def recording(timeline: Timeline | None) -> Iterator[Timeline | None]:
    """Make ``timeline`` the process's active recorder for the block (``None``: no-op)."""
    global _active
    previous, _active = _active, timeline
    try:
        yield timeline
    finally:
        _active = previous


def record(name: str, start: float, end: float, args: dict[str, Any] | None = None,
           *, cat: str = "sparkdl") -> None:
    """:meth:`Timeline.add` on the active recorder, if any."""
    timeline = _active
    if timeline is not None:
        timeline.add(name, start, end, args, cat=cat)


def span(name: str, cat: str = "sparkdl", **args: Any) -> contextlib.AbstractContextManager[Any]:
    """:meth:`Timeline.span` on the active recorder; a no-op block when none is active."""
    timeline = _active
    if timeline is None:
        return contextlib.nullcontext(args)
    return timeline.span(name, cat, **args)


class TracedCommunicator(Communicator):
    """A communicator that records every collective on the active timeline, with its
    message size and the bytes the rank sent and received meanwhile (from the shared
    :class:`~sparkdl.comm.communicator.TrafficCounters`; at most one thread uses the
    communicator at a time). Other attributes are the wrapped communicator's."""

    def __init__(self, inner: Communicator) -> None:
        self.inner = inner
        self.rank = inner.rank
        self.world_size = inner.world_size
        self.counters = inner.counters

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @contextlib.contextmanager
    def _traced(self, name: str, **args: Any) -> Iterator[None]:
        sent0, received0 = self.counters.snapshot()
        with span(name, "comm", **args) as out:
            try:
                yield
            finally:
                sent1, received1 = self.counters.snapshot()
                out["bytes_sent"] = sent1 - sent0
                out["bytes_received"] = received1 - received0

    def allgather(self, message: bytes | memoryview) -> list[bytes]:
        with self._traced("allgather", message_bytes=memoryview(message).nbytes):
            return self.inner.allgather(message)

    def allreduce(
        self, array: np.ndarray, op: str = "sum", *, out: np.ndarray | None = None
    ) -> np.ndarray:
        with self._traced("allreduce", message_bytes=int(array.nbytes), op=op):
            return self.inner.allreduce(array, op, out=out)

    def allreduce_pieces(
        self, pieces: Sequence[np.ndarray], op: str = "sum", *, out: np.ndarray | None = None
    ) -> np.ndarray:
        nbytes = sum(int(p.nbytes) for p in pieces)
        with self._traced("allreduce", message_bytes=nbytes, op=op):
            return self.inner.allreduce_pieces(pieces, op, out=out)

    def broadcast(self, message: bytes | memoryview | None, root: int = 0) -> bytes:
        size = 0 if message is None else memoryview(message).nbytes
        with self._traced("broadcast", message_bytes=size, root=root):
            return self.inner.broadcast(message, root)

    def broadcast_into(self, array: np.ndarray, root: int = 0) -> np.ndarray:
        with self._traced("broadcast", message_bytes=int(array.nbytes), root=root):
            return self.inner.broadcast_into(array, root)

    def barrier(self) -> None:
        with self._traced("barrier"):
            self.inner.barrier()

    def close(self) -> None:
        self.inner.close()
