"""The collective-communication interface shared by every transport."""

from __future__ import annotations

import abc
import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sparkdl.errors import CommunicationError, ConfigurationError


@dataclass
class TrafficCounters:
    """Bytes this rank put on and took off the wire (payload plus framing). Payload that the
    TCP ring moves through same-host shared memory counts as if it had crossed the wire, so
    figures compare across hosts and with shared memory switched off."""

    bytes_sent: int = 0
    bytes_received: int = 0

    def snapshot(self) -> tuple[int, int]:
        return self.bytes_sent, self.bytes_received


def reduce_destination(array: np.ndarray | Segments, out: np.ndarray | None
                       ) -> np.ndarray | None:
    """``out`` as a flat view to reduce ``array`` (or :class:`Segments`: a flat result) into
    (None stays None); a clear error when it cannot be: another shape or dtype, not
    C-contiguous, read-only, or sharing memory with the input."""
    if out is None:
        return None
    shape = (array.size,) if isinstance(array, Segments) else array.shape
    if not isinstance(out, np.ndarray) or out.shape != shape or out.dtype != array.dtype:
        got = (f"{out.shape} {out.dtype}" if isinstance(out, np.ndarray)
               else type(out).__name__)
        raise ConfigurationError(
            f"allreduce out: expected an array of shape {shape} and dtype {array.dtype}, "
            f"got {got}"
        )
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ConfigurationError("allreduce out: must be C-contiguous and writable")
    shared = (array.overlaps(out) if isinstance(array, Segments)
              else out.size and np.shares_memory(out, array))
    if shared:
        raise ConfigurationError("allreduce out: must not share memory with the input")
    return out.reshape(-1)


def check_reduce_op(op: str) -> None:
    """A clear error unless ``op`` is an allreduce op every transport has."""
    if op not in ("sum", "mean"):
        raise ConfigurationError(f"allreduce op: expected 'sum' or 'mean', got {op!r}")


def check_broadcast_root(root: int, world_size: int) -> None:
    """A clear error unless ``root`` is a rank of a world of ``world_size``."""
    if not 0 <= root < world_size:
        raise ConfigurationError(
            f"broadcast root: expected 0 <= root < {world_size}, got {root}")


def broadcast_destination(array: np.ndarray, *, writable: bool) -> memoryview:
    """``array``'s bytes, to broadcast from (the root) or into (``writable``); a clear error
    when ``array`` is not a C-contiguous numpy array, or not writable where it must be."""
    if not isinstance(array, np.ndarray):
        raise ConfigurationError(f"broadcast_into: expected a numpy array, got "
                                 f"{type(array).__name__}")
    if not array.flags.c_contiguous:
        raise ConfigurationError("broadcast_into: the array must be C-contiguous")
    if writable and not array.flags.writeable:
        raise ConfigurationError("broadcast_into: the array must be writable off the root")
    return array.reshape(-1).view(np.uint8).data


class Segments:
    """A 1-D vector held as consecutive pieces (e.g. one gradient per model variable), read
    in place: ranges of it come as views of the pieces, never as a concatenated copy."""

    def __init__(self, pieces: Sequence[np.ndarray]) -> None:
        arrays = list(pieces)
        if not arrays or not all(isinstance(a, np.ndarray) for a in arrays):
            raise ConfigurationError("allreduce pieces: expected a non-empty sequence of arrays")
        dtype = arrays[0].dtype
        for i, a in enumerate(arrays):
            if a.dtype != dtype or not a.flags.c_contiguous:
                layout = "C-contiguous" if a.flags.c_contiguous else "non-contiguous"
                raise ConfigurationError(
                    f"allreduce pieces: piece {i} must be a C-contiguous {dtype} array (as "
                    f"piece 0), got a {layout} {a.dtype} array"
                )
        self.arrays = [a.reshape(-1) for a in arrays]
        self.dtype = dtype
        self.bounds = [0]
        for a in self.arrays:
            self.bounds.append(self.bounds[-1] + a.size)
        self.size = self.bounds[-1]

    def parts(self, start: int, stop: int) -> list[tuple[np.ndarray, int]]:
        """``(view, at)`` for each piece overlapping the elements ``start:stop``: the piece's
        share, and where that share begins within ``start:stop``."""
        found = []
        i = max(0, bisect.bisect_right(self.bounds, start) - 1)
        while i < len(self.arrays) and self.bounds[i] < stop:
            low = self.bounds[i]
            a, b = max(start, low), min(stop, self.bounds[i + 1])
            if a < b:
                found.append((self.arrays[i][a - low : b - low], a - start))
            i += 1
        return found

    def add(self, left: np.ndarray, start: int, out: np.ndarray) -> None:
        """``out = left + self[start:start + len(out)]`` (``left`` may be ``out``)."""
        if len(self.arrays) == 1:
            np.add(left, self.arrays[0][start : start + out.size], out=out)
            return
        for part, at in self.parts(start, start + out.size):
            np.add(left[at : at + part.size], part, out=out[at : at + part.size])

    def concatenate(self, out: np.ndarray | None = None) -> np.ndarray:
        """A copy of the whole vector (into ``out``, flat, when given)."""
        return np.concatenate(self.arrays, out=out)

    def overlaps(self, array: np.ndarray) -> bool:
        return any(np.shares_memory(array, a) for a in self.arrays if a.size)


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
    #: The layout of the links: ``"flat"`` (every rank on one ring, or through one exchange)
    #: or ``"hierarchical"`` (a ring per host, then the hosts' leaders').
    topology = "flat"
    #: What this communicator's log lines call it, before its rank (a two-level topology
    #: names each ring and the world ranks of its ranks); None: the rank alone.
    name: str | None = None

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

    def allreduce_pieces(
        self, pieces: Sequence[np.ndarray], op: str = "sum", *, out: np.ndarray | None = None
    ) -> np.ndarray:
        """:meth:`allreduce` of the concatenation of ``pieces`` (1-D or any shape, C-contiguous,
        one dtype), returned flat: the same bits as ``allreduce(np.concatenate(...))``. A
        transport that can read the pieces in place (the TCP ring) never concatenates them;
        this default does."""
        return self.allreduce(Segments(pieces).concatenate(), op, out=out)

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

    def broadcast_into(self, array: np.ndarray, root: int = 0) -> np.ndarray:
        """Broadcast ``array``'s contents from ``root`` into every rank's ``array`` (the same
        shape and dtype on every rank; C-contiguous, writable off the root) and return it.
        A transport that can receive in place (the TCP ring) makes no copy."""
        raw = broadcast_destination(array, writable=self.rank != root)
        data = self.broadcast(raw if self.rank == root else None, root)
        if self.rank != root:
            if len(data) != array.nbytes:
                raise CommunicationError(
                    f"broadcast: rank {root} sent {len(data)} bytes, expected {array.nbytes} "
                    f"({array.shape} {array.dtype})")
            np.frombuffer(raw, np.uint8)[:] = np.frombuffer(data, np.uint8)
        return array

    def allgather_arrays(self, array: np.ndarray) -> Sequence[np.ndarray]:
        """Gather a same-dtype 1-D array from each rank (lengths may differ)."""
        return [np.frombuffer(m, dtype=array.dtype) for m in self.allgather(array.tobytes())]

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
