"""The log-depth collectives (``cluster.mesh``): fuzzed against the ring at 1..9 ranks over real
TCP, frame checks, failures and authentication."""

from __future__ import annotations

import hashlib
import signal
import socket
import time
from typing import Any

import numpy as np
import pytest
from _comm_harness import SECRET, RankGroup, new_event, run_threads, values

from sparkdl.comm import _auth, create_communicator
from sparkdl.comm.mesh import (
    MeshCommunicator,
    _in_links,
    _in_peer,
    _out_links,
    _pack,
    _unpack,
    connect_mesh,
    distances,
)
from sparkdl.errors import CommunicationError, ConfigurationError

_GATHER_SIZES = [0, 1, 7, 100, 5000, 70_000]
_REDUCE_LENGTHS = [0, 1, 3, 17, 1001, 20_000]


def _plan(seed: int, world: int) -> list[tuple[Any, ...]]:
    """A random sequence of collectives, the same on every rank."""
    rng = np.random.default_rng(seed)
    ops: list[tuple[Any, ...]] = []
    for i in range(14):
        kind = ["allgather", "broadcast", "allreduce", "barrier"][int(rng.integers(4))]
        if kind == "broadcast":
            ops.append((kind, i, int(rng.integers(world)), int(rng.choice(_GATHER_SIZES))))
        elif kind == "allreduce":
            dtype = ["float32", "float64"][int(rng.integers(2))]
            ops.append((kind, i, dtype, int(rng.choice(_REDUCE_LENGTHS)),
                        ["sum", "mean"][int(rng.integers(2))]))
        else:
            ops.append((kind, i))
    return ops


def _gather_message(seed: int, i: int, rank: int) -> bytes:
    rng = np.random.default_rng([seed, i, rank])
    return rng.bytes(int(rng.choice(_GATHER_SIZES)))


def _reduce_input(seed: int, i: int, rank: int, dtype: str, length: int, exact: bool):
    rng = np.random.default_rng([seed, i, rank, int(exact)])
    if exact:  # integer-valued: every summation order gives the same bits
        return rng.integers(-1000, 1000, length).astype(dtype)
    return rng.standard_normal(length).astype(dtype)


def _run_plan(seed: int) -> Any:
    def body(rank: int, comm: Any) -> list[Any]:
        world = comm.world_size
        out: list[Any] = []
        for op in _plan(seed, world):
            kind, i = op[0], op[1]
            if kind == "allgather":
                got = comm.allgather(_gather_message(seed, i, rank))
                want = [_gather_message(seed, i, r) for r in range(world)]
                out.append(("allgather", got == want, [len(m) for m in got]))
            elif kind == "broadcast":
                root, size = op[2], op[3]
                msg = np.random.default_rng([seed, i]).bytes(size)
                got = comm.broadcast(msg if rank == root else None, root=root)
                out.append(("broadcast", got == msg, len(got)))
            elif kind == "allreduce":
                dtype, length, how = op[2], op[3], op[4]
                x = _reduce_input(seed, i, rank, dtype, length, exact=False)
                before = x.copy()
                total = comm.allreduce(x, op=how)
                inputs = [_reduce_input(seed, i, r, dtype, length, False) for r in range(world)]
                want = np.sum(inputs, axis=0, dtype=np.float64).reshape(-1)
                if how == "mean":
                    want = want / world
                close = np.allclose(total, want, rtol=1e-4, atol=1e-4)
                ex = _reduce_input(seed, i, rank, dtype, length, exact=True)
                exact = comm.allreduce(ex, op=how)
                ok = (close and total.dtype == x.dtype and total.shape == (length,)
                      and np.array_equal(x, before))
                out.append(("allreduce", bool(ok), hashlib.sha256(total.tobytes()).hexdigest(),
                            exact.tobytes()))
            else:
                comm.barrier()
                out.append(("barrier", True))
        return out

    return body


@pytest.mark.parametrize("world", range(1, 10))
def test_fuzzed_collectives_match_the_ring_with_identical_bits_on_every_rank(world: int) -> None:
    for seed in (world, 100 + world):
        ring = run_threads(world, _run_plan(seed), mesh="plain")
        for mode in ("mesh", "auto"):
            ours = run_threads(world, _run_plan(seed), mesh=mode)
            for rank in range(world):
                for step, (got, ref) in enumerate(zip(ours[rank], ring[rank], strict=True)):
                    assert got[1], f"{mode} world {world} seed {seed} rank {rank}: {got}"
                    if got[0] == "allreduce":  # exactly representable sums: the ring's bits
                        assert got[3] == ref[3], (mode, world, seed, rank, step)
                    else:
                        assert got == ref
            for step in range(len(ours[0])):
                if ours[0][step][0] == "allreduce":
                    digests = {ours[r][step][2] for r in range(world)}
                    assert len(digests) == 1, f"{mode} world {world}: ranks got different bits"


@pytest.mark.parametrize("world", [3, 5])
def test_collectives_with_a_mac_on_every_link_are_correct(world: int) -> None:
    ring = run_threads(world, _run_plan(7), mesh="plain")
    ours = run_threads(world, _run_plan(7), mesh="mesh", wire_integrity="mac")
    assert [[s[:2] for s in r] for r in ours] == [[s[:2] for s in r] for r in ring]

    def check(rank: int, comm: Any) -> list[str]:
        assert isinstance(comm, MeshCommunicator) and comm.wire_integrity == "mac"
        return [link.wire_integrity for link in comm._links()]

    assert all(set(r) == {"mac"} for r in run_threads(world, check, mesh="mesh",
                                                      wire_integrity="mac"))


def test_links_in_and_out_agree_for_every_rank_count() -> None:
    for n in range(1, 40):
        for rank in range(n):
            for name, peer in _out_links(rank, n):
                assert name in _in_links(peer, n), (n, rank, name, peer)
                assert _in_peer(name, peer, n) == rank
            assert len(_in_links(rank, n)) == len(_out_links(rank, n))
            assert len(_in_links(rank, n)) <= 2 * len(distances(n)) + 1


def test_log_depth_steps_and_ring_sized_traffic() -> None:
    """A 16-rank allgather takes 4 steps (frames received per rank), not 15, and moves the
    same payload bytes per rank as the ring (plus 8 bytes of length per message)."""

    def body(rank: int, comm: Any) -> int:
        comm.barrier()
        before = comm.counters.bytes_received
        comm.allgather(bytes(4096))
        return int(comm.counters.bytes_received - before)

    world = 16
    mesh = run_threads(world, body, mesh="mesh")
    ring = run_threads(world, body, mesh="plain")
    header = 16
    for mesh_bytes, ring_bytes in zip(mesh, ring, strict=True):
        assert ring_bytes == (world - 1) * (4096 + header)
        assert mesh_bytes == (world - 1) * (4096 + 8) + len(distances(world)) * header


def test_malformed_bundles_are_refused() -> None:
    bundle = _pack([b"ab", b"", b"cde"])
    assert [bytes(m) for m in _unpack(bundle, 3, "rank 1", 0)] == [b"ab", b"", b"cde"]
    for bad, count in ((bundle, 2), (bundle[:-1], 3), (bundle + b"x", 3), (b"\0" * 7, 1)):
        with pytest.raises(CommunicationError, match="rank 1 is out of step"):
            _unpack(bad, count, "rank 1", 0)


def test_bad_mesh_mode_is_one_clear_error() -> None:
    with pytest.raises(ConfigurationError, match="mesh: expected one of"):
        create_communicator("tcp", 0, 1, lambda s: [s], secret=SECRET, timeout_s=1, mesh="x")
    with pytest.raises(ConfigurationError, match="needs transport 'tcp'"):
        create_communicator("spark", 0, 2, lambda s: [s, s], secret=SECRET, timeout_s=1,
                            mesh="mesh")


# Out of step, failures, authentication --------------------------------------------------------


def test_desynchronized_ranks_fail_instead_of_mixing_data() -> None:
    def body(rank: int, comm: Any) -> str:
        try:
            if rank == 0:
                comm.broadcast(b"x" * 10, root=0)
            elif rank == 3:
                comm.allreduce(np.ones(5, np.float32))
            else:
                comm.allgather(b"y")
        except CommunicationError as exc:
            return str(exc)
        return "ok"

    messages = run_threads(5, body, mesh="mesh", comm_timeout_s=20)
    assert any("is out of step" in m for m in messages), messages
    assert not any("not complete within" in m for m in messages), messages


def _first_error(call: Any) -> str:
    try:
        call()
    except CommunicationError as exc:
        return str(exc)
    return "ok"


@pytest.mark.parametrize("other", ["allgather", "broadcast", "barrier"])
def test_a_mesh_allreduce_against_another_collective_is_out_of_step_on_every_rank(
    other: str,
) -> None:
    """An allreduce runs over its own partner links and a broadcast's later steps over the
    distance links: a rank calling another collective must still be told at the first frame
    (both ranks), not after the whole ``timeout_s``."""

    def body(rank: int, comm: Any) -> str:
        if rank == 0:
            return _first_error(lambda: comm.allreduce(np.ones(5, np.float32)))
        calls = {"allgather": lambda: comm.allgather(b"y"),
                 "broadcast": lambda: comm.broadcast(b"x" * 10, root=1),
                 "barrier": comm.barrier}
        return _first_error(calls[other])

    messages = run_threads(2, body, mesh="mesh", comm_timeout_s=30)
    assert all("is out of step" in m for m in messages), messages


def test_a_mesh_broadcast_against_an_allreduce_is_out_of_step_on_every_rank() -> None:
    def body(rank: int, comm: Any) -> str:
        if rank % 2 == 0:
            return _first_error(lambda: comm.broadcast(b"x" * 10, root=0))
        return _first_error(lambda: comm.allreduce(np.ones(5, np.float32)))

    messages = run_threads(4, body, mesh="mesh", comm_timeout_s=30)
    assert all("is out of step" in m for m in messages), messages


def test_auto_allreduces_of_sizes_on_either_side_of_the_limit_are_out_of_step() -> None:
    """Under ``auto`` a vector up to AUTO_MAX_REDUCE_BYTES takes halving-doubling and a larger
    one the ring: ranks that disagree on the size must not wait for each other on different
    links until the timeout."""
    from sparkdl.comm.mesh import AUTO_MAX_REDUCE_BYTES

    small = AUTO_MAX_REDUCE_BYTES // 4
    large = small + 1

    def body(rank: int, comm: Any) -> str:
        return _first_error(
            lambda: comm.allreduce(np.ones(small if rank % 2 else large, np.float32))
        )

    messages = run_threads(4, body, mesh="auto", comm_timeout_s=30)
    assert all("is out of step" in m for m in messages), messages


def _gather_until_error(rank: int, world: int, exchange: Any, timeout_s: float, ready: Any):
    comm = connect_mesh(rank, world, exchange, secret=SECRET, timeout_s=timeout_s)
    comm.allreduce(np.ones(10, np.float32))
    ready.set()
    try:
        while True:
            comm.allgather(b"m" * 100)
            comm.allreduce(np.ones(10, np.float32))
    except CommunicationError as exc:
        comm.close()
        return str(exc), time.time()


@pytest.mark.parametrize("how", ["stopped", "killed"])
def test_silent_or_dead_peer_makes_every_rank_fail_within_the_timeout(how: str) -> None:
    world, victim, timeout_s = 5, 2, 3.0
    ready = new_event()
    with RankGroup(_gather_until_error, world, args=(timeout_s, ready)) as group:
        assert ready.wait(30)
        time.sleep(0.2)
        group.signal(victim, signal.SIGSTOP if how == "stopped" else signal.SIGKILL)
        others = [r for r in range(world) if r != victim]
        outcomes = values(group.results(timeout=timeout_s + 20, ranks=others))
        group.kill()
    messages = [msg for msg, _ in outcomes]
    assert len(messages) == world - 1, messages
    if how == "killed":
        assert not any("not complete within" in m for m in messages), messages
    assert any(f"rank {victim} (127.0.0.1:" in m for m in messages), messages
    if how == "stopped":
        assert any("not complete within 3.0 s" in m for m in messages), messages


def test_a_link_accepts_only_the_peer_authenticated_for_it() -> None:
    """A connection that authenticates with the job's secret but for the ring (or another
    link) is refused by a mesh listener; the mesh still forms and works."""
    report: dict[str, str] = {}

    def body(rank: int, comm: Any) -> bytes:
        return b"".join(comm.allgather(bytes([rank])))

    import sparkdl.comm.mesh as mesh_module

    real = mesh_module._parse_ports

    def attacking(text: str, rank: int, count: int) -> list[int]:
        ports = real(text, rank, count)
        if rank == 1 and "ring" not in report:
            report["ring"] = "pending"
            with socket.create_connection(("127.0.0.1", ports[0]), timeout=5) as bad:
                try:
                    _auth.authenticate_connector(bad, SECRET, b"sparkdl-ring-v1:1", 0, 4,
                                                 time.monotonic() + 5)
                    bad.settimeout(5)
                    report["ring"] = "closed" if bad.recv(1) == b"" else "accepted"
                except (OSError, CommunicationError) as exc:
                    report["ring"] = f"rejected: {type(exc).__name__}"
        return ports

    mesh_module._parse_ports = attacking
    try:
        results = run_threads(4, body, mesh="mesh", comm_timeout_s=15)
    finally:
        mesh_module._parse_ports = real
    assert results == [bytes(range(4))] * 4
    assert report["ring"].startswith(("rejected", "closed")), report


def test_auto_chooses_by_rank_count_and_the_size_every_rank_knows() -> None:
    """At 4 ranks, ``auto`` runs an allgather by Bruck while the previous one's largest
    message was small (the frames show it: 8 bytes of length per message, one header per
    step) and by the ring after a large one; an allreduce by halving-doubling up to 64 KiB (after
its announce frame on the ring)."""

    def body(rank: int, comm: Any) -> list[int]:
        got = []
        for size in (100, 20_000, 100, 100):
            before = comm.counters.bytes_received
            comm.allgather(bytes(size))
            got.append(comm.counters.bytes_received - before)
        for length in (1000, 20_000):
            before = comm.counters.bytes_received
            comm.allreduce(np.ones(length, np.float32))
            got.append(comm.counters.bytes_received - before)
        return got

    header, world = 16, 4
    bruck = [3 * (m + 8) + 2 * header for m in (100, 20_000)]
    ring = 3 * (100 + header)
    announce = header + 8  # the vector's bytes, on the ring, before the first step
    halving = 2 * (2000 + 1000) + 4 * header + announce  # 1000 floats: a half, a quarter, back
    ring_reduce = 6 * (20_000 + header)  # 20_000 floats (80 KB): 6 chunks of 5_000
    want = [bruck[0], bruck[1], ring, bruck[0], halving, ring_reduce]
    assert run_threads(world, body, mesh="auto") == [want] * world
    assert run_threads(2, body, mesh="auto")[0][0] == 100 + header  # 2 ranks: the ring


def test_mesh_applies_to_each_ring_of_the_hierarchical_topology() -> None:
    hosts = ["a"] * 4 + ["b"] * 3 + ["c"] * 2

    def kinds(rank: int, comm: Any) -> list[str]:
        return [type(c).__name__ for c in (comm.local, comm.leaders) if c is not None]

    assert "MeshCommunicator" in run_threads(9, kinds, hosts=hosts, topology="hierarchical",
                                             mesh="mesh")[0]
    ring = run_threads(9, _run_plan(5), hosts=hosts, topology="hierarchical")
    ours = run_threads(9, _run_plan(5), hosts=hosts, topology="hierarchical", mesh="mesh")
    for got, ref in zip(ours, ring, strict=True):
        assert all(step[1] for step in got)
        assert [s for s in got if s[0] != "allreduce"] == [s for s in ref if s[0] != "allreduce"]
