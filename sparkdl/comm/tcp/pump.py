"""The pump: the I/O of one collective on a rank's two ring connections (:mod:`sparkdl.comm.tcp`
describes the protocol). It sends a queue of frames to the next rank while it receives the
frames a list of steps expects from the previous one, through the socket or shared-memory
slots, checking headers and MACs. It knows frames, not collectives: the communicator builds the
queue and the steps, and decides what a failure means for it."""

from __future__ import annotations

import hmac
import select
import socket
import time
from dataclasses import dataclass, field

from sparkdl.comm import _shm
from sparkdl.comm.communicator import TrafficCounters
from sparkdl.comm.tcp.frames import (
    _ACK,
    _HDR,
    _MAGIC,
    _MAX_IOV,
    _NOTE,
    _NOTE_MAGIC,
    _OP_NAMES,
    _SHM_FLAG,
    MAC_BYTES,
    MAC_RECORD_BYTES,
    _Mac,
    _Out,
    _Peer,
    _RecvStep,
    _ShmData,
    _tag,
)
from sparkdl.errors import CommunicationError


@dataclass(eq=False, slots=True)
class _Links:
    """A rank's two connections on the ring, as every pump drives them. The communicator
    builds them once: the shared-memory slot positions and credits, and the sockets'
    registrations with ``poller``, carry from one collective to the next."""

    prev: socket.socket
    """From the previous rank (frames in, shared-memory credits out); non-blocking."""
    next: socket.socket
    """To the next rank (frames out, shared-memory credits in); non-blocking."""
    prev_peer: _Peer
    next_peer: _Peer
    rx: _shm.ShmLink | None
    """Shared memory on the link prev -> me, if any."""
    tx: _shm.ShmLink | None
    """Shared memory on the link me -> next, if any."""
    rx_mac: _Mac | None
    """Verifies the previous rank's records under ``wire_integrity="mac"``, else None."""
    counters: TrafficCounters
    poller: select.poll = field(default_factory=select.poll)
    masks: dict[int, int] = field(default_factory=dict)
    """The events each socket is registered for with ``poller``."""

    def set_mask(self, fd: int, mask: int) -> None:
        old = self.masks.get(fd)
        if old == mask:
            return
        if old is None:
            self.poller.register(fd, mask)
        else:
            self.poller.modify(fd, mask)
        self.masks[fd] = mask


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

    :meth:`run` raises :class:`CommunicationError` (a peer out of step, a MAC that fails, the
    deadline passed), ``ConnectionError`` (a connection failed or closed), ``MemoryError`` or
    ``OSError``, leaving the connections mid-frame: the communicator treats each as fatal.
    """

    def __init__(
        self,
        links: _Links,
        opname: str,
        op: int,
        seq: int,
        sendq: _Out,
        steps: list[_RecvStep],
        deadline: float | None,
        *,
        timeout_s: float,
        max_message_bytes: int,
        shm_chunk_bytes: int,
    ) -> None:
        """``deadline``: a ``time.monotonic()`` value, else ``timeout_s`` from now;
        ``max_message_bytes``: the longest payload a header may declare; ``shm_chunk_bytes``:
        at most this many payload bytes per shared-memory slot."""
        self.links = links
        self.opname = opname
        self.op = op
        self.seq = seq
        self.sendq = sendq
        self.steps = steps
        self.nsteps = len(steps)
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s if deadline is None else deadline
        self.max_message_bytes = max_message_bytes
        self.shm_chunk_bytes = shm_chunk_bytes
        self.mac = links.rx_mac
        # Header and payload in one recvmsg: only when the payload needs no other handling.
        self.direct = links.rx is None and self.mac is None
        self.hdr = bytearray(_HDR.size + (MAC_BYTES if self.mac is not None else 0))
        self.hview = memoryview(self.hdr)
        self.small = bytearray(max(_NOTE.size, MAC_BYTES))  # a notice or a tag
        self.sview = memoryview(self.small)
        self.waiting_credit = False
        self.acks_owed = 0  # credits for consumed slots not yet returned to prev
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
        links = self.links
        monotonic = time.monotonic
        while True:
            progressed = self._send()
            if self.acks_owed:
                self._return_credits()
            if self.si < self.nsteps and self._receive():
                progressed = True
            if (
                self.si >= self.nsteps
                and not self.sendq
                and not self.acks_owed
                and not self.waiting_credit
            ):
                tx = links.tx
                if tx is None or tx.credits == tx.slots:
                    return
                continue
            if progressed:
                if monotonic() > self.deadline:
                    raise self._overdue()
                continue
            self._wait()

    def _overdue(self) -> CommunicationError:
        links, timeout = self.links, self.timeout_s
        if self.si < self.nsteps:
            step = self.steps[self.si]
            if self.state == _HEADER:
                what = f"sent nothing of step {step.step}"
            else:
                what = f"sent {self.got} of {self.blen} bytes of step {step.step}"
            return CommunicationError(
                f"{links.prev_peer} {what}: {self.opname} not complete within {timeout:.1f} s"
            )
        who = links.next_peer if self.sendq or self.waiting_credit else links.prev_peer
        return CommunicationError(
            f"{who} accepted no more data: {self.opname} not complete within {timeout:.1f} s"
        )

    def _wait(self) -> None:
        links = self.links
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise self._overdue()
        want_send = bool(self.sendq) and not self.waiting_credit
        links.set_mask(
            links.prev.fileno(),
            (select.POLLIN if self.si < self.nsteps else 0)
            | (select.POLLOUT if self.acks_owed else 0),
        )
        links.set_mask(
            links.next.fileno(),
            (select.POLLOUT if want_send else 0)
            | (select.POLLIN if self.waiting_credit else 0),
        )
        links.poller.poll(max(1, int(remaining * 1000) + 1))

    # Sending ----------------------------------------------------------------------------------

    def _send(self) -> bool:
        """One turn of the send side; returns whether anything moved."""
        links, sendq, tx = self.links, self.sendq, self.links.tx
        self.waiting_credit = False
        if not sendq:
            if tx is not None and tx.credits < tx.slots:
                # Done sending: wait for every slot to be consumed, so that no credit is
                # left unread on the socket (closing it would then reset the connection).
                if self._take_credits():
                    return True
                self.waiting_credit = True
            return False
        progressed = False
        if type(sendq[0]) is _ShmData:
            assert tx is not None
            if tx.credits == 0:
                self._take_credits()
            moved = self._fill_slot()
            if not moved:
                self.waiting_credit = True
                return False
            links.counters.bytes_sent += moved
            progressed = True
        iov: list[memoryview] = []
        for item in sendq:
            if type(item) is _ShmData or len(iov) == _MAX_IOV:
                break
            iov.append(item)
        nxt = links.next
        try:
            sent = nxt.send(iov[0]) if len(iov) == 1 else nxt.sendmsg(iov)
        except BlockingIOError:
            return progressed
        except OSError as exc:
            raise ConnectionError(
                f"sending to {links.next_peer} failed during {self.opname}: {exc}"
            ) from exc
        if not sent:
            return progressed
        links.counters.bytes_sent += sent
        while sent:
            head = sendq[0]
            if sent >= len(head):
                sent -= len(head)
                sendq.popleft()
            else:
                sendq[0] = head[sent:]
                sent = 0
        return True

    def _fill_slot(self) -> int:
        """Copy queued shared-memory payload at the head of the send queue into the next free
        slot and put its notice in its place; returns the payload bytes moved (0 if no
        credit)."""
        sendq, link = self.sendq, self.links.tx
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

    def _take_credits(self) -> bool:
        """Read returned slot credits from the next rank (non-blocking)."""
        links = self.links
        link, nxt = links.tx, links.next
        assert link is not None
        try:
            data = nxt.recv(256)
        except BlockingIOError:
            return False
        except OSError as exc:
            raise ConnectionError(
                f"receiving from {links.next_peer} failed during {self.opname}: {exc}"
            ) from exc
        if not data:
            raise ConnectionError(
                f"{links.next_peer} closed the connection during {self.opname} "
                "(it failed or exited)"
            )
        if data.count(_ACK) != len(data) or link.credits + len(data) > link.slots:
            raise CommunicationError(
                f"{links.next_peer} is out of step: unexpected shared-memory credits"
            )
        links.counters.bytes_received += len(data)
        link.credits += len(data)
        return True

    def _return_credits(self) -> None:
        links = self.links
        try:
            sent = links.prev.send(bytes([_ACK]) * self.acks_owed)
        except BlockingIOError:
            return
        except OSError as exc:
            raise ConnectionError(
                f"sending to {links.prev_peer} failed during {self.opname}: {exc}"
            ) from exc
        self.acks_owed -= sent
        links.counters.bytes_sent += sent

    # Receiving --------------------------------------------------------------------------------

    def _receive(self) -> bool:
        """One non-blocking read for the current step; returns whether anything arrived."""
        links, state = self.links, self.state
        prev = links.prev
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
                f"receiving from {links.prev_peer} failed during {self.opname}: {exc}"
            ) from exc
        if k == 0:
            raise ConnectionError(
                f"{links.prev_peer} closed the connection during {self.opname} "
                "(it failed or exited)"
            )
        links.counters.bytes_received += k
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
        blen, shm = self._check_header(step)
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

    def _check_header(self, step: _RecvStep) -> tuple[int, bool]:
        """The payload length the received header declares, and whether the payload comes
        through shared memory; :class:`CommunicationError` unless it is the frame ``step``
        expects."""
        magic, got_op, got_step, got_seq, length = _HDR.unpack_from(self.hdr)
        shm = bool(got_op & _SHM_FLAG)
        got_op &= ~_SHM_FLAG
        want_len = step.length
        if (
            magic != _MAGIC
            or got_op != self.op
            or got_seq != self.seq
            or got_step != step.step & 0xFFFF
            or (want_len is not None and length != want_len)
            or length > self.max_message_bytes
            or (shm and (self.links.rx is None or length == 0))
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
            expected = f"{self.opname} seq {self.seq} step {step.step}"
            if want_len is not None:
                expected += f" of {want_len} bytes"
            raise CommunicationError(
                f"{self.links.prev_peer} is out of step: expected {expected}, received {what} "
                "(ranks called collectives in a different order or with different sizes)"
            )
        return int(length), shm

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
        n = self._consume_slot(note, step)
        self.got += n
        self.links.counters.bytes_received += n
        if self.got == self.blen:
            self._done(step)

    def _consume_slot(self, note: bytearray, step: _RecvStep) -> int:
        """Hand the payload of the slot named by ``note`` to ``step``; owe a credit back."""
        link, body, got, blen = self.links.rx, self.body, self.got, self.blen
        assert link is not None and body is not None
        magic, _, slot, n = _NOTE.unpack(note)
        if (
            magic != _NOTE_MAGIC
            or slot != link.index & 0xFFFF
            or not 0 < n <= min(link.slot_bytes, blen - got)
        ):
            raise CommunicationError(
                f"{self.links.prev_peer} is out of step: bad shared-memory notice (slot {slot}, "
                f"{n} bytes) during {self.opname} step {step.step}"
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
        self.acks_owed += 1
        return int(n)

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
                f"{self.links.prev_peer} sent a {what} that failed its MAC during "
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
