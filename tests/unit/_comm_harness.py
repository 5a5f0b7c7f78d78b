"""Run a function on N real processes that rendezvous through a TcpStoreServer."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any

from sparkdl.comm.rendezvous import TcpStoreServer, store_exchange

SECRET = b"0123456789abcdef-test-secret"
# Ranks are forked by a fork server: a fresh interpreter that has imported pytest, numpy and
# sparkdl.comm alone (the list below). Forking the pytest process itself is unsafe once
# TensorFlow, gRPC or the JVM gateway have started their threads: a child forked while one of
# them holds an abseil mutex aborts on its first use of it ("Check w->waitp->cond == nullptr
# failed").
# Each child runs the parent's main script again (pytest's, which imports pytest): preloading
# pytest keeps that cheap ("__main__" in the list would not: Python 3.11 never passes the
# server the main script's path).
_CTX = mp.get_context("forkserver")
_CTX.set_forkserver_preload(["pytest", "numpy", "sparkdl.comm", "_comm_harness"])


def new_event() -> Any:
    """An event the harness's rank processes can set (pass it in ``args``)."""
    return _CTX.Event()


def _adopt_environment(environment: dict[str, str]) -> None:
    """Give a rank the test's environment as it is now (the fork server's is its start's)."""
    os.environ.clear()
    os.environ.update(environment)


@dataclass
class Outcome:
    rank: int
    value: Any = None
    error_type: str | None = None
    error: str | None = None
    finished_at: float | None = None  # time.time() when the function returned or raised

    @property
    def ok(self) -> bool:
        return self.error_type is None


def _child(
    fn: Callable[..., Any],
    rank: int,
    world: int,
    address: str,
    conn: Any,
    store_timeout: float,
    args: tuple[Any, ...],
    environment: dict[str, str],
) -> None:
    _adopt_environment(environment)
    exchange = store_exchange(address, rank, world, secret=SECRET, timeout_s=store_timeout)
    try:
        value = fn(rank, world, exchange, *args)
        conn.send(("ok", value, None, time.time()))
    except BaseException as exc:  # report everything to the parent
        conn.send(("err", type(exc).__name__, f"{exc}\n{traceback.format_exc()}", time.time()))
    finally:
        conn.close()


class RankGroup:
    """``world_size`` processes (forked by the fork server) each running
    ``fn(rank, world_size, exchange, *args)``."""

    def __init__(
        self,
        fn: Callable[..., Any],
        world_size: int,
        *,
        args: tuple[Any, ...] = (),
        store_timeout: float = 20.0,
    ) -> None:
        self.world_size = world_size
        self.server = TcpStoreServer(SECRET, start=False)
        self.procs: list[Any] = []
        self.pipes: list[Any] = []
        for rank in range(world_size):
            recv_end, send_end = _CTX.Pipe(duplex=False)
            proc = _CTX.Process(
                target=_child,
                args=(fn, rank, world_size, self.server.address, send_end, store_timeout, args,
                      dict(os.environ)),
                daemon=True,
            )
            proc.start()
            send_end.close()
            self.procs.append(proc)
            self.pipes.append(recv_end)
        self.server.start()

    def results(self, timeout: float = 30.0, ranks: list[int] | None = None) -> list[Outcome]:
        """Wait for ``ranks`` (default all); raise AssertionError past ``timeout`` seconds."""
        wanted = list(range(self.world_size)) if ranks is None else ranks
        outcomes: dict[int, Outcome] = {}
        deadline = time.monotonic() + timeout
        pending = {self.pipes[r]: r for r in wanted}
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                raise AssertionError(
                    f"ranks {sorted(pending.values())} did not finish within {timeout} s"
                )
            for conn in wait(list(pending), timeout=remaining):
                rank = pending.pop(conn)
                try:
                    kind, a, b, at = conn.recv()
                except EOFError:
                    outcomes[rank] = Outcome(rank, error_type="EOFError", error="process died")
                    continue
                if kind == "ok":
                    outcomes[rank] = Outcome(rank, value=a, finished_at=at)
                else:
                    outcomes[rank] = Outcome(rank, error_type=a, error=b, finished_at=at)
        return [outcomes[r] for r in wanted]

    def signal(self, rank: int, sig: int) -> None:
        os.kill(self.procs[rank].pid, sig)

    def kill(self) -> None:
        for proc in self.procs:
            if proc.is_alive():
                try:
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.kill()
                except OSError:
                    pass
        for proc in self.procs:
            proc.join(timeout=5)
        self.server.close()

    def __enter__(self) -> RankGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def _child_body_quiet(fn: Callable[..., Any], args: tuple[Any, ...],
                      environment: dict[str, str]) -> None:
    _adopt_environment(environment)
    fn(*args)


def start_process(fn: Callable[..., Any], *args: Any) -> Any:
    """Start ``fn(*args)`` in a daemon process forked by the fork server; the caller joins it."""
    proc = _CTX.Process(target=_child_body_quiet, args=(fn, args, dict(os.environ)), daemon=True)
    proc.start()
    return proc


def run_ranks(
    fn: Callable[..., Any], world_size: int, *, args: tuple[Any, ...] = (), timeout: float = 30.0
) -> list[Outcome]:
    """Run ``fn`` on every rank and return the outcomes in rank order."""
    with RankGroup(fn, world_size, args=args) as group:
        return group.results(timeout)


def values(outcomes: list[Outcome]) -> list[Any]:
    """Values of successful outcomes; fails with every rank's error otherwise."""
    errors = [f"rank {o.rank}: {o.error_type}: {o.error}" for o in outcomes if not o.ok]
    assert not errors, "\n".join(errors)
    return [o.value for o in outcomes]


def _on_allgather_transport(rank: int, world: int, exchange: Any,
                            fn: Callable[[int, Any], Any]) -> Any:
    from sparkdl.comm import AllGatherCommunicator

    comm = AllGatherCommunicator(rank, world, exchange, timeout_s=15)
    try:
        return fn(rank, comm)
    finally:
        comm.close()


def check_cases(results: list[list[tuple[str, bool, str]]], differs: str) -> None:
    """Assert every rank's ``(case, ok, bits)`` passed (else name the rank, the case and what
    ``differs``) and that every rank saw the same bits."""
    for rank, cases in enumerate(results):
        for case, ok, _ in cases:
            assert ok, f"rank {rank} {case}: {differs}"
    assert all(r == results[0] for r in results)  # the same bits on every rank


def run_allgather_transport(fn: Callable[[int, Any], Any], world: int, *,
                            timeout: float = 60.0) -> list[Any]:
    """Run ``fn(rank, comm)`` on ``world`` processes joined by the allgather transport
    (:class:`~sparkdl.comm.AllGatherCommunicator`); returns the values by rank."""
    return values(run_ranks(_on_allgather_transport, world, args=(fn,), timeout=timeout))


def allreduce_until_error(
    rank: int, world: int, exchange: Any, timeout_s: float, length: int, ready: Any
) -> tuple[str, float]:
    """Rank body: join a ring, allreduce until a peer fails; return the error and its time.

    ``ready`` is set once the first allreduce has completed, so a test can then hurt a rank.
    """
    import numpy as np

    from sparkdl.comm.tcp import connect_ring
    from sparkdl.errors import CommunicationError

    comm = connect_ring(rank, world, exchange, secret=SECRET, timeout_s=timeout_s)
    x = np.ones(length, np.float32)
    comm.allreduce(x)
    ready.set()
    try:
        while True:
            comm.allreduce(x)
    except CommunicationError as exc:
        comm.close()
        return str(exc), time.time()


def _child_body(fn: Callable[..., Any], args: tuple[Any, ...], conn: Any,
                environment: dict[str, str]) -> None:
    _adopt_environment(environment)
    try:
        conn.send(("ok", fn(*args)))
    except BaseException as exc:
        conn.send(("err", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def run_in_child(fn: Callable[..., Any], *args: Any, timeout: float = 30.0) -> Any:
    """Run ``fn(*args)`` in a child process (forked by the fork server); return its value or
    raise AssertionError with its error (the child is killed past ``timeout`` seconds)."""
    recv_end, send_end = _CTX.Pipe(duplex=False)
    proc = _CTX.Process(target=_child_body, args=(fn, args, send_end, dict(os.environ)),
                        daemon=True)
    proc.start()
    send_end.close()
    try:
        if not recv_end.poll(timeout):
            raise AssertionError(f"child did not finish within {timeout} s")
        kind, value = recv_end.recv()
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(timeout=5)
    if kind != "ok":
        raise AssertionError(value)
    return value


class FakeRank1:
    """Rank 1 of a two-rank ring played with raw sockets and the real secret: the real rank 0
    (built with ``connect_ring(0, 2, fake.exchange, ...)``) talks to it like to a peer, and a
    test writes any bytes it likes on ``to_real`` (the stream rank 0 receives from)."""

    def __init__(self, timeout_s: float = 10.0) -> None:
        import socket
        import threading

        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._real: str | None = None
        self._got_address = threading.Event()
        self.ready = threading.Event()
        self.to_real: Any = None  # fake -> rank 0 (rank 0's previous rank)
        self.from_real: Any = None  # rank 0 -> fake (rank 0's next rank)
        self.error: BaseException | None = None
        self._deadline = time.monotonic() + timeout_s
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def exchange(self, value: str) -> list[str]:
        self._real = value
        self._got_address.set()
        return [value, self.address]

    def _run(self) -> None:
        import socket

        from sparkdl.comm import _auth, _shm
        from sparkdl.comm.tcp.frames import _RING_CTX

        try:
            if not self._got_address.wait(max(0.0, self._deadline - time.monotonic())):
                raise TimeoutError("rank 0 never published its address")
            host, _, port = str(self._real).rpartition(":")
            sock = socket.create_connection((host, int(port)), timeout=5)
            _auth.authenticate_connector(sock, SECRET, _RING_CTX + b"0", 1, 2, self._deadline)
            _shm.negotiate_connector(sock, False, 1, 4096, self._deadline)
            self._listener.settimeout(max(0.1, self._deadline - time.monotonic()))
            conn, _ = self._listener.accept()
            _auth.authenticate_acceptor(conn, SECRET, _RING_CTX + b"1", self._deadline)
            _shm.negotiate_acceptor(conn, False, 1, 4096, self._deadline)
            sock.settimeout(None)
            conn.settimeout(5)
            self.to_real, self.from_real = sock, conn
        except BaseException as exc:
            self.error = exc
        finally:
            self._listener.close()
            self.ready.set()

    def wait(self) -> None:
        assert self.ready.wait(max(0.0, self._deadline - time.monotonic()) + 1)
        assert self.error is None, self.error

    def close(self) -> None:
        for sock in (self.to_real, self.from_real):
            if sock is not None:
                sock.close()


def run_threads(
    world: int,
    fn: Callable[[int, Any], Any],
    *,
    hosts: list[str] | None = None,
    topology: str = "flat",
    timeout: float = 120.0,
    mesh: str = "plain",
    wire_integrity: str = "none",
    comm_timeout_s: float = 30.0,
) -> list[Any]:
    """Run ``fn(rank, comm)`` on ``world`` threads of this process, joined by real TCP rings
    (one ring, or per-host rings plus the leaders' when ``hosts`` fakes several hosts; plus the
    log-depth links of :mod:`sparkdl.comm.mesh` when ``mesh`` is ``"mesh"`` or ``"auto"``);
    returns the values by rank and re-raises the first error. Threads, not processes: for
    callers whose models are built on the main thread (Keras's naming state)."""
    from sparkdl.comm import create_communicator

    def body(rank: int, exchange: Callable[[str], list[str]]) -> Any:
        comm = create_communicator("tcp", rank, world, exchange, secret=SECRET,
                                   timeout_s=comm_timeout_s, topology=topology,
                                   host_id=hosts[rank] if hosts else None, mesh=mesh,
                                   wire_integrity=wire_integrity)
        try:
            return fn(rank, comm)
        finally:
            comm.close()

    return run_on_threads(world, body, timeout=timeout)


def run_on_threads(world: int, body: Callable[[int, Callable[[str], list[str]]], Any], *,
                   timeout: float = 120.0) -> list[Any]:
    """Run ``body(rank, exchange)`` on ``world`` threads of this process, each with its
    exchange of one rendezvous store; returns the values by rank and re-raises the first
    error."""
    import threading

    results: list[Any] = [None] * world
    errors: list[BaseException] = []
    with TcpStoreServer(SECRET) as server:
        def run(rank: int) -> None:
            try:
                exchange = store_exchange(server.address, rank, world, secret=SECRET,
                                          timeout_s=30)
                results[rank] = body(rank, exchange)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout)
        assert not any(t.is_alive() for t in threads), f"ranks did not finish within {timeout} s"
    if errors:
        raise errors[0]
    return results
