"""An accept loop that survives floods, shared by the ring's and the store's listeners.

Each accepted connection is handed to its own daemon thread. The loop

* backs off and keeps accepting when ``accept()`` fails for lack of resources (``EMFILE``,
  ``ENFILE``, ``ENOMEM``, ``ENOBUFS``: a flood of connections reached the open-file limit),
  instead of ending for good; the real peer is accepted once the flood stops;
* bounds the connections still in their (unauthenticated) handshake, and so their threads:
  past ``max_pending`` the oldest is dropped, so idle connections cannot starve a real peer;
* logs both, once per episode.

A handler calls :meth:`AcceptLoop.authenticated` once its peer proved the secret, which takes
the connection out of the bounded set.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("sparkdl.comm")

MAX_PENDING_HANDSHAKES = 32
"""Unauthenticated connections (each with its thread) a listener keeps at most."""
RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
_TRANSIENT = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EINTR, errno.EAGAIN})
_BACKOFF_S = (0.01, 0.5)

Handler = Callable[[socket.socket, Any], None]


def _shutdown(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)


class AcceptLoop:
    """Accept connections on ``listener`` in a daemon thread until :meth:`stop` (or
    ``deadline``, a ``time.monotonic()`` value) and run ``handle(conn, addr)`` for each in a
    thread of its own. ``what`` prefixes the log messages (``"ring"``, ``"store"``)."""

    def __init__(
        self,
        listener: socket.socket,
        handle: Handler,
        *,
        what: str,
        max_pending: int = MAX_PENDING_HANDSHAKES,
        deadline: float | None = None,
    ) -> None:
        self._listener = listener
        self._handle = handle
        self._what = what
        self._max_pending = max_pending
        self._deadline = deadline
        self._lock = threading.Lock()
        self._pending: dict[socket.socket, None] = {}  # unauthenticated, oldest first
        self._live: set[socket.socket] = set()  # connections whose handler still runs
        self._stopped = False
        self.exhausted = 0
        """``accept()`` failures for lack of resources so far."""
        self.dropped = 0
        """Unauthenticated connections dropped to stay within ``max_pending``."""
        self._thread = threading.Thread(target=self._loop, name=f"sparkdl-{what}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def authenticated(self, conn: socket.socket) -> None:
        """Take ``conn`` out of the bounded set of unauthenticated connections."""
        with self._lock:
            self._pending.pop(conn, None)

    def detach(self, conn: socket.socket) -> None:
        """Hand ``conn`` over to the caller: :meth:`stop` will no longer shut it down."""
        self._forget(conn)

    def stop(self, *, live: bool = True) -> None:
        """Stop accepting, close the listener and shut down every connection still in its
        handshake (and, with ``live``, every connection whose handler still runs)."""
        with self._lock:
            self._stopped = True
            victims = list(self._live if live else self._pending)
        for conn in victims:
            _shutdown(conn)
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._listener.close()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)

    def _loop(self) -> None:
        self._listener.settimeout(0.1)
        delay = _BACKOFF_S[0]
        while not self._stopped:
            if self._deadline is not None and time.monotonic() >= self._deadline:
                return
            try:
                conn, addr = self._listener.accept()
            except (TimeoutError, BlockingIOError, InterruptedError):
                continue
            except OSError as exc:
                if self._stopped:
                    return
                if exc.errno in RESOURCE_ERRNOS:
                    if delay == _BACKOFF_S[0]:
                        log.warning(
                            "%s: cannot accept connections (%s) with %d handshakes pending; "
                            "backing off and retrying",
                            self._what,
                            exc.strerror or exc,
                            len(self._pending),
                        )
                    self.exhausted += 1
                    time.sleep(delay)
                    delay = min(2 * delay, _BACKOFF_S[1])
                    continue
                if exc.errno in _TRANSIENT:
                    continue
                log.error("%s: accept failed (%s); no longer accepting", self._what, exc)
                return
            if delay != _BACKOFF_S[0]:
                log.warning("%s: accepting connections again", self._what)
                delay = _BACKOFF_S[0]
            self._admit(conn, addr)

    def _admit(self, conn: socket.socket, addr: Any) -> None:
        oldest = None
        with self._lock:
            if self._stopped:
                conn.close()
                return
            if len(self._pending) >= self._max_pending:
                oldest = next(iter(self._pending))
                del self._pending[oldest]
                self.dropped += 1
            self._pending[conn] = None
            self._live.add(conn)
        if oldest is not None:
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning(
                    "%s: more than %d unauthenticated connections; dropping the oldest "
                    "(%d dropped so far)",
                    self._what,
                    self._max_pending,
                    self.dropped,
                )
            _shutdown(oldest)
        try:
            threading.Thread(
                target=self._run, args=(conn, addr), name=f"sparkdl-{self._what}-conn", daemon=True
            ).start()
        except RuntimeError as exc:  # no thread can be started: treat like a full table
            log.warning("%s: cannot start a handshake thread (%s)", self._what, exc)
            self._forget(conn)
            conn.close()
            time.sleep(_BACKOFF_S[1])

    def _run(self, conn: socket.socket, addr: Any) -> None:
        try:
            self._handle(conn, addr)
        finally:
            self._forget(conn)

    def _forget(self, conn: socket.socket) -> None:
        with self._lock:
            self._pending.pop(conn, None)
            self._live.discard(conn)
