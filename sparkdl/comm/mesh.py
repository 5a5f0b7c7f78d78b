"""Log-depth collectives over direct TCP links (``cluster.mesh``, DL4J's ``MeshBuildMode``).

The ring (:mod:`sparkdl.comm.tcp`) costs ``N-1`` sequential hops per allgather: fine for large
messages (it is bandwidth-optimal) but latency-bound for small ones at many ranks. A
:class:`MeshCommunicator` keeps the ring and adds ``O(log N)`` more authenticated links per
rank, over which it runs:

- **allgather** — Bruck's algorithm: in step ``k`` (``d = 2**k``) rank ``r`` sends the
  ``min(d, N-d)`` messages it holds (its own and those of ranks ``r-1, r-2, ...``) to rank
  ``r+d`` and receives as many from ``r-d``: ``ceil(log2 N)`` steps for any ``N``, and the same
  ``N-1`` messages received per rank as on the ring. A step's bundle is the messages' lengths
  (uint64 each) then their bytes; a bundle that does not hold exactly the expected count is
  refused.
- **broadcast** — a binomial tree over the same links: in step ``k``, with
  ``v = (r - root) mod N``, ranks with ``v < d`` send to ``r+d`` (when ``v + d < N``) and
  ranks with ``d <= v < 2d`` receive from ``r-d``.
- **allreduce** — recursive halving (reduce-scatter) then recursive doubling (allgather)
  between pairs ``v`` and ``v XOR d`` of ``P``, the largest power of two ``<= N``
  (Rabenseifner). With ``N = P + rem``, ranks ``2i < 2*rem`` first send their whole vector to
  ``2i+1``, which adds it, and get the result back at the end. Summation order: every addition
  is ``lower rank's partial + higher rank's partial``, and each element is summed once, by the
  rank that owns it after the halving, then copied, so every rank gets identical bits (and the
  ring's bits wherever the sum is exact, e.g. integer-valued floats).

Every link is a :class:`~sparkdl.comm.tcp.TcpRingCommunicator` (one socket to a peer, one from
a peer), so frames, MACs (``wire_integrity="mac"``), frame checks and failure handling are the
ring's: each frame carries a mesh op code, the step and the collective's sequence number, so
ranks that call collectives in a different order fail with "is out of step". A broadcast and
an allreduce open with an **announce** frame on the ring (step 0: the root, or the vector's
bytes, as uint64), since their own steps run over other links: a rank that called another
collective there, or the ring's own under ``auto``, or another root or size, is told at that
first frame, on both sides, instead of waiting on a link its peer never writes to until the
timeout (allgather needs none: Bruck's first step is the ring). A whole
collective, all its steps, is bounded by one ``timeout_s``; any failure breaks every link of
the communicator (so neighbours fail promptly too).

Mode (``cluster.mesh``): ``plain`` — the ring only (no extra links); ``mesh`` — these
algorithms for every allgather, broadcast and allreduce; ``auto`` — these when
``N >= AUTO_MIN_RANKS`` and the message is at most :data:`AUTO_MAX_GATHER_BYTES` (allgather
and broadcast: the largest message of the previous call of that collective, which every rank
knows, so all ranks choose alike without an extra round) or :data:`AUTO_MAX_REDUCE_BYTES`
(allreduce: the vector), else the ring.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from sparkdl.comm import _auth
from sparkdl.comm.communicator import (
    Communicator,
    Segments,
    check_broadcast_root,
    reduce_destination,
)
from sparkdl.comm.network import listen_on, split_host_port
from sparkdl.comm.tcp.formation import _Acceptor, _connect, connect_ring
from sparkdl.comm.tcp.frames import _OP_NAMES, _Peer, _tune
from sparkdl.comm.tcp.ring import TcpRingCommunicator
from sparkdl.errors import CommunicationError, ConfigurationError

MESH_MODES = ("plain", "mesh", "auto")
AUTO_MIN_RANKS = 4
"""In ``auto``, fewer ranks use the ring: at 2 and 3 ranks it takes as many steps."""
AUTO_MAX_GATHER_BYTES = 8 << 10
"""In ``auto``, allgather and broadcast messages up to this size use the log-depth algorithms:
across hosts at 4 to 16 ranks, 100 Mbit/s and 1 Gbit/s, Bruck took 0.3-0.6x the ring's time
at 1-4 KiB, about the same at 16 KiB, and up to 2x at 256 KiB (``jobs/benchmark.py
collectives --mesh``; docs/design.md, Communication)."""
AUTO_MAX_REDUCE_BYTES = 64 << 10
"""In ``auto``, allreduce vectors up to this size use halving-doubling (0.36-0.85x the ring's
time at 4-64 KiB and 4 to 16 ranks; at 1 MiB it lost at 100 Mbit/s)."""

MESH_MAX_BYTES = 64 << 20
"""Even in ``mesh``, larger messages and vectors go through the ring: its blocks are bounded,
where the log-depth algorithms receive half a vector (or a whole message) at once, a copy the
size of a model's gradient (``jobs/benchmark.py wire-size``). At that size latency no longer
matters, and both move about the same bytes per rank."""

_OP_ALLGATHER = 5
_OP_BROADCAST = 6
_OP_ALLREDUCE = {np.dtype(np.float32): 7, np.dtype(np.float64): 8}
_LEN = struct.Struct("<Q")
_MESH_CTX = b"sparkdl-mesh-v1:"
_T = TypeVar("_T")


def distances(n: int) -> list[int]:
    """``1, 2, 4, ...`` below ``n``: the steps of a log-depth collective among ``n`` ranks."""
    out, d = [], 1
    while d < n:
        out.append(d)
        d *= 2
    return out


def _fold(n: int) -> tuple[int, int]:
    """``(P, rem)``: the largest power of two ``P <= n`` and ``n - P``."""
    p = 1 << (n.bit_length() - 1)
    return p, n - p


def _virtual(rank: int, rem: int) -> int | None:
    """The rank among the ``P`` that take part in halving-doubling (``None``: folded away)."""
    if rank < 2 * rem:
        return rank // 2 if rank % 2 else None
    return rank - rem


def _actual(v: int, rem: int) -> int:
    return 2 * v + 1 if v < rem else v + rem


def _partners(rank: int, n: int) -> list[int]:
    """The ranks ``rank`` exchanges with in an allreduce (fold partner, then by distance)."""
    p, rem = _fold(n)
    out = [rank ^ 1] if rank < 2 * rem else []
    v = _virtual(rank, rem)
    if v is not None:
        out += [_actual(v ^ d, rem) for d in distances(p)]
    return out


def _in_links(rank: int, n: int) -> list[str]:
    """Names of the links into ``rank`` besides the ring, in the order of its published ports:
    ``s<d>`` from ``rank - d`` (d = 2, 4, ...), ``p<a>-<b>`` from its allreduce partners."""
    names = [f"s{d}" for d in distances(n)[1:]]
    for q in _partners(rank, n):
        names.append(f"p{min(rank, q)}-{max(rank, q)}")
    return names


def _out_links(rank: int, n: int) -> list[tuple[str, int]]:
    """``(name, peer)`` of the links out of ``rank`` besides the ring."""
    out = [(f"s{d}", (rank + d) % n) for d in distances(n)[1:]]
    for q in _partners(rank, n):
        out.append((f"p{min(rank, q)}-{max(rank, q)}", q))
    return out


def _in_peer(name: str, rank: int, n: int) -> int:
    if name[0] == "s":
        return (rank - int(name[1:])) % n
    a, b = (int(x) for x in name[1:].split("-"))
    return b if a == rank else a


def _pack(messages: Sequence[bytes | bytearray | memoryview]) -> bytes:
    """A bundle: each message's length (uint64), then the messages (one copy)."""
    return b"".join([*(_LEN.pack(len(m)) for m in messages), *messages])


def _unpack(
    bundle: bytes | bytearray | memoryview, count: int, who: object, step: int
) -> list[memoryview]:
    view = memoryview(bundle).cast("B")
    head = _LEN.size * count
    bad = len(view) < head
    lengths: list[int] = []
    if not bad:
        lengths = [_LEN.unpack_from(view, i * _LEN.size)[0] for i in range(count)]
        bad = sum(lengths) != len(view) - head
    if bad:
        raise CommunicationError(
            f"{who} is out of step: a mesh allgather bundle of {len(view)} bytes at step {step} "
            f"does not hold {count} messages"
        )
    out, pos = [], head
    for length in lengths:
        out.append(view[pos : pos + length])
        pos += length
    return out


class MeshCommunicator(Communicator):
    """The ring plus log-depth links; build with :func:`connect_mesh`.

    Args:
        ring: the ring among the same ranks (also the distance-1 link of allgather/broadcast).
        shifts: distance ``d >= 2`` -> the link sending to ``rank + d``, receiving from
            ``rank - d``.
        pairs: allreduce partner rank -> the link sending to and receiving from it.
        mode: ``"mesh"`` or ``"auto"`` (see the module docstring).
    """

    def __init__(
        self,
        ring: TcpRingCommunicator,
        shifts: dict[int, TcpRingCommunicator],
        pairs: dict[int, TcpRingCommunicator],
        mode: str = "mesh",
    ) -> None:
        if mode not in ("mesh", "auto"):
            raise ConfigurationError(f"mesh mode: expected 'mesh' or 'auto', got {mode!r}")
        self.rank, self.world_size = ring.rank, ring.world_size
        self.counters = ring.counters
        self.timeout_s = ring.timeout_s
        self.mode = mode
        self.ring = ring
        self._shifts = {1: ring, **shifts}
        self._pairs = pairs
        self._last_gather = 0
        self._last_broadcast = 0
        self._closed = False

    def __repr__(self) -> str:
        return (
            f"MeshCommunicator(rank={self.rank}, world_size={self.world_size}, "
            f"mode={self.mode!r}, links={len(self._links())}, ring={self.ring!r})"
        )

    @property
    def wire_integrity(self) -> str:
        return self.ring.wire_integrity

    def _links(self) -> list[TcpRingCommunicator]:
        return [*self._shifts.values(), *self._pairs.values()]

    def _use_mesh(self, nbytes: int, limit: int = AUTO_MAX_GATHER_BYTES) -> bool:
        if self.world_size == 1:
            return False
        if self.mode == "mesh":
            return nbytes <= MESH_MAX_BYTES
        return self.world_size >= AUTO_MIN_RANKS and nbytes <= limit

    # Public collectives ---------------------------------------------------------------------

    def allgather(self, message: bytes | memoryview) -> list[bytes]:
        data = memoryview(message).cast("B")
        if not self._use_mesh(self._last_gather):
            out = self.ring.allgather(data)
        else:
            out = self._guard(lambda seq, dl: self._bruck(data, seq, dl))
        self._last_gather = max(len(m) for m in out)
        return out

    def broadcast(self, message: bytes | memoryview | None, root: int = 0) -> bytes:
        check_broadcast_root(root, self.world_size)
        if self.rank == root and message is None:
            raise ConfigurationError("broadcast: the root rank must pass a message, got None")
        if not self._use_mesh(self._last_broadcast):
            out = self.ring.broadcast(message, root)
        else:
            out = self._guard(lambda seq, dl: self._tree_broadcast(message, root, seq, dl))
        self._last_broadcast = len(out)
        return out

    def broadcast_into(self, array: np.ndarray, root: int = 0) -> np.ndarray:
        # every rank knows the size: all choose alike; the ring receives in place
        if not self._use_mesh(array.nbytes if isinstance(array, np.ndarray) else 0):
            return self.ring.broadcast_into(array, root)
        return super().broadcast_into(array, root)

    def allreduce(
        self, array: np.ndarray, op: str = "sum", *, out: np.ndarray | None = None
    ) -> np.ndarray:
        arr = np.asarray(array)
        if (
            op not in ("sum", "mean")
            or arr.dtype not in _OP_ALLREDUCE
            or not self._use_mesh(arr.nbytes, AUTO_MAX_REDUCE_BYTES)
        ):
            return self.ring.allreduce(arr, op, out=out)  # the ring reports bad arguments
        dst = reduce_destination(arr, out)
        src = np.ascontiguousarray(arr).reshape(-1)
        total = self._guard(lambda seq, dl: self._halving_doubling(src, seq, dl, dst))
        if op == "mean":
            total /= total.dtype.type(self.world_size)
        return total.reshape(arr.shape) if out is None else out

    def allreduce_pieces(
        self, pieces: Sequence[np.ndarray], op: str = "sum", *, out: np.ndarray | None = None
    ) -> np.ndarray:
        src = Segments(pieces)
        if src.dtype in _OP_ALLREDUCE and self._use_mesh(src.size * src.dtype.itemsize,
                                                         AUTO_MAX_REDUCE_BYTES):
            return self.allreduce(src.concatenate(), op, out=out)
        return self.ring.allreduce_pieces(pieces, op, out=out)  # read in place

    def barrier(self) -> None:
        self.allgather(b"")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for link in self._links():
            link.close()

    # Algorithms -----------------------------------------------------------------------------

    def _guard(self, run: Callable[[int, float], _T]) -> _T:
        """Run one log-depth collective under one sequence number and one deadline; on any
        failure break every link, so that every neighbour fails promptly too."""
        seq = self.ring._begin()  # one counter for ring and mesh collectives alike
        try:
            return run(seq, time.monotonic() + self.timeout_s)
        except CommunicationError as exc:
            text = str(exc)
            for link in self._links():
                if link._broken is None:
                    link._broken = text
                link._close_sockets()
            raise

    def _announce(self, op: int, seq: int, value: int, what: str, deadline: float) -> None:
        """Step 0 of a broadcast or allreduce, on the ring: send ``value`` (the root, or the
        vector's bytes) to the next rank and check the previous rank's against it, so that a
        rank in another collective (whose first frame differs) or with another root or size is
        out of step at once rather than never heard from on another link."""
        got = self.ring._exchange(op, 0, seq, memoryview(_LEN.pack(value)), True, _LEN.size,
                                  deadline)
        assert got is not None
        theirs = _LEN.unpack(bytes(got))[0]
        if theirs != value:
            raise CommunicationError(
                f"rank {self.rank}: {self.ring._prev_peer} is out of step: expected "
                f"{_OP_NAMES[op]} seq {seq} with {what} {value}, received {what} {theirs} "
                "(ranks called collectives with different sizes or roots)"
            )

    def _bruck(self, data: memoryview, seq: int, deadline: float) -> list[bytes]:
        n, r = self.world_size, self.rank
        held: list[memoryview] = [data]  # held[i]: rank (r - i)'s message
        for k, d in enumerate(distances(n)):
            count = min(d, n - d)
            link = self._shifts[d]
            got = link._exchange(
                _OP_ALLGATHER, k, seq, memoryview(_pack(held[:count])), True, None, deadline
            )
            assert got is not None
            held.extend(_unpack(got, count, link._prev_peer, k))
        out: list[bytes] = [b""] * n
        for i, m in enumerate(held):
            out[(r - i) % n] = bytes(m)
        return out

    def _tree_broadcast(
        self, message: bytes | memoryview | None, root: int, seq: int, deadline: float
    ) -> bytes:
        n, r = self.world_size, self.rank
        v = (r - root) % n
        self._announce(_OP_BROADCAST, seq, root, "root", deadline)
        data = memoryview(message).cast("B") if v == 0 else None  # type: ignore[arg-type]
        for k, d in enumerate(distances(n), start=1):
            link = self._shifts[d]
            if v < d and v + d < n:
                assert data is not None
                link._exchange(_OP_BROADCAST, k, seq, data, False, None, deadline)
            elif d <= v < 2 * d:
                got = link._exchange(_OP_BROADCAST, k, seq, None, True, None, deadline)
                assert got is not None
                data = memoryview(got).cast("B")
        assert data is not None
        return bytes(data)

    def _halving_doubling(self, src: np.ndarray, seq: int, deadline: float,
                          out: np.ndarray | None = None) -> np.ndarray:
        n, r = self.world_size, self.rank
        code = _OP_ALLREDUCE[src.dtype]
        self._announce(code, seq, src.nbytes, "bytes", deadline)
        p, rem = _fold(n)
        if out is None:
            x = src.copy()
        else:  # the caller's buffer is the working vector
            x = out
            np.copyto(x, src)
        isz = x.itemsize
        raw = x.view(np.uint8).data

        def swap(
            peer: int, step: int, send: tuple[int, int] | None, recv: tuple[int, int] | None
        ) -> np.ndarray | None:
            """Send elements ``send`` to ``peer`` while receiving ``recv`` from it."""
            link = self._pairs[peer]
            out = raw[send[0] * isz : send[1] * isz] if send is not None else None
            length = (recv[1] - recv[0]) * isz if recv is not None else None
            got = link._exchange(code, step, seq, out, recv is not None, length, deadline)
            return None if got is None else np.frombuffer(got, dtype=x.dtype)

        whole = (0, x.size)
        if r < 2 * rem:  # fold: the even rank's vector joins its odd neighbour's
            if r % 2 == 0:
                swap(r + 1, 0, whole, None)
            else:
                lower = swap(r - 1, 0, None, whole)
                assert lower is not None
                np.add(lower, x, out=x)
        v = _virtual(r, rem)
        steps = distances(p)
        if v is not None:
            base, extra = divmod(x.size, p)
            starts = [i * base + min(i, extra) for i in range(p + 1)]
            lo, hi = 0, p  # the blocks this rank is responsible for
            for i, d in enumerate(reversed(steps)):
                mid = (lo + hi) // 2
                keep, give = ((lo, mid), (mid, hi)) if v & d == 0 else ((mid, hi), (lo, mid))
                a, b = starts[keep[0]], starts[keep[1]]
                theirs = swap(_actual(v ^ d, rem), 1 + i, (starts[give[0]], starts[give[1]]),
                              (a, b))
                assert theirs is not None
                if v & d == 0:  # lower rank's partial + higher rank's partial
                    np.add(x[a:b], theirs, out=x[a:b])
                else:
                    np.add(theirs, x[a:b], out=x[a:b])
                lo, hi = keep
            for i, d in enumerate(steps):
                size = hi - lo
                other = (hi, hi + size) if v & d == 0 else (lo - size, lo)
                a, b = starts[other[0]], starts[other[1]]
                theirs = swap(_actual(v ^ d, rem), 1 + len(steps) + i,
                              (starts[lo], starts[hi]), (a, b))
                assert theirs is not None
                x[a:b] = theirs
                lo, hi = min(lo, other[0]), max(hi, other[1])
        last = 1 + 2 * len(steps)
        if r < 2 * rem:  # unfold: the odd rank returns the result
            if r % 2 == 0:
                result = swap(r + 1, last, None, whole)
                assert result is not None
                x[:] = result
            else:
                swap(r - 1, last, whole, None)
        return x


def connect_mesh(
    rank: int,
    world_size: int,
    exchange: Callable[[str], list[str]],
    *,
    secret: bytes,
    timeout_s: float = 60.0,
    bind_host: str = "127.0.0.1",
    advertise_host: str | None = None,
    port_range: tuple[int, int] | None = None,
    shared_memory: bool = True,
    wire_integrity: str = "none",
    mode: str = "mesh",
) -> Communicator:
    """Form the ring (:func:`~sparkdl.comm.tcp.connect_ring`) and, for ``mode`` ``"mesh"`` or
    ``"auto"`` with two ranks or more, the log-depth links: one listener per incoming link,
    whose ports travel with the ring's address in its one round of ``exchange``
    (``host:port|port,port,...``), each connection authenticated with ``secret`` under a
    context naming the link (shared memory only on the ring). ``"plain"`` returns the ring
    itself."""
    if mode not in MESH_MODES:
        raise ConfigurationError(f"mesh: expected one of {list(MESH_MODES)}, got {mode!r}")

    def ring(ring_exchange: Callable[[str], list[str]]) -> TcpRingCommunicator:
        return connect_ring(
            rank,
            world_size,
            ring_exchange,
            secret=secret,
            timeout_s=timeout_s,
            bind_host=bind_host,
            advertise_host=advertise_host,
            port_range=port_range,
            shared_memory=shared_memory,
            wire_integrity=wire_integrity,
        )

    if mode == "plain" or world_size == 1:
        return ring(exchange)
    links = _Links(rank, world_size, _auth.check_secret(secret), timeout_s, bind_host,
                   port_range, wire_integrity == "mac")
    try:
        comm = ring(links.exchange_with(exchange))
    except BaseException:
        links.abort()
        raise
    try:
        shifts, pairs = links.connect(comm)
    except BaseException:
        comm.close()
        raise
    return MeshCommunicator(comm, shifts, pairs, mode)


def _parse_ports(text: str, rank: int, count: int) -> list[int]:
    """The ``port,port,...`` a rank published after its ring address."""
    parts = str(text).split(",") if count else []
    if len(parts) != count or not all(x.isdigit() for x in parts):
        raise CommunicationError(
            f"rank {rank} published bad mesh ports {text!r} (expected {count})"
        )
    return [int(x) for x in parts]


class _Links:
    """The log-depth links of one rank while they form: listeners first (their ports go out
    with the ring's address), connections once the ring stands."""

    def __init__(
        self,
        rank: int,
        n: int,
        secret: bytes,
        timeout_s: float,
        bind_host: str,
        port_range: tuple[int, int] | None,
        mac: bool,
    ) -> None:
        self.rank, self.n, self.secret, self.mac = rank, n, secret, mac
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.names = _in_links(rank, n)
        self.acceptors: dict[str, _Acceptor] = {}
        self.outgoing: dict[str, tuple[socket.socket, _auth.Session, _Peer]] = {}
        self.ports: list[int] = []
        self.published: list[str] = []  # every rank's link ports, as published
        self.hosts: list[str] = []  # every rank's host, from its ring address
        try:
            for name in self.names:
                listener = listen_on(bind_host, port_range, configure=_tune)
                self.ports.append(listener.getsockname()[1])
                ctx = _MESH_CTX + f"{name}:{rank}".encode()
                acceptor = _Acceptor(
                    listener, secret, ctx, (_in_peer(name, rank, n), n), self.deadline
                )
                self.acceptors[name] = acceptor
                acceptor.start()
        except BaseException:
            self.abort()
            raise

    def exchange_with(self, exchange: Callable[[str], list[str]]) -> Callable[[str], list[str]]:
        """The ring's exchange, carrying this rank's link ports along."""

        def wrapped(address: str) -> list[str]:
            values = exchange(f"{address}|{','.join(map(str, self.ports))}")
            self.published = [str(v).partition("|")[2] for v in values]
            ring_addresses = [str(v).partition("|")[0] for v in values]
            self.hosts = [split_host_port(a)[0] for a in ring_addresses]
            return ring_addresses

        return wrapped

    def connect(
        self, ring: TcpRingCommunicator
    ) -> tuple[dict[int, TcpRingCommunicator], dict[int, TcpRingCommunicator]]:
        rank, n = self.rank, self.n
        done = False
        try:
            ports = [_parse_ports(t, q, len(_in_links(q, n))) for q, t in enumerate(self.published)]
            addresses = self.hosts
            for name, peer in _out_links(rank, n):
                host = addresses[peer]
                port = ports[peer][_in_links(peer, n).index(name)]
                ctx = _MESH_CTX + f"{name}:{peer}".encode()
                sock, _, _, _, session = _connect(
                    host, port, peer, rank, n, self.secret, self.deadline, False, ctx=ctx
                )
                self.outgoing[name] = (sock, session, _Peer(peer, host, port))
            for name in self.names:
                if self.acceptors[name].wait() is None:
                    raise CommunicationError(
                        f"rank {rank}: rank {_in_peer(name, rank, n)} did not connect and "
                        f"authenticate its mesh link {name} within {self.timeout_s:.1f} s"
                    )
            shifts: dict[int, TcpRingCommunicator] = {}
            pairs: dict[int, TcpRingCommunicator] = {}
            handshake = _auth.CONNECTOR_REPLY_BYTES + _auth.HANDSHAKE_BYTES_ACCEPTOR
            for name in self.names:
                acc = self.acceptors[name]
                sock_out, session, next_peer = self.outgoing[name]
                prev = _in_peer(name, rank, n)
                sent, received = acc.handshake_bytes
                ring.counters.bytes_sent += 2 * handshake + sent
                ring.counters.bytes_received += 2 * handshake + received
                link = TcpRingCommunicator(
                    rank,
                    n,
                    acc._result,
                    sock_out,
                    _Peer(prev, addresses[prev], ports[prev][0]),
                    next_peer,
                    timeout_s=self.timeout_s,
                    counters=ring.counters,
                    tx_mac_key=session.key_c2a if self.mac else None,
                    rx_mac_key=acc.session.key_c2a if self.mac and acc.session else None,
                )
                if name[0] == "s":
                    shifts[int(name[1:])] = link
                else:
                    pairs[prev] = link
            done = True
            return shifts, pairs
        finally:
            self.stop()
            if not done:
                self.abort()

    def stop(self) -> None:
        for acc in self.acceptors.values():
            acc.stop()

    def abort(self) -> None:
        """Stop accepting and close every connection made so far."""
        self.stop()
        for sock, _, _ in self.outgoing.values():
            with contextlib.suppress(OSError):
                sock.close()
        for acc in self.acceptors.values():
            if acc._result is not None:
                with contextlib.suppress(OSError):
                    acc._result.close()
