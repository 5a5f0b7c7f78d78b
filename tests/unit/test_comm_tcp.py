"""The TCP ring transport, with real processes and real sockets."""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import socket
import time

import numpy as np
import pytest
from _comm_harness import (
    SECRET,
    RankGroup,
    allreduce_until_error,
    new_event,
    run_ranks,
    values,
)

from sparkdl.comm import _auth
from sparkdl.comm.tcp import TcpRingCommunicator, connect_ring
from sparkdl.errors import CommunicationError, ConfigurationError

LENGTHS = [0, 1, 5, 7, 1001, 65_537]
PATHS = ["tcp", "shm", "shm-small"]


def _inputs(rank: int, length: int, dtype: str) -> np.ndarray:
    rng = np.random.default_rng(1000 * rank + length)
    return rng.standard_normal(length).astype(dtype)


def _ring(rank: int, world: int, exchange, path: str, timeout_s: float = 15) -> TcpRingCommunicator:
    """``path``: "tcp" (no shared memory), "shm" (defaults) or "shm-small" (every payload in
    shared memory, in 4 KiB chunks, so slots wrap around many times)."""
    comm = connect_ring(
        rank, world, exchange, secret=SECRET, timeout_s=timeout_s, shared_memory=path != "tcp"
    )
    expected = path != "tcp" and world > 1
    assert comm.shared_memory == (expected, expected), (path, comm)
    if path == "shm-small":
        comm.shm_min_bytes = 1
        comm.shm_chunk_bytes = 4096
    return comm


def _allreduce_cases(
    rank: int, world: int, exchange, path: str = "tcp"
) -> list[tuple[str, bool, bool, str]]:
    comm = _ring(rank, world, exchange, path)
    out = []
    for dtype in ("float32", "float64"):
        for length in LENGTHS:
            x = _inputs(rank, length, dtype)
            before = x.copy()
            expected = np.sum([_inputs(r, length, dtype) for r in range(world)], axis=0)
            total = comm.allreduce(x)
            mean = comm.allreduce(x, op="mean")
            exact = np.arange(length, dtype=dtype) * (rank + 1)
            exact_sum = comm.allreduce(exact)
            ok = (
                total.dtype == x.dtype
                and total.shape == (length,)
                and np.allclose(total, expected.reshape(-1), rtol=1e-5, atol=1e-5)
                and np.allclose(mean, expected.reshape(-1) / world, rtol=1e-5, atol=1e-5)
                and np.array_equal(x, before)
            )
            is_exact = np.array_equal(exact_sum, np.arange(length) * world * (world + 1) / 2)
            digest = hashlib.sha256(total.tobytes() + mean.tobytes()).hexdigest()
            out.append((f"{dtype}/{length}", bool(ok), bool(is_exact), digest))
    comm.close()
    return out


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
def test_allreduce_matches_numpy_and_is_bit_identical(world: int, path: str) -> None:
    results = values(run_ranks(_allreduce_cases, world, args=(path,), timeout=60))
    for rank_result in results:
        for case, ok, exact, _ in rank_result:
            assert ok, f"world {world} case {case}: wrong sum/mean or input modified"
            assert exact, f"world {world} case {case}: integer-valued sum not exact"
    digests = {tuple(d for *_, d in rank_result) for rank_result in results}
    assert len(digests) == 1, "ranks got different bits"


def _gather_cases(rank: int, world: int, exchange, path: str = "tcp") -> dict:
    comm = _ring(rank, world, exchange, path)
    small = comm.allgather(bytes([65 + rank]) * (rank * 3))  # rank 0 sends b""
    big = comm.allgather(np.full(300_000 + rank, rank, np.uint8).tobytes())
    root = world - 1
    bc = comm.broadcast(b"from-root" if rank == root else None, root=root)
    payload = np.arange(500_000, dtype=np.uint8).tobytes()
    bc_big = comm.broadcast(payload if rank == 1 % world else None, root=1 % world)
    comm.barrier()
    arr = comm.broadcast_array(np.arange(10.0) * (rank + 1), root=0)
    counters = comm.counters.snapshot()
    comm.close()
    return {
        "small": small,
        "big": [(len(m), set(m)) for m in big],
        "bc": bc,
        "bc_big_ok": bc_big == payload,
        "arr": arr.tolist(),
        "counters": counters,
    }


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("world", [2, 4])
def test_allgather_broadcast_barrier(world: int, path: str) -> None:
    results = values(run_ranks(_gather_cases, world, args=(path,), timeout=60))
    for res in results:
        assert res["small"] == [bytes([65 + r]) * (r * 3) for r in range(world)]
        assert res["big"] == [(300_000 + r, {r}) for r in range(world)]
        assert res["bc"] == b"from-root"
        assert res["bc_big_ok"]
        assert res["arr"] == list(np.arange(10.0))
        sent, received = res["counters"]
        assert sent > 300_000 * (world - 1) and received > 300_000 * (world - 1)


def test_world_of_one_needs_no_sockets() -> None:
    comm = connect_ring(0, 1, lambda s: [s], secret=SECRET, timeout_s=1)
    x = np.arange(5, dtype=np.float32)
    assert np.array_equal(comm.allreduce(x, op="mean"), x)
    assert comm.allgather(b"a") == [b"a"]
    assert comm.broadcast(b"b") == b"b"
    comm.barrier()
    with pytest.raises(ConfigurationError):
        comm.allreduce(x, op="max")
    with pytest.raises(ConfigurationError):
        comm.allreduce(np.arange(3))
    comm.close()


def test_bad_parameters() -> None:
    with pytest.raises(ConfigurationError):
        connect_ring(2, 2, lambda s: [s], secret=SECRET)
    with pytest.raises(ConfigurationError):
        connect_ring(0, 2, lambda s: [s], secret=b"short")


def _desync(rank: int, world: int, exchange) -> str:
    comm = connect_ring(rank, world, exchange, secret=SECRET, timeout_s=5)
    try:
        if rank == 1:
            comm.allgather(b"hello")
        else:
            comm.allreduce(np.ones(100, np.float32))
    except CommunicationError as exc:
        return str(exc)
    raise AssertionError("no error")


def test_desynchronized_ranks_fail_instead_of_mixing_data() -> None:
    messages = values(run_ranks(_desync, 3, timeout=30))
    # found out by the frame headers (and the peers closing), never by waiting out the timeout
    assert any("is out of step" in m for m in messages), messages
    assert not any("not complete within" in m for m in messages), messages


# Authentication ----------------------------------------------------------------------------


def _attacked(rank: int, world: int, exchange) -> dict:
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logging.getLogger("sparkdl.comm").addHandler(Collect())
    report: dict = {}

    def attacking_exchange(value: str) -> list[str]:
        addresses = exchange(value)
        if rank == 0:  # attack rank 1's listener before making the legitimate connection
            host, port = addresses[1].rsplit(":", 1)
            target = (host, int(port))
            with socket.create_connection(target, timeout=5) as bad:
                try:
                    _auth.authenticate_connector(
                        bad,
                        b"wrong-secret-0123456789",
                        b"sparkdl-ring-v1:1",
                        0,
                        world,
                        time.monotonic() + 5,
                    )
                    report["wrong_secret"] = "accepted"
                except (OSError, CommunicationError) as exc:
                    report["wrong_secret"] = f"rejected: {type(exc).__name__}"
            with socket.create_connection(target, timeout=5) as garbage:
                garbage.sendall(os.urandom(200))
                data = b""
                try:
                    while chunk := garbage.recv(1024):
                        data += chunk
                    report["garbage"] = f"closed after {len(data)} bytes"
                except OSError as exc:
                    report["garbage"] = f"closed: {exc}"
            report["silent"] = socket.create_connection(target, timeout=5)  # left open
            report["silent"] = "open"
        return addresses

    comm = connect_ring(rank, world, attacking_exchange, secret=SECRET, timeout_s=15)
    total = comm.allreduce(np.full(1000, rank + 1, np.float64))
    comm.close()
    report["sum_ok"] = bool(np.all(total == world * (world + 1) / 2))
    report["logs"] = records
    return report


def test_wrong_secret_and_garbage_are_rejected_during_ring_formation() -> None:
    results = values(run_ranks(_attacked, 3, timeout=60))
    assert all(r["sum_ok"] for r in results)
    attacker = results[0]
    assert attacker["wrong_secret"].startswith("rejected")
    # the acceptor sends its 38-byte challenge, then closes on the bad reply
    assert attacker["garbage"].startswith("closed"), attacker["garbage"]
    logs = " | ".join(results[1]["logs"])
    assert "HMAC mismatch" in logs and "bad handshake magic" in logs, logs


# Failures ----------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["stopped", "killed"])
def test_silent_or_dead_peer_makes_every_rank_fail_within_the_timeout(how: str) -> None:
    world, victim, timeout_s = 4, 2, 3.0
    ready = new_event()
    with RankGroup(allreduce_until_error, world, args=(timeout_s, 200_000, ready)) as group:
        assert ready.wait(30)
        time.sleep(0.2)
        group.signal(victim, signal.SIGSTOP if how == "stopped" else signal.SIGKILL)
        others = [r for r in range(world) if r != victim]
        outcomes = values(group.results(timeout=timeout_s + 20, ranks=others))
        group.kill()
    messages = [msg for msg, _ in outcomes]
    # every survivor failed (results() bounds the wait); a killed peer is found by its closed
    # socket, a stopped one by the 3 s bound: told apart by the message, not the clock
    assert len(messages) == world - 1, messages
    if how == "killed":
        assert not any("not complete within" in m for m in messages), messages
    victim_name = f"rank {victim} (127.0.0.1:"
    assert any(victim_name in m for m in messages), messages
    if how == "stopped":
        assert any("not complete within 3.0 s" in m for m in messages), messages
