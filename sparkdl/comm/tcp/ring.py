"""The TCP ring communicator: its collectives, as frames to send and steps to receive that the
pump (:mod:`~sparkdl.comm.tcp.pump`) drives through both connections (:mod:`sparkdl.comm.tcp`
describes the protocol)."""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Callable, Sequence

import numpy as np

from sparkdl.comm import _shm
from sparkdl.comm.communicator import (
    Communicator,
    Segments,
    TrafficCounters,
    broadcast_destination,
    check_broadcast_root,
    reduce_destination,
)
from sparkdl.comm.tcp.frames import (
    _OP_ALLGATHER,
    _OP_BROADCAST,
    _OP_NAMES,
    _SHM_FLAG,
    MAX_MESSAGE_BYTES,
    REDUCE_BLOCK_BYTES,
    SHM_MIN_BYTES,
    SHM_SLOT_BYTES,
    _chunk_of,
    _header,
    _Mac,
    _MacOut,
    _Out,
    _Peer,
    _RecvStep,
    _reduce_code,
    _ShmData,
)
from sparkdl.comm.tcp.pump import _Links, _Pump
from sparkdl.errors import CommunicationError, ConfigurationError

log = logging.getLogger("sparkdl.comm")


class TcpRingCommunicator(Communicator):
    """Collectives over a ring of authenticated TCP connections, with shared memory for the
    payload of same-host links; build with :func:`connect_ring`."""

    shm_min_bytes: int = SHM_MIN_BYTES
    """Payloads at least this long use the shared-memory link to the next rank, if any."""
    shm_chunk_bytes: int = SHM_SLOT_BYTES
    """At most this many payload bytes per slot (and notice); at most the slot size."""
    max_message_bytes: int = MAX_MESSAGE_BYTES
    """Longest payload a peer may declare in a frame header."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        prev_sock: socket.socket | None,
        next_sock: socket.socket | None,
        prev_peer: _Peer | None,
        next_peer: _Peer | None,
        *,
        timeout_s: float,
        counters: TrafficCounters | None = None,
        rx_shm: _shm.ShmLink | None = None,
        tx_shm: _shm.ShmLink | None = None,
        tx_mac_key: bytes | None = None,
        rx_mac_key: bytes | None = None,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.counters = counters or TrafficCounters()
        self.timeout_s = timeout_s
        self._prev = prev_sock
        self._next = next_sock
        self._prev_peer = prev_peer
        self._next_peer = next_peer
        self._rx = rx_shm  # shared memory on the link prev -> me
        self._tx = tx_shm  # shared memory on the link me -> next
        if (tx_mac_key is None) != (rx_mac_key is None) or (
            tx_mac_key is not None and (rx_shm is not None or tx_shm is not None)
        ):
            raise ConfigurationError("wire MACs need keys for both links and no shared memory")
        self._tx_mac = _Mac(tx_mac_key) if tx_mac_key is not None else None
        self._seq = 0
        self._broken: str | None = None
        self._closed = False
        # What every collective's pump drives: both connections, none on a ring of one rank.
        self._links: _Links | None = None
        if prev_sock is not None:
            assert next_sock is not None and prev_peer is not None and next_peer is not None
            self._links = _Links(
                prev_sock,
                next_sock,
                prev_peer,
                next_peer,
                rx_shm,
                tx_shm,
                _Mac(rx_mac_key) if rx_mac_key is not None else None,
                self.counters,
            )
        for sock in (prev_sock, next_sock):
            if sock is not None:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def __repr__(self) -> str:
        return (
            f"TcpRingCommunicator(rank={self.rank}, world_size={self.world_size}, "
            f"prev={self._prev_peer}, next={self._next_peer}, "
            f"shm_in={self._rx is not None}, shm_out={self._tx is not None}, "
            f"mac={self._tx_mac is not None})"
        )

    @property
    def wire_integrity(self) -> str:
        """``"mac"`` when every record on the wire carries a verified keyed MAC, else
        ``"none"``."""
        return "none" if self._tx_mac is None else "mac"

    @property
    def shared_memory(self) -> tuple[bool, bool]:
        """Whether the links (prev -> me, me -> next) use shared memory."""
        return self._rx is not None, self._tx is not None

    # Public collectives ---------------------------------------------------------------------

    def allreduce(
        self, array: np.ndarray, op: str = "sum", *, out: np.ndarray | None = None
    ) -> np.ndarray:
        arr = np.asarray(array)
        code = _reduce_code(op, arr.dtype)
        dst = reduce_destination(arr, out)
        total = self._reduce(Segments([np.ascontiguousarray(arr)]), code, op, dst)
        return total.reshape(arr.shape) if out is None else out

    def allreduce_pieces(
        self, pieces: Sequence[np.ndarray], op: str = "sum", *, out: np.ndarray | None = None
    ) -> np.ndarray:
        """:meth:`allreduce` of the concatenation of ``pieces``, read in place: the ring sends
        and sums straight from them (no concatenated copy); the same bits."""
        src = Segments(pieces)
        code = _reduce_code(op, src.dtype)
        total = self._reduce(src, code, op, reduce_destination(src, out))
        return total if out is None else out

    def _reduce(self, src: Segments, code: int, op: str, dst: np.ndarray | None
                ) -> np.ndarray:
        """The flat ``op`` of ``src`` over the ranks, into ``dst`` (else a new array)."""
        if self.world_size > 1:
            total = self._ring_allreduce(src, code, dst)
        else:
            total = src.concatenate(dst)
        if op == "mean" and self.world_size > 1:  # over one rank: the same bits
            total /= total.dtype.type(self.world_size)
        return total

    def allgather(self, message: bytes | memoryview) -> list[bytes]:
        data = memoryview(message).cast("B")
        n, r = self.world_size, self.rank
        if n == 1:
            return [bytes(data)]
        seq = self._begin()
        msgs: list[bytes | bytearray | memoryview] = [b""] * n
        msgs[r] = data
        sendq = self._out()
        self._send_frame(sendq, _OP_ALLGATHER, 0, seq, data)
        steps = []
        for k in range(n - 1):
            source = (r - k - 1) % n
            forward = k + 1 <= n - 2
            steps.append(self._gather_step(k, source, msgs, sendq, seq, forward))
        self._pump("allgather", _OP_ALLGATHER, seq, sendq, steps)
        return [bytes(m) for m in msgs]

    def broadcast(self, message: bytes | memoryview | None, root: int = 0) -> bytes:
        check_broadcast_root(root, self.world_size)
        if self.rank == root and message is None:
            raise ConfigurationError("broadcast: the root rank must pass a message, got None")
        data = memoryview(message).cast("B") if self.rank == root else None  # type: ignore[arg-type]
        return bytes(self._broadcast(root, data))

    def broadcast_into(self, array: np.ndarray, root: int = 0) -> np.ndarray:
        """:meth:`Communicator.broadcast_into`, received straight into ``array`` (no new
        buffer, no copy) and passed on from there."""
        check_broadcast_root(root, self.world_size)
        raw = broadcast_destination(array, writable=self.rank != root)
        self._broadcast(root, raw if self.rank == root else None, into=raw)
        return array

    def _broadcast(self, root: int, data: memoryview | None, into: memoryview | None = None
                   ) -> bytes | bytearray | memoryview:
        """One frame from ``root`` (which passes ``data``) along the ring; returns the payload
        this rank ends with: ``data`` on the root, else what arrived (in ``into`` when
        given: a payload of exactly its length)."""
        n, r = self.world_size, self.rank
        if r == root:
            assert data is not None
            if n > 1:
                seq = self._begin()
                sendq = self._out()
                self._send_frame(sendq, _OP_BROADCAST, 0, seq, data)
                self._pump("broadcast", _OP_BROADCAST, seq, sendq, [])
            return data
        seq = self._begin()
        sendq = self._out()
        result: list[bytes | bytearray | memoryview] = [b"" if into is None else into]
        forward = (r + 1) % n != root
        step = self._gather_step(0, 0, result, sendq, seq, forward, op=_OP_BROADCAST,
                                 into=into)
        self._pump("broadcast", _OP_BROADCAST, seq, sendq, [step])
        return result[0]

    def barrier(self) -> None:
        self.allgather(b"")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._close_sockets()
        for link in (self._rx, self._tx):
            if link is not None:
                link.close()

    # Framing --------------------------------------------------------------------------------

    def _header(self, sendq: _Out, op: int, step: int, seq: int, length: int) -> bool:
        """Queue a frame header; returns whether its payload goes through shared memory."""
        shm = self._tx is not None and length > 0 and length >= self.shm_min_bytes
        sendq.header(_header(op | _SHM_FLAG if shm else op, step, seq, length), length)
        return shm

    def _send_frame(self, sendq: _Out, op: int, step: int, seq: int, data: memoryview) -> None:
        shm = self._header(sendq, op, step, seq, len(data))
        if len(data):
            if shm:
                sendq.append(_ShmData(data))
            else:
                sendq.data(data)

    def _send_frame_parts(self, sendq: _Out, op: int, step: int, seq: int,
                          parts: list[memoryview]) -> None:
        """:meth:`_send_frame` of the concatenation of ``parts``, queued part by part."""
        if len(parts) == 1:
            self._send_frame(sendq, op, step, seq, parts[0])
            return
        shm = self._header(sendq, op, step, seq, sum(len(p) for p in parts))
        for part in parts:
            if not len(part):
                continue
            if shm:
                sendq.append(_ShmData(part))
            else:
                sendq.data(part)

    # Ring algorithms ------------------------------------------------------------------------

    def _gather_step(
        self,
        k: int,
        slot: int,
        msgs: list[bytes | bytearray | memoryview],
        sendq: _Out,
        seq: int,
        forward: bool,
        op: int = _OP_ALLGATHER,
        into: memoryview | None = None,
    ) -> _RecvStep:
        """Receive one variable-size message into ``msgs[slot]``, forwarding it if asked;
        with ``into``, a message of exactly ``len(into)`` bytes received straight there."""

        def store(buf: bytearray) -> None:
            msgs[slot] = buf

        next_step = k if op == _OP_BROADCAST else k + 1
        via_shm = [False]

        def on_header(length: int) -> None:
            if forward:
                via_shm[0] = self._header(sendq, op, next_step, seq, length)

        def on_data(view: memoryview, lo: int, hi: int) -> None:
            if forward:
                if via_shm[0]:
                    sendq.append(_ShmData(view[lo:hi]))
                else:
                    sendq.data(view[lo:hi])

        if into is not None:
            return _RecvStep(k, len(into), lambda length: into, on_header, on_data)
        return _RecvStep(k, None, None, on_header, on_data, store=store)

    def _ring_allreduce(self, src: Segments, code: int, out: np.ndarray | None = None
                        ) -> np.ndarray:
        """Reduce-scatter then allgather, fully pipelined in one stream of ``2(n-1)`` framed
        chunks. Chunk ``c`` is summed in the fixed order c, c+1, ... around the ring, then its
        final bytes circulate, so every rank ends with identical bits. Partial sums are
        received straight into the output (or added straight from shared memory into it) and
        our own contribution added in place. ``src`` is read in place; ``out``: where to put
        the result (flat, apart from ``src``), else a new array."""
        n, r = self.world_size, self.rank
        if out is None:
            out = np.empty(src.size, src.dtype)
        isz = src.dtype.itemsize
        base, rem = divmod(src.size, n)
        starts = [i * base + min(i, rem) for i in range(n + 1)]
        chunks = [out[starts[i] : starts[i + 1]] for i in range(n)]
        raw = out.view(np.uint8).data
        braw = [raw[starts[i] * isz : starts[i + 1] * isz] for i in range(n)]
        block = max(1, REDUCE_BLOCK_BYTES // isz)
        seq = self._begin()
        last = 2 * n - 3
        sendq = self._out()
        own = [part.view(np.uint8).data for part, _ in src.parts(starts[r], starts[r + 1])]
        self._send_frame_parts(sendq, code, 0, seq, own)
        via_shm = [False] * (last + 2)  # whether frame k goes out through shared memory

        def emit(k: int, view: memoryview) -> None:
            if via_shm[k]:
                sendq.append(_ShmData(view))
            else:
                sendq.data(view)

        steps = []
        for k in range(last + 1):
            c = (r - k - 1) % n
            nbytes = len(braw[c])

            def on_header(length: int, k: int = k, nbytes: int = nbytes) -> None:
                if k + 1 <= last:
                    via_shm[k + 1] = self._header(sendq, code, k + 1, seq, nbytes)

            if k < n - 1:
                # Reduce-scatter: the partial sum of chunk c arrives; add ours; pass it on.
                done = [0]

                def reduce(upto: int, c: int = c, done: list[int] = done, k: int = k) -> None:
                    a = done[0]
                    if upto > a:
                        dst = chunks[c][a:upto]
                        src.add(dst, starts[c] + a, dst)
                        emit(k + 1, braw[c][a * isz : upto * isz])
                        done[0] = upto

                def on_data(
                    view: memoryview,
                    lo: int,
                    hi: int,
                    reduce: Callable[[int], None] = reduce,
                    done: list[int] = done,
                ) -> None:
                    upto = hi // isz
                    if upto - done[0] >= block:
                        reduce(upto)

                def on_done(reduce: Callable[[int], None] = reduce, c: int = c) -> None:
                    reduce(len(chunks[c]))

                def add_shm(
                    part: np.ndarray,
                    lo: int,
                    hi: int,
                    c: int = c,
                    k: int = k,
                    done: list[int] = done,
                ) -> None:
                    if (hi - lo) % isz:
                        raise CommunicationError(
                            f"{self._prev_peer} is out of step: a shared-memory chunk of "
                            f"{hi - lo} bytes is not a whole number of {src.dtype} items"
                        )
                    a, b = lo // isz, hi // isz
                    src.add(part.view(src.dtype), starts[c] + a, chunks[c][a:b])
                    emit(k + 1, braw[c][lo:hi])
                    done[0] = b

                steps.append(
                    _RecvStep(
                        k, nbytes, _chunk_of(braw, c), on_header, on_data, on_done, add_shm
                    )
                )
            else:
                # Allgather: the final chunk c arrives straight into the result; pass it on.
                def fwd(view: memoryview, lo: int, hi: int, k: int = k) -> None:
                    if k + 1 <= last:
                        emit(k + 1, view[lo:hi])

                steps.append(_RecvStep(k, nbytes, _chunk_of(braw, c), on_header, fwd))
        self._pump(_OP_NAMES[code], code, seq, sendq, steps)
        return out

    # Running a collective -------------------------------------------------------------------

    def _out(self) -> _Out:
        return _Out() if self._tx_mac is None else _MacOut(self._tx_mac)

    def _pump(
        self,
        opname: str,
        op: int,
        seq: int,
        sendq: _Out,
        steps: list[_RecvStep],
        deadline: float | None = None,
    ) -> None:
        """Send everything in ``sendq`` (which callbacks may extend) to the next rank while
        receiving ``steps`` from the previous one, all within ``timeout_s`` (or by
        ``deadline``, a ``time.monotonic()`` value). Any failure breaks the communicator."""
        assert self._links is not None
        pump = _Pump(
            self._links,
            opname,
            op,
            seq,
            sendq,
            steps,
            deadline,
            timeout_s=self.timeout_s,
            max_message_bytes=self.max_message_bytes,
            shm_chunk_bytes=self.shm_chunk_bytes,
        )
        try:
            pump.run()
        except CommunicationError as exc:
            raise self._fail(str(exc).removeprefix(f"rank {self.rank}: ")) from None
        except ConnectionError as exc:
            raise self._fail(str(exc)) from exc
        except MemoryError as exc:
            raise self._fail(
                f"out of memory receiving {pump.blen} bytes from {self._prev_peer} during "
                f"{opname}"
            ) from exc
        except OSError as exc:
            raise self._fail(
                f"socket error during {opname} with {self._prev_peer} / {self._next_peer}: "
                f"{exc}"
            ) from exc

    def _exchange(
        self,
        op: int,
        step: int,
        seq: int,
        send: memoryview | None,
        receive: bool,
        length: int | None,
        deadline: float,
    ) -> bytes | bytearray | memoryview | None:
        """One step of a collective that the caller sequences (:mod:`sparkdl.comm.mesh`):
        send one frame ``(op, step, seq)`` to the next rank if ``send`` is given while
        receiving one such frame from the previous rank if ``receive``, of ``length`` bytes
        (``None``: any length, received into a buffer that grows as bytes arrive). Returns the
        received payload (or ``None``). The same frame checks, MACs and failure handling as
        the ring's own collectives; the caller's ``seq`` replaces the ring's counter."""
        if self._closed:
            raise CommunicationError(f"rank {self.rank}: communicator is closed")
        if self._broken is not None:
            raise CommunicationError(
                f"rank {self.rank}: communicator unusable after an earlier failure: {self._broken}"
            )
        sendq = self._out()
        if send is not None:
            self._send_frame(sendq, op, step, seq, send)
        result: list[bytes | bytearray | memoryview | None] = [None]
        steps = []
        if receive:
            if length is None:

                def store(buf: bytearray) -> None:
                    result[0] = buf

                steps.append(_RecvStep(step, None, None, store=store))
                result[0] = b""  # an empty payload never reaches store()
            else:
                body = memoryview(bytearray(length))
                result[0] = body
                steps.append(_RecvStep(step, length, lambda _n: body))
        self._pump(_OP_NAMES[op], op, seq, sendq, steps, deadline)
        return result[0]

    def _begin(self) -> int:
        if self._closed:
            raise CommunicationError(f"rank {self.rank}: communicator is closed")
        if self._broken is not None:
            raise CommunicationError(
                f"rank {self.rank}: communicator unusable after an earlier failure: {self._broken}"
            )
        seq = self._seq
        self._seq = (seq + 1) & 0xFFFFFFFF
        return seq

    def _fail(self, message: str) -> CommunicationError:
        text = f"rank {self.rank}: {message}"
        self._broken = text
        self._close_sockets()  # so that the neighbours fail promptly too
        log.error("%s%s", f"{self.name}: " if self.name else "", text)
        return CommunicationError(text)

    def _close_sockets(self) -> None:
        for sock in (self._prev, self._next):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()
