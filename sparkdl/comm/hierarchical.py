"""Topology-aware collectives: one accumulator per host (DL4J's per-node accumulator).

Ranks that share a host form a *local* communicator; its local rank 0 is the host's
*leader*, and the leaders form a second communicator. Hosts are numbered by their lowest
world rank, so host ``h``'s leader is rank ``h`` of the leaders' communicator.

=============== ============================================ ===============================
collective      inside a host / between hosts / inside again  result
=============== ============================================ ===============================
``allgather``   local allgather → leaders allgather the       identical to the flat
                host *bundles* → leader broadcasts the other   allgather, bit for bit
                hosts' bundles locally
``allreduce``   local sum → leaders sum the host sums →       float order differs from the
                leader broadcasts the total locally            flat ring (sum of host sums);
                                                               identical on every rank
``broadcast``   root → its host's leader → leaders →           identical
                every other host's ranks
``barrier``     local, leaders, local                          —
=============== ============================================ ===============================

**The host's combined message** in ``allgather`` (what gradient sharing uses) is the bundle of
the host's messages, not their decoded sum re-encoded. So between hosts there is one message
per host per step, and every rank still decodes every rank's frame in rank order: the decoded
sum is bit-for-bit that of the flat topology. A re-encoded sum would be larger for the sparse
messages of threshold encoding (each rank has its own τ, so a sum element is not a multiple of
one τ: it needs a float value beside its index, 8 bytes instead of 4, while the ranks'
non-zeros rarely coincide) and its float order would differ; and ``comm/`` stays free of any
knowledge of the message format. Inter-host bytes drop because each message crosses the
host boundary once per remote host instead of once per ring hop between hosts (a flat ring
whose rank order alternates hosts crosses the boundary at every hop).

Wire format of a bundle (``allgather``): ``uint32`` count, ``count`` × ``uint64`` lengths,
then the payloads, all little-endian; :func:`unpack_bundle` checks every length against the
bytes present before slicing.
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Callable, Sequence

import numpy as np

from sparkdl.comm.communicator import (
    Communicator,
    TrafficCounters,
    broadcast_destination,
    check_broadcast_root,
    check_reduce_op,
    reduce_destination,
)
from sparkdl.errors import CommunicationError, ConfigurationError

#: ``cluster.topology`` values.
TOPOLOGIES = ("auto", "flat", "hierarchical")

Exchange = Callable[[str], list[str]]
Connect = Callable[[int, int, Exchange], Communicator]

_COUNT = struct.Struct("<I")


def pack_bundle(messages: Sequence[bytes | memoryview]) -> bytes:
    """Several messages as one (see the module docstring)."""
    lengths = np.array([len(m) for m in messages], dtype="<u8")
    return b"".join([_COUNT.pack(len(messages)), lengths.tobytes(), *map(bytes, messages)])


def unpack_bundle(data: bytes | memoryview, expected: int, what: str = "bundle"
                  ) -> list[bytes]:
    """The messages of :func:`pack_bundle` output; raises :class:`CommunicationError`, naming
    the bundle as ``what``, when it does not hold exactly ``expected`` messages that fill it."""
    data = memoryview(data).cast("B")
    if len(data) < _COUNT.size:
        raise CommunicationError(f"{what} of {len(data)} bytes has no header")
    (count,) = _COUNT.unpack_from(data)
    head = _COUNT.size + 8 * count
    if count != expected or len(data) < head:
        raise CommunicationError(
            f"{what} holds {count} messages in {len(data)} bytes, expected {expected}"
        )
    lengths = np.frombuffer(data[_COUNT.size : head], dtype="<u8")
    if int(lengths.sum()) != len(data) - head:
        raise CommunicationError(
            f"{what}'s lengths add up to {int(lengths.sum())} bytes, {len(data) - head} present"
        )
    out, at = [], head
    for length in lengths.tolist():
        out.append(bytes(data[at : at + length]))
        at += length
    return out


def host_groups(hosts: Sequence[str]) -> list[list[int]]:
    """World ranks grouped by host, hosts ordered by their lowest rank."""
    groups: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        groups.setdefault(host, []).append(rank)
    return list(groups.values())


class RoundError(CommunicationError):
    """The world's rendezvous round failed (its errors number the ranks in the world)."""


class RingErrors:
    """A context that prefixes a :class:`CommunicationError` raised in it with which group's
    ring failed and the world rank of each of that ring's ranks (its own errors can only
    number them within the group); a :class:`RoundError` passes as it is."""

    def __init__(self, group: Sequence[int], host: int | str | None = None) -> None:
        which = "the leaders' ring" if host is None else f"the ring of host {host!r}"
        ranks = ", ".join(str(r) for r in range(len(group)))
        self.name = f"{which} (ranks {ranks} = world ranks {', '.join(map(str, group))})"

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: object) -> None:
        if isinstance(error, CommunicationError) and not isinstance(error, RoundError):
            raise CommunicationError(f"{self.name}: {error}") from error


def check_hosts(hosts: Sequence[str], world_size: int) -> None:
    """Raise :class:`ConfigurationError` unless ``hosts`` names one host per rank."""
    if len(hosts) != world_size:
        raise ConfigurationError(
            f"hosts: expected one per rank ({world_size}), got {len(hosts)}: {list(hosts)}"
        )


def wants_hierarchy(topology: str, hosts: Sequence[str]) -> bool:
    """Whether ``topology`` over ranks on ``hosts`` means two levels: ``hierarchical``
    always, ``auto`` when there is more than one host and some host has two ranks or more."""
    if topology not in TOPOLOGIES:
        raise ConfigurationError(f"topology: expected one of {list(TOPOLOGIES)}, got {topology!r}")
    groups = host_groups(hosts)
    if topology == "auto":
        return len(groups) > 1 and max(len(g) for g in groups) > 1
    return topology == "hierarchical"


class HierarchicalCommunicator(Communicator):
    """Collectives in two levels: the ranks of each host, then one leader per host.

    Args:
        rank: this rank in the world.
        groups: world ranks per host (:func:`host_groups`), the same on every rank.
        local: the communicator of this host's ranks (ordered as in ``groups``).
        leaders: the communicator of the hosts' leaders, on leaders only (``None`` elsewhere,
            and allowed to be ``None`` with one host).
        host_names: each group's host, for errors (else they number the hosts).
    """

    topology = "hierarchical"

    def __init__(
        self,
        rank: int,
        groups: Sequence[Sequence[int]],
        local: Communicator,
        leaders: Communicator | None,
        host_names: Sequence[str] | None = None,
    ) -> None:
        self.rank = rank
        self.groups = [list(g) for g in groups]
        self.world_size = sum(len(g) for g in self.groups)
        self.host = next(h for h, g in enumerate(self.groups) if rank in g)
        self.local = local
        self.leaders = leaders
        self.is_leader = local.rank == 0
        if self.is_leader and leaders is None and len(self.groups) > 1:
            raise ConfigurationError(f"rank {rank} leads host {self.host} but has no leaders' ring")
        self.timeout_s = float(getattr(local, "timeout_s", 120.0))
        #: Each group's host, as errors name it (its number without ``host_names``).
        self.host_names: list[int | str] = (list(range(len(self.groups))) if host_names is None
                                            else list(host_names))
        # errors of either ring name the world ranks of its ranks
        self._on_host = RingErrors(self.groups[self.host], self.host_names[self.host])
        # what a malformed bundle's error calls it: each host's own, and the other hosts'
        # bundles that this host's leader passes on
        self._bundle_names = [
            f"the bundle of host {name!r} (world ranks {', '.join(map(str, group))})"
            for name, group in zip(self.host_names, self.groups)]
        self._others_bundle_name = (
            f"the other hosts' bundle from the leader of host {self.host_names[self.host]!r} "
            f"(world rank {self.groups[self.host][0]})")
        self._on_leaders = RingErrors([g[0] for g in self.groups])
        local.name = self._on_host.name  # and the rings' own log lines too
        if leaders is not None:
            leaders.name = self._on_leaders.name
        # a leader's host sums, one kept buffer per vector shape reduced (e.g. the gradient,
        # and at an epoch's end the non-trainable statistics)
        self._buffers: dict[tuple[tuple[int, ...], np.dtype], np.ndarray] = {}

    def __repr__(self) -> str:
        return (f"HierarchicalCommunicator(rank={self.rank}, world_size={self.world_size}, "
                f"host={self.host}, hosts={len(self.groups)}, leader={self.is_leader})")

    @property
    def counters(self) -> TrafficCounters:  # type: ignore[override]
        """Both levels' traffic together (see :attr:`inter_host_counters` for the part
        between hosts)."""
        sent, received = self.local.counters.snapshot()
        outer = self.inter_host_counters.snapshot()
        return TrafficCounters(sent + outer[0], received + outer[1])

    @property
    def inter_host_counters(self) -> TrafficCounters:
        """What this rank sent to and received from other hosts (leaders only; else zero)."""
        if self.leaders is None:
            return TrafficCounters()
        return self.leaders.counters

    def _across_hosts(self) -> bool:
        """Whether this rank talks to other hosts (a leader, with more than one host)."""
        return self.leaders is not None and self.leaders.world_size > 1

    @property
    def _several_hosts(self) -> bool:
        return len(self.groups) > 1

    def allgather(self, message: bytes | memoryview) -> list[bytes]:
        with self._on_host:
            mine = self.local.allgather(message)
        others = b""
        if self.is_leader and self._across_hosts():
            assert self.leaders is not None
            with self._on_leaders:
                bundles = self.leaders.allgather(pack_bundle(mine))
            others = pack_bundle([b for h, b in enumerate(bundles) if h != self.host])
        if self._several_hosts:
            with self._on_host:
                others = self.local.broadcast(others if self.is_leader else None, root=0)
        remote = (unpack_bundle(others, len(self.groups) - 1, self._others_bundle_name)
                  if self._several_hosts else [])
        out: list[bytes] = [b""] * self.world_size
        for h, group in enumerate(self.groups):
            messages = mine if h == self.host else unpack_bundle(
                remote[h if h < self.host else h - 1], len(group), self._bundle_names[h])
            for rank, m in zip(group, messages):
                out[rank] = m
        return out

    def allreduce(
        self, array: np.ndarray, op: str = "sum", *, out: np.ndarray | None = None
    ) -> np.ndarray:
        check_reduce_op(op)
        reduce_destination(np.asarray(array), out)
        with self._on_host:
            host = self.local.allreduce(array, "sum", out=self._host_sum(out))
        return self._across_and_back(host, op, out)

    def allreduce_pieces(
        self, pieces: Sequence[np.ndarray], op: str = "sum", *, out: np.ndarray | None = None
    ) -> np.ndarray:
        check_reduce_op(op)
        # the host's communicator reads the pieces in place (the TCP ring never concatenates)
        with self._on_host:
            host = self.local.allreduce_pieces(pieces, "sum", out=self._host_sum(out))
        return self._across_and_back(host, op, out)

    def _host_sum(self, out: np.ndarray | None) -> np.ndarray | None:
        """Where this rank's host sum goes: ``out``, except on a leader between hosts, where
        a kept buffer holds it (the leaders then sum into ``out``: no copy, no new pages)."""
        if out is None or not (self.is_leader and self._several_hosts):
            return out
        key = (out.shape, out.dtype)
        buffer = self._buffers.get(key)
        if buffer is None:
            buffer = self._buffers[key] = np.empty_like(out)
        return buffer

    def _across_and_back(self, total: np.ndarray, op: str, out: np.ndarray | None
                         ) -> np.ndarray:
        """The world's reduction from this host's sum ``total``, in ``out`` when given: the
        leaders sum their hosts' sums, and each leader broadcasts the result to its host,
        whose other ranks receive it in place."""
        if self._several_hosts:
            if self.is_leader:
                assert self.leaders is not None
                with self._on_leaders:
                    total = self.leaders.allreduce(total, "sum", out=out)
            with self._on_host:
                total = self.local.broadcast_into(total, root=0)
        if op == "mean":
            total /= total.dtype.type(self.world_size)  # never the input: a result array
        return total if out is None else out

    def _broadcast_hops(self, root: int) -> list[tuple[Communicator, RingErrors, int, bool]]:
        """The rings a broadcast from ``root`` crosses on this rank, in order: each ring, its
        lock, the ring's root, and whether this rank holds the data entering it (the root's
        host ring, then the leaders', then the other hosts' rings from their leaders)."""
        root_host = next(h for h, g in enumerate(self.groups) if root in g)
        hops: list[tuple[Communicator, RingErrors, int, bool]] = []
        if self.host == root_host:
            hops.append((self.local, self._on_host, self.groups[root_host].index(root),
                         self.rank == root))
        if self._across_hosts() and self.is_leader:
            assert self.leaders is not None
            hops.append((self.leaders, self._on_leaders, root_host, self.host == root_host))
        if self.host != root_host:  # (then there are several hosts)
            hops.append((self.local, self._on_host, 0, self.is_leader))
        return hops

    def broadcast(self, message: bytes | memoryview | None, root: int = 0) -> bytes:
        check_broadcast_root(root, self.world_size)
        data = message if self.rank == root else None
        for ring, lock, ring_root, holds in self._broadcast_hops(root):
            with lock:
                data = ring.broadcast(data if holds else None, ring_root)
        assert isinstance(data, bytes)  # what the last ring delivered
        return data

    def broadcast_into(self, array: np.ndarray, root: int = 0) -> np.ndarray:
        # as broadcast, each ring receiving in place
        check_broadcast_root(root, self.world_size)
        broadcast_destination(array, writable=self.rank != root)
        for ring, lock, ring_root, _ in self._broadcast_hops(root):
            with lock:
                ring.broadcast_into(array, ring_root)
        return array

    def barrier(self) -> None:
        with self._on_host:
            self.local.barrier()
        if self._several_hosts:
            if self._across_hosts():
                assert self.leaders is not None
                with self._on_leaders:
                    self.leaders.barrier()
            with self._on_host:
                self.local.barrier()

    def close(self) -> None:
        try:
            self.local.close()
        finally:
            if self.leaders is not None:
                self.leaders.close()


def connect_hierarchical(
    rank: int,
    world_size: int,
    exchange: Exchange,
    connect: Connect,
    *,
    hosts: Sequence[str],
    timeout_s: float = 60.0,
) -> HierarchicalCommunicator:
    """Build the two levels with ``connect(rank, size, exchange)`` (e.g. a TCP ring) in one
    round of ``exchange``: the host's ring connects on a helper thread while, on a leader, the
    leaders' ring connects on this one, and both rings' addresses ride in the same round
    (:class:`_SharedRound`). Every rank takes part in that one round, whether or not its
    groups need it; ``timeout_s`` bounds the wait for the host ring's address and for its
    connecting."""
    check_hosts(hosts, world_size)
    groups = host_groups(hosts)
    mine = next(g for g in groups if rank in g)
    heads = [g[0] for g in groups]
    shared = _SharedRound(exchange, timeout_s)
    local: list[Communicator] = []
    failed: list[BaseException] = []
    host_ring_errors = RingErrors(mine, hosts[rank])

    def connect_host_ring() -> None:
        try:
            with host_ring_errors:
                local.append(connect(mine.index(rank), len(mine), shared.host_ring(mine)))
        except BaseException as exc:  # raised on the caller's thread
            failed.append(exc)
        finally:
            shared.host_ring_settled()  # a one-rank ring takes no round; a failed one, maybe

    helper = threading.Thread(target=connect_host_ring, name="sparkdl-host-ring", daemon=True)
    helper.start()
    leaders = None
    try:
        try:
            if rank in heads:
                with RingErrors(heads):
                    leaders = connect(heads.index(rank), len(heads), shared.leaders_ring(heads))
            shared.run()  # a non-leader, or a one-rank leaders' ring: the round all the same
        except BaseException as exc:
            shared.abort(exc)  # the host's ring stops waiting for a round
            raise
        finally:
            helper.join(timeout_s + 1.0)  # the round is over: what is left is its connecting
        if helper.is_alive():
            raise CommunicationError(
                f"{host_ring_errors.name} did not connect in {timeout_s:g} s")
        if failed:
            raise failed[0]
    except BaseException:
        for comm in (*local, leaders):
            if comm is not None:
                comm.close()
        raise
    return HierarchicalCommunicator(rank, groups, local[0], leaders,
                                    host_names=[hosts[g[0]] for g in groups])


class _SharedRound:
    """One round of the world's ``exchange`` for two rings: each rank publishes the JSON pair
    ``[its host ring's value, its leaders' ring's value]`` ("" where it has none).

    The host's ring (a helper thread) hands its value in and waits for the round; the
    caller's thread runs the round (:meth:`run`, also from the leaders' ring's exchange) once
    that value is in or will not come (:meth:`host_ring_settled`), and always ends it: run,
    failed or :meth:`abort`-ed. So the host ring's wait lasts as long as the round itself, as
    a ring's own call of ``exchange`` would; the caller's wait for the host ring's value is
    bounded by ``timeout_s``."""

    def __init__(self, exchange: Exchange, timeout_s: float) -> None:
        self._exchange = exchange
        self._timeout_s = timeout_s
        self._values = ["", ""]
        self._settled = threading.Event()  # the host ring's value is in, or will not come
        self._over = threading.Event()  # the round ran, failed or was aborted
        self._pairs: list[list[str]] | None = None
        self._error: BaseException | None = None
        self._used = [False, False]

    def host_ring(self, group: list[int]) -> Exchange:
        """The host's ring's exchange among ``group`` (world ranks)."""
        return self._part(0, group)

    def leaders_ring(self, group: list[int]) -> Exchange:
        """The leaders' ring's exchange among ``group`` (world ranks)."""
        return self._part(1, group)

    def host_ring_settled(self) -> None:
        """The host's ring has handed in its value, or never will."""
        self._settled.set()

    def run(self) -> None:
        """Run the round on the caller's thread, unless it is over."""
        if self._over.is_set():
            return
        try:
            if not self._settled.wait(self._timeout_s):
                raise RoundError(f"the host's ring gave no address in {self._timeout_s:g} s")
            try:
                values = self._exchange(json.dumps(self._values))
            except CommunicationError as exc:
                raise RoundError(str(exc)) from exc
            self._pairs = [_pair(rank, value) for rank, value in enumerate(values)]
        except BaseException as exc:
            self._error = exc
            raise
        finally:
            self._over.set()

    def abort(self, error: BaseException) -> None:
        """The round will not run: the host's ring, waiting for it, fails at once."""
        if not self._over.is_set():
            self._error = error
            self._over.set()

    def _part(self, index: int, group: list[int]) -> Exchange:
        def sub_exchange(value: str) -> list[str]:
            if self._used[index]:
                raise RoundError("a group's ring may use one round of the rendezvous")
            self._used[index] = True
            self._values[index] = value
            if index == 0:
                self.host_ring_settled()
                self._over.wait()  # the caller's thread ends the round, whatever happens
            else:
                self.run()
            if self._pairs is None:
                raise RoundError(f"the rendezvous round failed: {self._error}")
            return [self._pairs[r][index] for r in group]

        return sub_exchange


def _pair(rank: int, value: str) -> list[str]:
    """Rank ``rank``'s ``[host ring's, leaders' ring's]`` values from its published JSON."""
    try:
        pair = json.loads(value)
    except (TypeError, ValueError):
        pair = None
    if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(v, str) for v in pair)):
        raise RoundError(
            f"rank {rank} published {value!r} in the rendezvous, expected a JSON pair of "
            "addresses"
        )
    return pair
