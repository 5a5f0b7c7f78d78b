"""The TCP ring communicator: its collectives, and the pump that drives one collective's I/O on
both sockets (:mod:`sparkdl.comm.tcp` describes the protocol)."""

from __future__ import annotations

import contextlib
import hmac
import logging
import select
import socket
import time
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
    _ACK,
    _HDR,
    _MAGIC,
    _MAX_IOV,
    _NOTE,
    _NOTE_MAGIC,
    _OP_ALLGATHER,
    _OP_BROADCAST,
    _OP_NAMES,
    _SHM_FLAG,
    MAC_BYTES,
    MAC_RECORD_BYTES,
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
    _tag,
)
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
        self._acks_owed = 0  # credits for consumed slots not yet returned to prev
        if (tx_mac_key is None) != (rx_mac_key is None) or (
            tx_mac_key is not None and (rx_shm is not None or tx_shm is not None)
        ):
            raise ConfigurationError("wire MACs need keys for both links and no shared memory")
        self._tx_mac = _Mac(tx_mac_key) if tx_mac_key is not None else None
        self._rx_mac = _Mac(rx_mac_key) if rx_mac_key is not None else None
        self._seq = 0
        self._broken: str | None = None
        self._closed = False
        self._poller = select.poll() if prev_sock is not None else None
        self._masks: dict[int, int] = {}
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

    # The I/O engine -------------------------------------------------------------------------

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
        ``deadline``, a ``time.monotonic()`` value)."""
        _Pump(self, opname, op, seq, sendq, steps, deadline).run()

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

    def _fill_slot(self, sendq: _Out) -> int:
        """Copy queued shared-memory payload at the head of ``sendq`` into the next free slot
        and put its notice in its place; returns the payload bytes moved (0 if no credit)."""
        link = self._tx
        assert link is not None
        if link.credits <= 0:
            return 0
        base = link.offset(link.index)
        cap = min(self.shm_chunk_bytes, link.slot_bytes)
        dst = link.view
        filled = 0
        while sendq and filled < cap:
            item = sendq[0]
            if type(item) is not _ShmData:
                break
            piece = item.view
            take = min(len(piece), cap - filled)
            dst[base + filled : base + filled + take] = piece[:take]
            filled += take
            if take == len(piece):
                sendq.popleft()
            else:
                item.view = piece[take:]
        sendq.appendleft(memoryview(_NOTE.pack(_NOTE_MAGIC, 0, link.index & 0xFFFF, filled)))
        link.index += 1
        link.credits -= 1
        return filled

    def _take_credits(self, opname: str) -> bool:
        """Read returned slot credits from the next rank (non-blocking)."""
        link, nxt = self._tx, self._next
        assert link is not None and nxt is not None
        try:
            data = nxt.recv(256)
        except BlockingIOError:
            return False
        except OSError as exc:
            raise ConnectionError(
                f"receiving from {self._next_peer} failed during {opname}: {exc}"
            ) from exc
        if not data:
            raise ConnectionError(
                f"{self._next_peer} closed the connection during {opname} (it failed or exited)"
            )
        if data.count(_ACK) != len(data) or link.credits + len(data) > link.slots:
            raise CommunicationError(
                f"{self._next_peer} is out of step: unexpected shared-memory credits"
            )
        self.counters.bytes_received += len(data)
        link.credits += len(data)
        return True

    def _return_credits(self, opname: str) -> None:
        prev = self._prev
        assert prev is not None
        try:
            sent = prev.send(bytes([_ACK]) * self._acks_owed)
        except BlockingIOError:
            return
        except OSError as exc:
            raise ConnectionError(
                f"sending to {self._prev_peer} failed during {opname}: {exc}"
            ) from exc
        self._acks_owed -= sent
        self.counters.bytes_sent += sent

    def _consume_slot(
        self,
        note: bytearray,
        opname: str,
        step: _RecvStep,
        body: memoryview | None,
        got: int,
        blen: int,
    ) -> int:
        """Hand the payload of the slot named by ``note`` to ``step``; owe a credit back."""
        link = self._rx
        assert link is not None and body is not None
        magic, _, slot, n = _NOTE.unpack(note)
        if (
            magic != _NOTE_MAGIC
            or slot != link.index & 0xFFFF
            or not 0 < n <= min(link.slot_bytes, blen - got)
        ):
            raise CommunicationError(
                f"{self._prev_peer} is out of step: bad shared-memory notice (slot {slot}, "
                f"{n} bytes) during {opname} step {step.step}"
            )
        base = link.offset(link.index)
        part = link.array[base : base + n]
        if step.on_shm is not None:
            step.on_shm(part, got, got + n)
        else:
            body[got : got + n] = part.data
            if step.on_data is not None:
                step.on_data(body, got, got + n)
        link.index += 1
        self._acks_owed += 1
        return int(n)

    def _set_mask(self, fd: int, mask: int) -> None:
        assert self._poller is not None
        old = self._masks.get(fd)
        if old == mask:
            return
        if old is None:
            self._poller.register(fd, mask)
        else:
            self._poller.modify(fd, mask)
        self._masks[fd] = mask

    def _check_header(
        self, hdr: bytearray, opname: str, op: int, seq: int, step: _RecvStep
    ) -> tuple[int, bool]:
        magic, got_op, got_step, got_seq, length = _HDR.unpack_from(hdr)
        shm = bool(got_op & _SHM_FLAG)
        got_op &= ~_SHM_FLAG
        want_len = step.length
        if (
            magic != _MAGIC
            or got_op != op
            or got_seq != seq
            or got_step != step.step & 0xFFFF
            or (want_len is not None and length != want_len)
            or length > self.max_message_bytes
            or (shm and (self._rx is None or length == 0))
        ):
            if magic != _MAGIC:
                what = f"a frame with bad magic 0x{magic:02x}"
            else:
                what = (
                    f"{_OP_NAMES.get(got_op, f'op {got_op}')} seq {got_seq} step {got_step} "
                    f"of {length} bytes"
                )
                if shm:
                    what += " in shared memory"
            expected = f"{opname} seq {seq} step {step.step}"
            if want_len is not None:
                expected += f" of {want_len} bytes"
            raise CommunicationError(
                f"{self._prev_peer} is out of step: expected {expected}, received {what} "
                "(ranks called collectives in a different order or with different sizes)"
            )
        return int(length), shm


_HEADER, _PAYLOAD, _TAG, _NOTICE = range(4)
_FIRST_ALLOC = 64 << 10
"""A payload of undeclared size (allgather, broadcast) starts in a buffer of at most this many
bytes, which doubles as bytes arrive: a peer's declared length is never allocated up front."""


class _Pump:
    """The I/O of one collective: send everything queued for the next rank (callbacks may
    extend the queue) while receiving the expected frames (``steps``) from the previous one,
    on non-blocking sockets driven by ``poll``, all before one total deadline.

    Receive states, for the frame of the current step::

        state     reads                               when complete
        --------  ----------------------------------  ------------------------------------------
        _HEADER   the header (+ its MAC tag) into     tag verified, header checked, body set
                  hdr; without MAC or shared memory,  up -> _PAYLOAD, _NOTICE, or done (empty
                  also the start of the payload       payload, or all of it already read)
        _PAYLOAD  payload into body[got:limit]        no MAC: each read handed on, done at the
                  (limit: record end, buffer end)     end; MAC: at the record end -> _TAG
        _TAG      the record's MAC tag                verified, record handed on -> _PAYLOAD,
                                                      or done
        _NOTICE   one shared-memory notice            slot consumed -> _NOTICE, or done
        done      on_done (and store), next step -> _HEADER; after the last step, receiving is
                  finished

    Send side, each turn: shared-memory payload at the head of the queue is copied into a free
    slot (or we wait for a credit), queued bytes go out with ``sendmsg``, owed credits go back
    to the previous rank; after the last byte we wait until the next rank consumed every slot.
    """

    def __init__(
        self,
        comm: TcpRingCommunicator,
        opname: str,
        op: int,
        seq: int,
        sendq: _Out,
        steps: list[_RecvStep],
        deadline: float | None = None,
    ) -> None:
        assert comm._prev is not None and comm._next is not None
        self.comm = comm
        self.opname = opname
        self.op = op
        self.seq = seq
        self.sendq = sendq
        self.steps = steps
        self.nsteps = len(steps)
        self.deadline = time.monotonic() + comm.timeout_s if deadline is None else deadline
        self.mac = comm._rx_mac
        # Header and payload in one recvmsg: only when the payload needs no other handling.
        self.direct = comm._rx is None and self.mac is None
        self.hdr = bytearray(_HDR.size + (MAC_BYTES if self.mac is not None else 0))
        self.hview = memoryview(self.hdr)
        self.small = bytearray(max(_NOTE.size, MAC_BYTES))  # a notice or a tag
        self.sview = memoryview(self.small)
        self.waiting_credit = False
        self.si = 0
        self.state = _HEADER
        self.part = 0  # bytes of the header, notice or tag being read
        self.got = 0  # payload bytes of the current frame received
        self.blen = 0  # payload length of the current frame
        self.body: memoryview | None = None
        self.buf: bytearray | None = None  # the growing buffer of an undeclared-size payload
        self.cap = 0  # bytes body can hold
        self.until = 0  # end of the current record (MAC), else blen
        self.limit = 0  # min(until, cap): receive up to here
        self.record = 0  # start of the current record (MAC)
        self._preallocate()

    def _preallocate(self) -> None:
        if self.si < self.nsteps:
            step = self.steps[self.si]
            if step.length is not None:
                assert step.target is not None
                self.body = step.target(step.length)
                self.cap = step.length

    # The loop ---------------------------------------------------------------------------------

    def run(self) -> None:
        comm = self.comm
        monotonic = time.monotonic
        try:
            while True:
                progressed = self._send()
                if comm._acks_owed:
                    comm._return_credits(self.opname)
                if self.si < self.nsteps and self._receive():
                    progressed = True
                if (
                    self.si >= self.nsteps
                    and not self.sendq
                    and not comm._acks_owed
                    and not self.waiting_credit
                ):
                    tx = comm._tx
                    if tx is None or tx.credits == tx.slots:
                        return
                    continue
                if progressed:
                    if monotonic() > self.deadline:
                        raise self._overdue()
                    continue
                self._wait()
        except CommunicationError as exc:
            raise comm._fail(str(exc).removeprefix(f"rank {comm.rank}: ")) from None
        except ConnectionError as exc:
            raise comm._fail(str(exc)) from exc
        except MemoryError as exc:
            raise comm._fail(
                f"out of memory receiving {self.blen} bytes from {comm._prev_peer} during "
                f"{self.opname}"
            ) from exc
        except OSError as exc:
            raise comm._fail(
                f"socket error during {self.opname} with {comm._prev_peer} / "
                f"{comm._next_peer}: {exc}"
            ) from exc

    def _overdue(self) -> CommunicationError:
        comm, timeout = self.comm, self.comm.timeout_s
        if self.si < self.nsteps:
            step = self.steps[self.si]
            if self.state == _HEADER:
                what = f"sent nothing of step {step.step}"
            else:
                what = f"sent {self.got} of {self.blen} bytes of step {step.step}"
            return CommunicationError(
                f"{comm._prev_peer} {what}: {self.opname} not complete within {timeout:.1f} s"
            )
        who = comm._next_peer if self.sendq or self.waiting_credit else comm._prev_peer
        return CommunicationError(
            f"{who} accepted no more data: {self.opname} not complete within {timeout:.1f} s"
        )

    def _wait(self) -> None:
        comm = self.comm
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise self._overdue()
        assert comm._poller is not None and comm._prev is not None and comm._next is not None
        want_send = bool(self.sendq) and not self.waiting_credit
        comm._set_mask(
            comm._prev.fileno(),
            (select.POLLIN if self.si < self.nsteps else 0)
            | (select.POLLOUT if comm._acks_owed else 0),
        )
        comm._set_mask(
            comm._next.fileno(),
            (select.POLLOUT if want_send else 0)
            | (select.POLLIN if self.waiting_credit else 0),
        )
        comm._poller.poll(max(1, int(remaining * 1000) + 1))

    # Sending ----------------------------------------------------------------------------------

    def _send(self) -> bool:
        """One turn of the send side; returns whether anything moved."""
        comm, sendq, tx = self.comm, self.sendq, self.comm._tx
        self.waiting_credit = False
        if not sendq:
            if tx is not None and tx.credits < tx.slots:
                # Done sending: wait for every slot to be consumed, so that no credit is
                # left unread on the socket (closing it would then reset the connection).
                if comm._take_credits(self.opname):
                    return True
                self.waiting_credit = True
            return False
        progressed = False
        if type(sendq[0]) is _ShmData:
            assert tx is not None
            if tx.credits == 0:
                comm._take_credits(self.opname)
            moved = comm._fill_slot(sendq)
            if not moved:
                self.waiting_credit = True
                return False
            comm.counters.bytes_sent += moved
            progressed = True
        iov: list[memoryview] = []
        for item in sendq:
            if type(item) is _ShmData or len(iov) == _MAX_IOV:
                break
            iov.append(item)
        nxt = comm._next
        assert nxt is not None
        try:
            sent = nxt.send(iov[0]) if len(iov) == 1 else nxt.sendmsg(iov)
        except BlockingIOError:
            return progressed
        except OSError as exc:
            raise ConnectionError(
                f"sending to {comm._next_peer} failed during {self.opname}: {exc}"
            ) from exc
        if not sent:
            return progressed
        comm.counters.bytes_sent += sent
        while sent:
            head = sendq[0]
            if sent >= len(head):
                sent -= len(head)
                sendq.popleft()
            else:
                sendq[0] = head[sent:]
                sent = 0
        return True

    # Receiving --------------------------------------------------------------------------------

    def _receive(self) -> bool:
        """One non-blocking read for the current step; returns whether anything arrived."""
        comm, state = self.comm, self.state
        prev = comm._prev
        assert prev is not None
        try:
            if state == _PAYLOAD:
                assert self.body is not None
                k = prev.recv_into(self.body[self.got : self.limit])
            elif state == _HEADER:
                if self.direct and self.body is not None and self.cap:
                    k = prev.recvmsg_into([self.hview[self.part :], self.body])[0]
                else:
                    k = prev.recv_into(self.hview[self.part :])
            elif state == _TAG:
                k = prev.recv_into(self.sview[self.part : MAC_BYTES])
            else:
                k = prev.recv_into(self.sview[self.part : _NOTE.size])
        except BlockingIOError:
            return False
        except OSError as exc:
            raise ConnectionError(
                f"receiving from {comm._prev_peer} failed during {self.opname}: {exc}"
            ) from exc
        if k == 0:
            raise ConnectionError(
                f"{comm._prev_peer} closed the connection during {self.opname} "
                "(it failed or exited)"
            )
        comm.counters.bytes_received += k
        if state == _PAYLOAD:
            self._payload(k)
        elif state == _HEADER:
            self._header(k)
        elif state == _TAG:
            self._tag(k)
        else:
            self._notice(k)
        return True

    def _header(self, k: int) -> None:
        part = self.part + k
        size = len(self.hdr)
        if part < size:
            self.part = part
            return
        self.part = 0
        step = self.steps[self.si]
        if self.mac is not None:
            self._verify(self.hview[: _HDR.size], self.hview[_HDR.size :], step, "frame header")
        blen, shm = self.comm._check_header(self.hdr, self.opname, self.op, self.seq, step)
        self.blen = blen
        extra = part - size  # payload bytes that came with the header (direct mode only)
        if self.body is None:
            if step.length is not None:
                assert step.target is not None
                self.body, self.cap = step.target(blen), blen
            else:
                self.buf = bytearray(min(blen, _FIRST_ALLOC))
                self.body, self.cap = memoryview(self.buf), len(self.buf)
        self.got = extra
        if step.on_header is not None:
            step.on_header(blen)
        if shm:
            self.state = _NOTICE
        else:
            self.state = _PAYLOAD
            self.record = 0
            self.until = blen if self.mac is None else min(MAC_RECORD_BYTES, blen)
            if extra and step.on_data is not None:
                step.on_data(self.body, 0, extra)
        if self.got == blen:
            self._done(step)
        else:
            self._set_limit()

    def _payload(self, k: int) -> None:
        lo = self.got
        got = self.got = lo + k
        if self.mac is None:
            step = self.steps[self.si]
            if step.on_data is not None:
                step.on_data(self.body, lo, got)  # type: ignore[arg-type]
            if got == self.blen:
                self._done(step)
                return
        elif got == self.until:
            self.state = _TAG
            return
        if got == self.limit:
            self._set_limit()

    def _tag(self, k: int) -> None:
        self.part += k
        if self.part < MAC_BYTES:
            return
        self.part = 0
        step = self.steps[self.si]
        lo, hi = self.record, self.got
        assert self.body is not None
        self._verify(self.body[lo:hi], self.sview[:MAC_BYTES], step, "payload record")
        if step.on_data is not None:
            step.on_data(self.body, lo, hi)
        if hi == self.blen:
            self._done(step)
            return
        self.record = hi
        self.until = min(hi + MAC_RECORD_BYTES, self.blen)
        self.state = _PAYLOAD
        self._set_limit()

    def _notice(self, k: int) -> None:
        self.part += k
        if self.part < _NOTE.size:
            return
        self.part = 0
        if self.buf is not None:
            n = _NOTE.unpack_from(self.small)[3]
            if self.cap < self.got + n <= self.blen:
                self._grow(self.got + n)
        step = self.steps[self.si]
        note = self.small[: _NOTE.size]
        n = self.comm._consume_slot(note, self.opname, step, self.body, self.got, self.blen)
        self.got += n
        self.comm.counters.bytes_received += n
        if self.got == self.blen:
            self._done(step)

    def _set_limit(self) -> None:
        if self.got == self.cap and self.cap < self.blen:
            self._grow(0)
        self.limit = min(self.until, self.cap)

    def _grow(self, need: int) -> None:
        """Move an undeclared-size payload into a buffer twice as large (at most its length).
        Views of the old buffer already handed on stay valid."""
        assert self.buf is not None and self.body is not None
        new = bytearray(min(self.blen, max(need, 2 * self.cap)))
        new[: self.got] = self.body[: self.got]
        self.buf, self.body, self.cap = new, memoryview(new), len(new)

    def _verify(self, data: memoryview, tag: memoryview, step: _RecvStep, what: str) -> None:
        assert self.mac is not None
        h = self.mac.hasher()
        h.update(data)
        if not hmac.compare_digest(_tag(h), tag):
            raise CommunicationError(
                f"{self.comm._prev_peer} sent a {what} that failed its MAC during "
                f"{self.opname} step {step.step} (bytes altered or injected on the wire)"
            )

    def _done(self, step: _RecvStep) -> None:
        if step.on_done is not None:
            step.on_done()
        if self.buf is not None and step.store is not None:
            step.store(self.buf)
        self.si += 1
        self.state = _HEADER
        self.part = self.got = self.blen = self.cap = self.until = self.limit = 0
        self.body = self.buf = None
        self._preallocate()
