"""The collective-communication interface shared by every transport."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sparkdl.errors import ConfigurationError


@dataclass
class TrafficCounters:
    """Bytes this rank put on and took off the wire (payload plus framing). Payload that the
    TCP ring moves through same-host shared memory counts as if it had crossed the wire, so
    figures compare across hosts and with shared memory switched off."""

    bytes_sent: int = 0
    bytes_received: int = 0

    def snapshot(self) -> tuple[int, int]:
        return self.bytes_sent, self.bytes_received


def reduce_destination(array: np.ndarray, out: np.ndarray | None) -> np.ndarray | None:
    """``out`` as a flat view to reduce ``array`` into (None stays None); a clear error when
    it cannot be: another shape or dtype, not C-contiguous, read-only, or sharing memory with
    ``array``."""
    if out is None:
        return None
    if not isinstance(out, np.ndarray) or out.shape != array.shape or out.dtype != array.dtype:
        got = (f"{out.shape} {out.dtype}" if isinstance(out, np.ndarray)
               else type(out).__name__)
        raise ConfigurationError(
            f"allreduce out: expected an array of shape {array.shape} and dtype {array.dtype}, "
            f"got {got}"
        )
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ConfigurationError("allreduce out: must be C-contiguous and writable")
    if out.size and np.shares_memory(out, array):
        raise ConfigurationError("allreduce out: must not share memory with the input")
    return out.reshape(-1)


class Communicator(abc.ABC):
    """Collectives over numpy buffers among ``world_size`` ranks.

    Every method is collective: all ranks call it in the same order. Every wait is bounded by
    the communicator's timeout; on expiry, or when a peer is dead or misbehaves, the method
    raises :class:`sparkdl.errors.CommunicationError` naming the peer (rank and host).
    Results are identical, bit for bit, on every rank.
    """

    rank: int
    world_size: int
    counters: TrafficCounters

    @abc.abstractmethod
    def allgather(self, message: bytes | memoryview) -> list[bytes]:
        """Gather one variable-size message from each rank; returns them in rank order."""

    @abc.abstractmethod
    def allreduce(
        self, array: np.ndarray, op: str = "sum", *, out: np.ndarray | None = None
    ) -> np.ndarray:
        """Element-wise reduction (``"sum"`` or ``"mean"``) of a 1-D float array of equal
        length and dtype on every rank. Returns a new array, or ``out`` holding the result (a
        writable C-contiguous array of ``array``'s shape and dtype, apart from it: a buffer
        the caller reuses, e.g. one aligned for a zero-copy hand-off); the same bits either
        way. The input is left unchanged."""

    @abc.abstractmethod
    def broadcast(self, message: bytes | memoryview | None, root: int = 0) -> bytes:
        """Send ``message`` from ``root`` to every rank; every rank returns the bytes."""

    @abc.abstractmethod
    def barrier(self) -> None:
        """Return only once every rank has entered the barrier."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release sockets and threads. Idempotent."""

    # Conveniences shared by every transport -------------------------------------------------

    def broadcast_array(self, array: np.ndarray, root: int = 0) -> np.ndarray:
        """Broadcast a numpy array of known shape and dtype from ``root``."""
        data = self.broadcast(array.tobytes() if self.rank == root else None, root)
        return np.frombuffer(data, dtype=array.dtype).reshape(array.shape).copy()

    def allgather_arrays(self, array: np.ndarray) -> Sequence[np.ndarray]:
        """Gather a same-dtype 1-D array from each rank (lengths may differ)."""
        return [np.frombuffer(m, dtype=array.dtype) for m in self.allgather(array.tobytes())]

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
