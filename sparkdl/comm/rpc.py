"""Collectives through the rendezvous alone (on Spark: ``BarrierTaskContext.allGather``), for
clusters where executors cannot open ports to each other."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Callable

import numpy as np

from sparkdl.comm.communicator import (
    Communicator,
    TrafficCounters,
    check_broadcast_root,
    check_reduce_op,
    reduce_destination,
)
from sparkdl.errors import CommunicationError, ConfigurationError

_PREFIX = "sdl1"


class AllGatherCommunicator(Communicator):
    """Every collective is one ``exchange`` round of base64 strings tagged with the operation
    and a sequence number. ``allreduce`` sums in rank order, so all ranks get identical bits.

    Waits are bounded by the ``exchange`` itself (Spark's barrier timeout, or the store's
    ``timeout_s``); ``timeout_s`` is reported in errors.

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
    ) -> None:
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

    def allgather(self, message: bytes | memoryview) -> list[bytes]:
        return self._round("allgather", message)

    def allreduce(
        self, array: np.ndarray, op: str = "sum", *, out: np.ndarray | None = None
    ) -> np.ndarray:
        check_reduce_op(op)
        arr = np.ascontiguousarray(array)
        if arr.dtype not in (np.float32, np.float64):
            raise ConfigurationError(
                f"allreduce dtype: expected float32 or float64, got {arr.dtype}"
            )
        reduce_destination(np.asarray(array), out)
        parts = self._round(f"allreduce-{arr.dtype.name}", arr.tobytes())
        for peer, part in enumerate(parts):
            if len(part) != arr.nbytes:
                raise CommunicationError(
                    f"rank {self.rank}: rank {peer} sent {len(part)} bytes to allreduce, "
                    f"expected {arr.nbytes}"
                )
        total = np.frombuffer(parts[0], dtype=arr.dtype).copy()
        for part in parts[1:]:
            total += np.frombuffer(part, dtype=arr.dtype)
        if op == "mean":
            total /= total.dtype.type(self.world_size)
        if out is None:
            return total.reshape(arr.shape)
        np.copyto(out, total.reshape(arr.shape))
        return out

    def broadcast(self, message: bytes | memoryview | None, root: int = 0) -> bytes:
        check_broadcast_root(root, self.world_size)
        if self.rank == root and message is None:
            raise ConfigurationError("broadcast: the root rank must pass a message, got None")
        mine = message if self.rank == root and message is not None else b""
        return self._round(f"broadcast-{root}", mine)[root]

    def barrier(self) -> None:
        self._round("barrier", b"")

    def close(self) -> None:
        self._closed = True
