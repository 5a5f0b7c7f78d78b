"""Collectives through the rendezvous alone (on Spark: ``BarrierTaskContext.allGather``), for
clusters where executors cannot open ports to each other."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import struct
from collections.abc import Callable, Sequence

import numpy as np

from sparkdl.comm.communicator import (
    Communicator,
    Segments,
    TrafficCounters,
    broadcast_destination,
    check_broadcast_root,
    check_reduce_op,
    reduce_destination,
)
from sparkdl.errors import CommunicationError, ConfigurationError

_PREFIX = "sdl1"
#: Payload bytes a rank puts in one exchange round at most: a longer message or vector goes
#: in consecutive rounds, so neither Spark's barrier messages nor this rank's memory hold a
#: model-sized string (a 300M-element float32 vector is 1.2 GB, 1.6 GB in base64).
ROUND_BYTES = 8 << 20
_LENGTH = struct.Struct("<Q")


class AllGatherCommunicator(Communicator):
    """Every collective is one ``exchange`` round of base64 strings tagged with the operation
    and a sequence number. ``allreduce`` sums in rank order, so all ranks get identical bits.

    Waits are bounded by the ``exchange`` itself (Spark's barrier timeout, or the store's
    ``timeout_s``); ``timeout_s`` is reported in errors.

    No round carries more than ``round_bytes`` of one rank's payload: longer messages and
    vectors go in consecutive rounds (a message's first round leads with its length), and
    ``allreduce`` sums each round's slice straight into the result, so a large vector costs
    no full-size copy beyond the result itself.

    ``wire_integrity="mac"`` (needs ``secret``) appends to every message a BLAKE2b tag keyed
    per sending rank from the job secret, over the operation, sequence number and payload;
    a message whose tag does not verify raises :class:`CommunicationError` naming the rank.
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        exchange: Callable[[str], list[str]],
        *,
        timeout_s: float = 60.0,
        secret: bytes | None = None,
        wire_integrity: str = "none",
        round_bytes: int = ROUND_BYTES,
    ) -> None:
        if round_bytes < 1:
            raise ConfigurationError(f"round_bytes: expected at least 1, got {round_bytes}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ConfigurationError(
                f"rank/world_size: expected 0 <= rank < world_size, got {rank}/{world_size}"
            )
        if wire_integrity not in ("none", "mac"):
            raise ConfigurationError(
                f"wire_integrity: expected one of ['none', 'mac'], got {wire_integrity!r}"
            )
        self._keys: list[bytes] | None = None
        if wire_integrity == "mac":
            if secret is None:
                raise ConfigurationError("wire_integrity 'mac' needs the job secret")
            person = b"sparkdl-rpc-mac"
            root = hashlib.blake2b(bytes(secret), digest_size=64, person=person).digest()
            self._keys = [
                hashlib.blake2b(b"rank %d" % r, key=root, digest_size=32).digest()
                for r in range(world_size)
            ]
        self.rank = rank
        self.world_size = world_size
        self.counters = TrafficCounters()
        self.timeout_s = timeout_s
        self._exchange = exchange
        self.round_bytes = round_bytes
        self._seq = 0
        self._closed = False

    def _round(self, op: str, payload: bytes | memoryview) -> list[bytes]:
        if self._closed:
            raise CommunicationError(f"rank {self.rank}: communicator is closed")
        seq = self._seq
        self._seq += 1
        text = f"{_PREFIX}|{op}|{seq}|{base64.b64encode(payload).decode('ascii')}"
        if self._keys is not None:
            text += "|" + self._tag(self.rank, op, seq, payload)
        try:
            replies = self._exchange(text)
        except CommunicationError:
            raise
        except Exception as exc:
            raise CommunicationError(
                f"rank {self.rank}: exchange failed during {op} (timeout {self.timeout_s} s): "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        self.counters.bytes_sent += len(text)
        if len(replies) != self.world_size:
            raise CommunicationError(
                f"rank {self.rank}: exchange returned {len(replies)} messages during {op}, "
                f"expected {self.world_size}"
            )
        out = []
        for peer, reply in enumerate(replies):
            self.counters.bytes_received += len(reply)
            reply = str(reply)
            tag = None
            if self._keys is not None:
                reply, _, tag = reply.rpartition("|")
            parts = reply.split("|", 3)
            if len(parts) != 4 or parts[0] != _PREFIX or parts[1] != op or parts[2] != str(seq):
                head = "|".join(parts[:3])[:60]
                raise CommunicationError(
                    f"rank {self.rank}: rank {peer} is out of step: expected {op} seq {seq}, "
                    f"received {head!r}"
                )
            try:
                out.append(base64.b64decode(parts[3], validate=True))
            except (binascii.Error, ValueError) as exc:
                raise CommunicationError(
                    f"rank {self.rank}: rank {peer} sent a malformed {op} message"
                ) from exc
            if tag is not None and not hmac.compare_digest(
                tag, self._tag(peer, op, seq, out[-1])
            ):
                raise CommunicationError(
                    f"rank {self.rank}: rank {peer} sent a {op} message that failed its MAC "
                    "(altered or injected)"
                )
        return out

    def _tag(self, rank: int, op: str, seq: int, payload: bytes | memoryview) -> str:
        assert self._keys is not None
        h = hashlib.blake2b(f"{op}|{seq}|".encode(), key=self._keys[rank], digest_size=16)
        h.update(payload)
        return h.hexdigest()

    def _messages(self, op: str, message: bytes | memoryview) -> list[bytes]:
        """Every rank's ``message`` (any lengths), in as many rounds as the longest needs."""
        data = memoryview(message).cast("B")
        first = data[: self.round_bytes]
        parts = self._round(op, _LENGTH.pack(len(data)) + first)
        lengths = []
        for peer, part in enumerate(parts):
            if len(part) < _LENGTH.size:
                raise CommunicationError(
                    f"rank {self.rank}: rank {peer} sent a malformed {op} message")
            lengths.append(_LENGTH.unpack_from(part)[0])
        pieces = [[part[_LENGTH.size:]] for part in parts]
        for start in range(self.round_bytes, max(lengths), self.round_bytes):
            for peer, part in enumerate(self._round(op, data[start : start + self.round_bytes])):
                pieces[peer].append(part)
        out = [b"".join(p) for p in pieces]
        for peer, (got, length) in enumerate(zip(out, lengths, strict=True)):
            if len(got) != length:
                raise CommunicationError(
                    f"rank {self.rank}: rank {peer} sent {len(got)} of the {length} bytes it "
                    f"announced for {op}")
        return out

    def allgather(self, message: bytes | memoryview) -> list[bytes]:
        return self._messages("allgather", message)

    def allreduce(
        self, array: np.ndarray, op: str = "sum", *, out: np.ndarray | None = None
    ) -> np.ndarray:
        arr = np.ascontiguousarray(array)
        self._check_reduce(arr.dtype, op)
        total = self._reduce(Segments([arr]), op, reduce_destination(np.asarray(array), out))
        return out if out is not None else total.reshape(arr.shape)

    def allreduce_pieces(
        self, pieces: Sequence[np.ndarray], op: str = "sum", *, out: np.ndarray | None = None
    ) -> np.ndarray:
        src = Segments(pieces)
        self._check_reduce(src.dtype, op)
        total = self._reduce(src, op, reduce_destination(src, out))
        return out if out is not None else total

    def _check_reduce(self, dtype: np.dtype, op: str) -> None:
        check_reduce_op(op)
        if dtype not in (np.float32, np.float64):
            raise ConfigurationError(f"allreduce dtype: expected float32 or float64, got {dtype}")

    def _reduce(self, src: Segments, op: str, out: np.ndarray | None) -> np.ndarray:
        """Sum ``src`` over the ranks, ``round_bytes`` at a time, into ``out`` (flat) or a new
        flat array; each round's slice is read from the pieces in place."""
        result = out if out is not None else np.empty(src.size, src.dtype)
        step = max(1, self.round_bytes // src.dtype.itemsize)
        # One round even for an empty vector: every rank takes part in every collective.
        for start in range(0, max(src.size, 1), step):
            stop = min(start + step, src.size)
            parts = src.parts(start, stop)
            mine = (parts[0][0].data.cast("B") if len(parts) == 1
                    else b"".join(p.data.cast("B") for p, _ in parts))
            nbytes = (stop - start) * src.dtype.itemsize
            replies = self._round(f"allreduce-{src.dtype.name}", mine)
            for peer, part in enumerate(replies):
                if len(part) != nbytes:
                    raise CommunicationError(
                        f"rank {self.rank}: rank {peer} sent {len(part)} bytes to allreduce, "
                        f"expected {nbytes} (elements {start}:{stop} of {src.size})"
                    )
            total = result[start:stop]
            np.copyto(total, np.frombuffer(replies[0], dtype=src.dtype))
            for part in replies[1:]:
                total += np.frombuffer(part, dtype=src.dtype)
        if op == "mean":
            result /= result.dtype.type(self.world_size)
        return result

    def broadcast(self, message: bytes | memoryview | None, root: int = 0) -> bytes:
        check_broadcast_root(root, self.world_size)
        if self.rank == root and message is None:
            raise ConfigurationError("broadcast: the root rank must pass a message, got None")
        mine = message if self.rank == root and message is not None else b""
        return self._messages(f"broadcast-{root}", mine)[root]

    def broadcast_into(self, array: np.ndarray, root: int = 0) -> np.ndarray:
        check_broadcast_root(root, self.world_size)
        raw = np.frombuffer(broadcast_destination(array, writable=self.rank != root), np.uint8)
        for start in range(0, max(raw.size, 1), self.round_bytes):
            mine = raw[start : start + self.round_bytes]
            got = self._round(f"broadcast-{root}", mine.data if self.rank == root else b"")
            if self.rank == root:
                continue
            if len(got[root]) != mine.size:
                raise CommunicationError(
                    f"broadcast: rank {root} sent {start + len(got[root])} bytes, expected "
                    f"{array.nbytes} ({array.shape} {array.dtype})")
            mine[:] = np.frombuffer(got[root], np.uint8)
        return array

    def barrier(self) -> None:
        self._round("barrier", b"")

    def close(self) -> None:
        self._closed = True
