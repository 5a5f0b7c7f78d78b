"""The collective-communication interface shared by every transport."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass
class TrafficCounters:
    """Bytes this rank put on and took off the wire (payload plus framing). Payload that the
    TCP ring moves through same-host shared memory counts as if it had crossed the wire, so
    figures compare across hosts and with shared memory switched off."""

    bytes_sent: int = 0
    bytes_received: int = 0

    def snapshot(self) -> tuple[int, int]:
        return self.bytes_sent, self.bytes_received


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
    def allreduce(self, array: np.ndarray, op: str = "sum") -> np.ndarray:
        """Element-wise reduction (``"sum"`` or ``"mean"``) of a 1-D float array of equal
        length and dtype on every rank. Returns a new array; the input is left unchanged."""

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
