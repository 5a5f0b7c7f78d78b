"""Topology-aware collectives with plain processes: 4 ranks faking 2 hosts by host id."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest
from _comm_harness import SECRET, run_ranks, values

from sparkdl.comm import HierarchicalCommunicator, create_communicator
from sparkdl.comm.hierarchical import (
    connect_hierarchical,
    pack_bundle,
    unpack_bundle,
    wants_hierarchy,
)
from sparkdl.comm.tcp import connect_ring
from sparkdl.config import JobConfig
from sparkdl.errors import CommunicationError, ConfigurationError

MESSAGE_BYTES = 20_000


def _message(rank: int, step: int) -> bytes:
    rng = np.random.default_rng(1000 * step + rank)
    return rng.integers(0, 256, MESSAGE_BYTES + 37 * rank, dtype=np.uint8).tobytes()


def _collectives(rank, world, exchange, topology, hosts, steps):
    """Run every collective; report results and the bytes this rank sent to another host."""
    comm = create_communicator("tcp", rank, world, exchange, secret=SECRET, timeout_s=20,
                               topology=topology, host_id=hosts[rank])
    try:
        hierarchical = isinstance(comm, HierarchicalCommunicator)
        flat_next_remote = hosts[(rank + 1) % world] != hosts[rank]

        def crossing() -> int:
            if hierarchical:
                return comm.inter_host_counters.snapshot()[0]
            return comm.counters.snapshot()[0] if flat_next_remote else 0

        before = crossing()
        gathered = [comm.allgather(_message(rank, s)) for s in range(steps)]
        crossed = crossing() - before
        rng = np.random.default_rng(rank)
        vec = rng.standard_normal(5000).astype(np.float32)
        summed = comm.allreduce(vec, "sum")
        mean = comm.allreduce(vec.astype(np.float64), "mean")
        casts = [comm.broadcast(b"from %d" % root if rank == root else None, root)
                 for root in range(world)]
        comm.barrier()
        return {"hierarchical": hierarchical, "gathered": gathered, "crossed": crossed,
                "sum": summed, "mean": mean, "casts": casts}
    finally:
        comm.close()


@pytest.mark.parametrize("hosts", [["a", "a", "b", "b"], ["a", "b", "a", "b"]])
def test_hierarchical_collectives_match_flat_with_fewer_inter_host_bytes(hosts):
    steps = 3
    flat = values(run_ranks(_collectives, 4, args=("flat", hosts, steps), timeout=60))
    tree = values(run_ranks(_collectives, 4, args=("auto", hosts, steps), timeout=60))
    assert [r["hierarchical"] for r in tree] == [True] * 4
    assert [r["hierarchical"] for r in flat] == [False] * 4
    expected = [[_message(r, s) for r in range(4)] for s in range(steps)]
    for f, t in zip(flat, tree):
        assert f["gathered"] == expected and t["gathered"] == expected  # bit for bit
        assert t["casts"] == [b"from %d" % r for r in range(4)]
    # every rank holds the same reduction; it equals the flat one up to float order
    for key in ("sum", "mean"):
        assert all(np.array_equal(t[key], tree[0][key]) for t in tree)
        np.testing.assert_allclose(tree[0][key], flat[0][key], rtol=1e-5, atol=1e-5)
    # between hosts: one bundle per host per step, so each message crosses once
    payload = steps * sum(len(_message(r, 0)) for r in range(4))
    tree_crossed = sum(t["crossed"] for t in tree)
    flat_crossed = sum(f["crossed"] for f in flat)
    assert payload <= tree_crossed < 1.1 * payload
    assert flat_crossed > 1.4 * tree_crossed  # contiguous hosts: 6 of 12 hops; alternating: 12


def _topology_of(rank, world, exchange, topology, hosts, known):
    rounds = []

    def counted(message):
        rounds.append(message)
        return exchange(message)

    where = {"hosts": hosts} if known else {"host_id": hosts[rank]}
    comm = create_communicator("tcp", rank, world, counted, secret=SECRET, timeout_s=20,
                               topology=topology, **where)
    try:
        assert comm.topology == ("hierarchical" if isinstance(comm, HierarchicalCommunicator)
                                 else "flat")
        return type(comm).__name__, comm.allgather(b"%d" % rank), len(rounds)
    finally:
        comm.close()


@pytest.mark.parametrize(("topology", "hosts", "kind"), [
    ("auto", ["a", "a", "a"], "TcpRingCommunicator"),      # one host
    ("auto", ["a", "b", "c"], "TcpRingCommunicator"),      # one rank per host
    ("auto", ["a", "b", "b"], "HierarchicalCommunicator"),
    ("hierarchical", ["a", "a", "a"], "HierarchicalCommunicator"),
    ("hierarchical", ["a", "b", "c"], "HierarchicalCommunicator"),
])
@pytest.mark.parametrize("known", [False, True], ids=["hosts exchanged", "hosts known"])
def test_auto_topology_and_uneven_hosts(topology, hosts, kind, known):
    out = values(run_ranks(_topology_of, 3, args=(topology, hosts, known), timeout=60))
    assert [o[0] for o in out] == [kind] * 3
    assert all(o[1] == [b"0", b"1", b"2"] for o in out)
    # a ring takes one round of the rendezvous, and so do two levels (both rings' addresses
    # ride in it); learning the hosts one more, unless the caller knows them (a Spark
    # barrier stage: its task infos)
    assert [o[2] for o in out] == [1 + (not known)] * 3


HOSTS = ["a", "a", "b", "b"]


def _ring(rank, size, exchange):
    return connect_ring(rank, size, exchange, secret=SECRET, timeout_s=5)


def _two_levels(rank, world, exchange, failing_rank, failure):
    """Both levels in one round; ``failing_rank``'s host ring fails before its round, or it
    publishes a malformed value."""
    def connect(r, size, ring_exchange):
        if rank == failing_rank and failure == "host ring" and size == 2 and r == 1:
            raise OSError("no port free in cluster.port_range")
        return _ring(r, size, ring_exchange)

    def published(message):
        return exchange("not a pair" if rank == failing_rank else message)

    started = time.monotonic()
    try:
        comm = connect_hierarchical(rank, world, published if failure == "malformed" else
                                    exchange, connect, hosts=HOSTS, timeout_s=5)
    except BaseException as exc:
        return type(exc).__name__, str(exc), time.monotonic() - started
    comm.close()
    return "connected", "", time.monotonic() - started


def test_a_host_ring_that_fails_before_the_round_leaves_no_rank_waiting():
    """Rank 3's host ring cannot listen: it raises its own error, its host's other rank learns
    that at once from the round (no address), and the other host is unaffected."""
    out = values(run_ranks(_two_levels, 4, args=(3, "host ring"), timeout=60))
    assert [o[0] for o in out] == ["connected", "connected", "CommunicationError", "OSError"]
    # the ring numbers its ranks within the host: the error says which world ranks they are
    assert out[2][1].startswith("the ring of host 'b' (ranks 0, 1 = world ranks 2, 3): ")
    assert "rank 1 published a bad address ''" in out[2][1]
    assert "no port free" in out[3][1]
    assert all(o[2] < 15 for o in out), out  # none waited for a timeout of its own


def test_a_malformed_round_value_is_named():
    """By its world rank, on every rank: the round's errors take no ring's numbering."""
    out = values(run_ranks(_two_levels, 4, args=(1, "malformed"), timeout=60))
    assert [o[0] for o in out] == ["RoundError"] * 4  # a CommunicationError
    assert all(o[1].startswith("rank 1 published 'not a pair' in the rendezvous")
               for o in out), out


def _one_rank_leaves(rank, world, exchange):
    """(outcome, the error, the ring's error log lines)"""
    logged: list[str] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = lambda record: logged.append(record.getMessage())
    logging.getLogger("sparkdl.comm").addHandler(handler)
    comm = connect_hierarchical(rank, world, exchange, _ring, hosts=HOSTS, timeout_s=5)
    try:
        comm.allgather(b"first")
        if rank == 3:
            return "left", "", logged
        try:
            comm.allgather(b"second")
        except CommunicationError as exc:
            return "failed", str(exc), logged
        return "gathered", "", logged
    finally:
        comm.close()


def test_a_collective_that_fails_names_the_world_ranks_of_the_failed_ring():
    """World rank 3 leaves: its host's other rank fails in their host's ring, that rank's
    leader then in the leaders' ring, and the first host's other rank in its own; each error
    says which ring, and which world ranks its ranks are."""
    out = values(run_ranks(_one_rank_leaves, 4, timeout=60))
    assert [o[0] for o in out] == ["failed", "failed", "failed", "left"], out
    assert out[2][1].startswith("the ring of host 'b' (ranks 0, 1 = world ranks 2, 3): rank 0: ")
    assert out[0][1].startswith("the leaders' ring (ranks 0, 1 = world ranks 0, 2): rank 0: ")
    assert out[1][1].startswith("the ring of host 'a' (ranks 0, 1 = world ranks 0, 1): rank 1: ")
    # the rings' own log lines (executor logs) say the same: the error, as raised
    for rank in range(3):
        assert out[rank][1] in out[rank][2], out[rank]


def _a_leader_cuts_a_bundle_short(rank, world, exchange, passed_on=False):
    """(outcome, the error): host 'b''s leader (world rank 2) cuts a byte off its bundle, or
    (``passed_on``) host 'a''s leader (world rank 0) off the bundle it passes on to its host."""
    comm = connect_hierarchical(rank, world, exchange, _ring, hosts=HOSTS, timeout_s=5)
    try:
        if rank == 2 and not passed_on:
            gather = comm.leaders.allgather
            comm.leaders.allgather = lambda message: gather(bytes(message)[:-1])
        if rank == 0 and passed_on:
            cast = comm.local.broadcast
            comm.local.broadcast = lambda message, root=0: cast(bytes(message)[:-1], root)
        try:
            comm.allgather(b"message of rank %d" % rank)
        except CommunicationError as exc:
            return "failed", str(exc)
        return "gathered", ""
    finally:
        comm.close()


def test_a_malformed_bundle_names_its_host_and_world_ranks():
    """Host 'a''s ranks cannot read host 'b''s bundle: their error names that host and its
    world ranks; host 'b' itself never reads its own bundle."""
    out = values(run_ranks(_a_leader_cuts_a_bundle_short, 4, timeout=60))
    assert [o[0] for o in out] == ["failed", "failed", "gathered", "gathered"], out
    for _, error in out[:2]:
        assert error.startswith("the bundle of host 'b' (world ranks 2, 3)'s lengths add up "
                                "to "), error


def test_a_malformed_bundle_passed_on_names_the_leader_that_passed_it():
    """Host 'a''s leader passes a short bundle of the other hosts' messages on to its host
    (and reads it back, as its host does): both of host 'a''s errors name that leader; host
    'b' is unaffected."""
    out = values(run_ranks(_a_leader_cuts_a_bundle_short, 4, args=(True,), timeout=60))
    assert [o[0] for o in out] == ["failed", "failed", "gathered", "gathered"], out
    for _, error in out[:2]:
        assert error.startswith("the other hosts' bundle from the leader of host 'a' (world "
                                "rank 0)'s lengths add up to "), error


@pytest.mark.parametrize(("transport", "topology", "world_size"),
                         [("tcp", "auto", 2), ("tcp", "flat", 2), ("tcp", "hierarchical", 1),
                          ("spark", "flat", 2)])
def test_known_hosts_must_name_every_rank(transport, topology, world_size):
    """Whatever the topology needs of them (a flat ring, one rank, Spark's transport: nothing),
    a wrong list is an error before anything connects."""
    exchanged: list[str] = []

    def exchange(message: str) -> list[str]:
        exchanged.append(message)
        return [message] * world_size

    with pytest.raises(ConfigurationError,
                       match=rf"hosts: expected one per rank \({world_size}\), got 3"):
        create_communicator(transport, 0, world_size, exchange, secret=SECRET, timeout_s=5,
                            topology=topology, hosts=["a", "b", "a"])
    assert exchanged == []


def test_wants_hierarchy_and_bad_topology():
    assert JobConfig().cluster.topology == "auto"
    with pytest.raises(ValueError, match="topology"):
        JobConfig(cluster={"topology": "tree"})
    assert wants_hierarchy("auto", ["x", "x", "y"]) and not wants_hierarchy("flat", ["x", "x"])
    with pytest.raises(ConfigurationError, match="topology: expected one of"):
        wants_hierarchy("tree", ["x"])
    with pytest.raises(ConfigurationError, match="needs transport 'tcp'"):
        create_communicator("spark", 0, 2, lambda s: [s, s], secret=SECRET, timeout_s=5,
                            topology="hierarchical")


def test_bundle_round_trip_and_malformed_bundles():
    messages = [b"", b"abc", bytes(range(256))]
    assert unpack_bundle(pack_bundle(messages), 3) == messages
    data = pack_bundle(messages)
    with pytest.raises(CommunicationError, match="expected 2"):
        unpack_bundle(data, 2)
    with pytest.raises(CommunicationError, match="add up to"):
        unpack_bundle(data[:-1], 3)
    with pytest.raises(CommunicationError, match="no header"):
        unpack_bundle(b"\x01", 1)
