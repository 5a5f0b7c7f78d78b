"""Communication hidden behind computation: one exchange in flight on a background thread.

With ``training.overlap`` an exchange (sharing, dense) starts step t's collective on a
:class:`InFlightExchange` and computes step t+1's gradient while it travels; step t+1 then
waits for the result and applies it before its own update. At most one job is in flight, so
the communicator is used by one thread at a time: the main thread touches it only after
:meth:`InFlightExchange.wait` (the exchange's ``finish`` / ``end_epoch`` / ``get_state``
drain first, before the loop's own collectives, validation and checkpoints).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from sparkdl.errors import CommunicationError
from sparkdl.training import timeline


class InFlightExchange:
    """Runs one job at a time on a daemon thread and hands its result back.

    Args:
        timeout_s: the longest :meth:`wait` blocks. The collectives inside a job are bounded
            by the communicator's own timeout; this bound is the safety net above it (a job
            still running after it raises :class:`CommunicationError`, and the daemon thread
            cannot keep the process alive).
        name: the thread's name (shows in stack dumps).
    """

    def __init__(self, timeout_s: float, name: str = "sparkdl-overlap") -> None:
        self.timeout_s = float(timeout_s)
        self.name = name
        self._thread: threading.Thread | None = None
        self._outcome: tuple[bool, Any] | None = None
        self.busy_s = 0.0  # seconds the last finished job ran

    @property
    def in_flight(self) -> bool:
        return self._thread is not None

    def submit(self, job: Callable[[], Any]) -> None:
        """Start ``job()`` in the background; one job at a time (wait for the last first)."""
        if self._thread is not None:
            raise RuntimeError("an exchange is already in flight: wait() for it first")

        def run() -> None:
            started = time.perf_counter()
            try:
                self._outcome = (True, job())
            except BaseException as exc:  # handed to the waiting thread
                self._outcome = (False, exc)
            finished = time.perf_counter()
            self.busy_s = finished - started
            timeline.record("overlapped exchange", started, finished)

        self._outcome = None
        self._thread = threading.Thread(target=run, name=self.name, daemon=True)
        self._thread.start()

    def wait(self) -> Any:
        """The in-flight job's result (``None`` when none is in flight); re-raises its error."""
        thread = self._thread
        if thread is None:
            return None
        thread.join(self.timeout_s)
        if thread.is_alive():
            raise CommunicationError(
                f"the overlapped exchange did not finish within {self.timeout_s:.1f} s"
            )
        self._thread = None
        ok, value = self._outcome if self._outcome is not None else (False, None)
        self._outcome = None
        if not ok:
            if isinstance(value, BaseException):
                raise value
            raise CommunicationError("the overlapped exchange ended without a result")
        return value


def overlap_timeout(comm: Any) -> float:
    """The bound on waiting for an overlapped job: twice the communicator's own timeout
    (a job holds at most a couple of collectives, each bounded by it) plus slack."""
    return 2.0 * float(getattr(comm, "timeout_s", 120.0)) + 10.0
