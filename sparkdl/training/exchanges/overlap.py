"""Communication hidden behind computation: one exchange in flight on a background thread.

With ``training.overlap`` an exchange (sharing, dense) starts step t's collective on a
:class:`InFlightExchange` and computes step t+1's gradient while it travels; step t+1 then
waits for the result and applies it before its own update. At most one job is in flight, so
the communicator is used by one thread at a time: the main thread touches it only after
:meth:`InFlightExchange.wait` (the exchange's ``finish`` / ``end_epoch`` / ``get_state``
drain first, before the loop's own collectives, validation and checkpoints).

One persistent daemon thread per exchange runs the jobs (no thread is started per step): it
takes a job from a one-slot queue, runs it, and hands the outcome back on another. Every
wait is bounded: the main thread's by ``timeout_s``, the worker's idle wait by
``idle_s`` (after which it exits; the next :meth:`~InFlightExchange.submit` starts a new
one). :meth:`~InFlightExchange.close` stops it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from sparkdl.errors import CommunicationError
from sparkdl.training.worker import timeline

_STOP = object()  # the worker's sentinel: exit now


class InFlightExchange:
    """Runs one job at a time on a persistent daemon thread and hands its result back.

    Args:
        timeout_s: the longest :meth:`wait` blocks. The collectives inside a job are bounded
            by the communicator's own timeout; this bound is the safety net above it (a job
            still running after it raises :class:`CommunicationError` and leaves this object
            broken: the job may still hold the communicator).
        name: the thread's name (shows in stack dumps and as the timeline's row).
        idle_s: how long the worker waits for the next job before it exits.
    """

    def __init__(self, timeout_s: float, name: str = "sparkdl-overlap",
                 idle_s: float = 60.0) -> None:
        self.timeout_s = float(timeout_s)
        self.name = name
        self.idle_s = float(idle_s)
        self.busy_s = 0.0  # seconds the last finished job ran
        self._jobs: queue.Queue[Any] = queue.Queue(maxsize=1)
        self._outcomes: queue.Queue[tuple[bool, Any]] = queue.Queue(maxsize=1)
        self._thread: threading.Thread | None = None
        self._pending = False  # a job was submitted and its outcome not taken yet
        self._broken: str | None = None
        self._closed = False
        self._lock = threading.Lock()  # guards starting and retiring the worker

    @property
    def in_flight(self) -> bool:
        return self._pending

    def submit(self, job: Callable[[], Any]) -> None:
        """Start ``job()`` in the background; one job at a time (wait for the last first)."""
        if self._closed:
            raise RuntimeError("the overlapped exchange is closed")
        if self._broken is not None:
            raise CommunicationError(self._broken)
        if self._pending:
            raise RuntimeError("an exchange is already in flight: wait() for it first")
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name=self.name, daemon=True)
                self._thread.start()
            # under the lock: an idle worker cannot exit between this check and the put
            self._jobs.put_nowait(job)
        self._pending = True

    def wait(self) -> Any:
        """The in-flight job's result (``None`` when none is in flight); re-raises its error."""
        if not self._pending:
            return None
        try:
            ok, value = self._outcomes.get(timeout=self.timeout_s)
        except queue.Empty:
            self._broken = (
                f"the overlapped exchange did not finish within {self.timeout_s:.1f} s"
            )
            raise CommunicationError(self._broken) from None
        self._pending = False
        if not ok:
            raise value
        return value

    def close(self) -> None:
        """Stop the worker (after the job in flight, if any, within ``timeout_s``); the
        outcome of a job not waited for is dropped. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            thread = self._thread
            if thread is None or not thread.is_alive():
                return
            try:
                self._jobs.put(_STOP, timeout=self.timeout_s)
            except queue.Full:
                return  # the worker is stuck in a job: it is a daemon, it cannot hold the exit
        thread.join(self.timeout_s)

    def _work(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    if self._jobs.empty():  # submit puts under the lock: none can be lost
                        self._thread = None
                        return
                continue
            if job is _STOP:
                return
            started, cpu = time.perf_counter(), time.thread_time()
            try:
                outcome: tuple[bool, Any] = (True, job())
            except BaseException as exc:  # handed to the waiting thread
                outcome = (False, exc)
            finished = time.perf_counter()
            self.busy_s = finished - started
            # the thread's CPU time in the job: what it took from the cores (the rest of the
            # span it waited on sockets, the GIL released)
            timeline.record("overlapped exchange", started, finished,
                            {"cpu_us": round((time.thread_time() - cpu) * 1e6)})
            self._outcomes.put_nowait(outcome)  # the slot is free: wait() took the last


def overlap_timeout(comm: Any) -> float:
    """The bound on waiting for an overlapped job: twice the communicator's own timeout
    (a job holds at most a couple of collectives, each bounded by it) plus slack."""
    return 2.0 * float(getattr(comm, "timeout_s", 120.0)) + 10.0
