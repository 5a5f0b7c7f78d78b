"""The same-host shared-memory path of the TCP ring: negotiation, fallbacks, cleanup."""

from __future__ import annotations

import os
import signal
import socket
import stat
import threading
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

from sparkdl.comm import _shm
from sparkdl.comm.tcp import connect_ring
from sparkdl.errors import CommunicationError

pytestmark = pytest.mark.skipif(not os.path.isdir(_shm.SHM_DIR), reason="no /dev/shm")


def _ours() -> set[str]:
    return {name for name in os.listdir(_shm.SHM_DIR) if name.startswith("sparkdl-")}


def _sum_and_counters(rank: int, world: int, exchange, flags: dict[int, bool]) -> tuple:
    comm = connect_ring(
        rank, world, exchange, secret=SECRET, timeout_s=15, shared_memory=flags.get(rank, True)
    )
    x = np.random.default_rng(rank).standard_normal(1_000_003).astype(np.float32)
    before = comm.counters.snapshot()
    total = comm.allreduce(x)
    gathered = comm.allgather(x.tobytes()[: 100_000 + rank])
    after = comm.counters.snapshot()
    mapped = comm.shared_memory
    comm.close()
    comm.close()
    sizes = [len(m) for m in gathered]
    return total.tobytes(), sizes, (after[0] - before[0], after[1] - before[1]), mapped


def test_results_and_counters_match_tcp_and_nothing_is_left_in_dev_shm() -> None:
    before = _ours()
    world = 3
    shm = values(run_ranks(_sum_and_counters, world, args=({},), timeout=60))
    tcp = values(run_ranks(_sum_and_counters, world, args=(dict.fromkeys(range(3), False),)))
    assert _ours() <= before
    for (s_total, s_sizes, s_bytes, s_mapped), (t_total, t_sizes, t_bytes, t_mapped) in zip(
        shm, tcp, strict=True
    ):
        assert s_mapped == (True, True) and t_mapped == (False, False)
        assert s_total == t_total == shm[0][0]  # same bits on every rank, either path
        assert s_sizes == t_sizes == [100_000 + r for r in range(world)]
        # payload moved through shared memory is counted as sent / received
        for s, t in zip(s_bytes, t_bytes, strict=True):
            assert abs(s - t) <= 0.01 * t, (s_bytes, t_bytes)


def test_mixed_ring_uses_shared_memory_only_where_both_ends_agree() -> None:
    # rank 1 refuses: links 0 -> 1 and 1 -> 2 stay on TCP, 2 -> 0 uses shared memory.
    results = values(run_ranks(_sum_and_counters, 3, args=({1: False},), timeout=60))
    assert [r[3] for r in results] == [(True, False), (False, False), (False, True)]
    assert len({r[0] for r in results}) == 1


def _env_disabled(rank: int, world: int, exchange) -> tuple[bool, bool]:
    comm = connect_ring(rank, world, exchange, secret=SECRET, timeout_s=15)
    comm.allreduce(np.ones(100_000, np.float64))
    flags = comm.shared_memory
    comm.close()
    return flags


def test_environment_switch_disables_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKDL_SHM", "0")  # handed to the ranks with the environment
    assert values(run_ranks(_env_disabled, 2)) == [(False, False)] * 2


def test_nothing_is_left_in_dev_shm_after_a_rank_is_killed() -> None:
    before = _ours()
    ready = new_event()
    with RankGroup(allreduce_until_error, 3, args=(3.0, 1_000_000, ready)) as group:
        assert ready.wait(30)
        time.sleep(0.2)
        group.signal(1, signal.SIGKILL)
        messages = [msg for msg, _ in values(group.results(timeout=20, ranks=[0, 2]))]
    assert any("rank 1 (127.0.0.1:" in m for m in messages), messages
    assert _ours() <= before


def _desync(rank: int, world: int, exchange, how: str) -> str:
    comm = connect_ring(rank, world, exchange, secret=SECRET, timeout_s=5)
    assert comm.shared_memory == (True, True)
    big = np.ones(1_000_000, np.float32)
    try:
        if rank == 1 and how == "size":
            comm.allreduce(np.ones(1_000_008, np.float32))
        elif rank == 1:
            comm.allgather(big.tobytes())
        else:
            comm.allreduce(big)
    except CommunicationError as exc:
        return str(exc)
    raise AssertionError("no error")


@pytest.mark.parametrize("how", ["size", "op"])
def test_desynchronized_ranks_fail_on_the_shared_memory_path_too(how: str) -> None:
    messages = values(run_ranks(_desync, 3, args=(how,), timeout=30))
    assert any("out of step" in m for m in messages), messages


# Negotiation, in one process over a socket pair ----------------------------------------------


def _negotiate(
    want_c: bool = True, want_a: bool = True, slots_a: int = 2
) -> tuple[_shm.ShmLink | None, _shm.ShmLink | None]:
    a, c = socket.socketpair()
    deadline = time.monotonic() + 5
    got: dict[str, object] = {}

    def connector() -> None:
        got["c"] = _shm.negotiate_connector(c, want_c, 2, 4096, deadline)[0]

    thread = threading.Thread(target=connector)
    thread.start()
    link_a = _shm.negotiate_acceptor(a, want_a, slots_a, 4096, deadline)[0]
    thread.join()
    a.close()
    c.close()
    return got["c"], link_a  # type: ignore[return-value]


def test_negotiation_maps_the_same_memory_and_unlinks_it() -> None:
    before = _ours()
    tx, rx = _negotiate()
    assert tx is not None and rx is not None
    assert _ours() <= before  # unlinked as soon as both ends mapped it
    tx.view[tx.offset(1) : tx.offset(1) + 5] = b"hello"
    assert bytes(rx.view[rx.offset(1) : rx.offset(1) + 5]) == b"hello"
    tx.close()
    rx.close()
    rx.close()


@pytest.mark.parametrize("kwargs", [{"want_c": False}, {"want_a": False}, {"slots_a": 3}], ids=str)
def test_negotiation_falls_back_to_tcp(kwargs: dict) -> None:
    before = _ours()
    tx, rx = _negotiate(**kwargs)
    assert tx is None and rx is None
    assert _ours() <= before


def test_segments_are_private_and_randomly_named() -> None:
    name, mm, _ = _shm._create(8192)
    try:
        mode = os.stat(os.path.join(_shm.SHM_DIR, name)).st_mode
        assert stat.S_IMODE(mode) == 0o600
        assert name.startswith(f"sparkdl-p{os.getpid()}n") and len(name.rsplit("-", 1)[1]) == 32
    finally:
        os.unlink(os.path.join(_shm.SHM_DIR, name))
        mm.close()
    with pytest.raises(OSError):
        _shm._open("../etc/passwd", 8192)
