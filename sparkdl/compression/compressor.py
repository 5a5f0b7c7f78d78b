"""Compressors (GRACE's *Compressor*): one worker's update in, one wire frame out.

GRACE-style separation: a :class:`Compressor` encodes and decodes; its
:class:`~sparkdl.compression.memory.Memory` holds the residual (error feedback, host numpy or
device variable, with its own state); a threshold algorithm
(:mod:`~sparkdl.compression.threshold`) chooses tau; the encoding and framing are pure
functions; the communicator (``sparkdl.comm``) moves the frames. Each step a worker calls
:meth:`Compressor.compress` on its update, exchanges the frames (all ranks, in rank order),
and every worker calls :meth:`Compressor.decompress_sum` on the same list, which yields the
same float32 sum bit for bit on every worker.

A :class:`CompressorConfig` is the plain-data description of a compressor
(``get_config``/``from_config``) that a training master carries to the workers, where
:meth:`CompressorConfig.build` makes the per-worker compressor. A new compressor is one
:class:`Compressor` subclass plus its config class (decorated with
:func:`register_compressor`).
"""

from __future__ import annotations

import abc
import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from sparkdl.compression.encoding import (
    EncodedUpdate,
    Encoding,
    decode_into,
    sparse_entries,
    threshold_encode,
)
from sparkdl.compression.memory import HostMemory, Memory, PiecewiseMemory
from sparkdl.compression.threshold import (
    AdaptiveThreshold,
    ResidualClipping,
    ResidualPostProcessor,
    ShakeUp,
    ThresholdAlgorithm,
    threshold_from_config,
    threshold_to_config,
)
from sparkdl.compression.wire import pack_frame, unpack_frame
from sparkdl.errors import CommunicationError, ConfigurationError, unknown_name

__all__ = [
    "Compressor",
    "CompressorConfig",
    "EncodingStats",
    "ThresholdCompressor",
    "ThresholdCompressorConfig",
    "compressor_from_config",
    "compressor_to_config",
    "register_compressor",
]


@dataclass
class EncodingStats:
    """What one :meth:`Compressor.compress` call did.

    ``bytes_encoded`` is the whole frame (header plus payload); ``encode_seconds`` covers the
    residual update, encoding, post-processing and framing.
    """

    step: int
    tau: float
    nnz: int
    num_elements: int
    sparsity: float
    encoding: str
    bytes_encoded: int
    encode_seconds: float
    shake_up: bool


class Compressor(abc.ABC):
    """One worker's compressor: its :attr:`memory` (the residual), its job id and rank.

    State (``get_state`` / ``set_state``): the memory's state under ``"memory."`` keys plus
    whatever the subclass adds; values are numpy arrays or Python numbers.
    """

    def __init__(self, memory: Memory, *, job_id: int = 0, rank: int = 0) -> None:
        if not isinstance(memory, Memory):
            raise ConfigurationError(f"memory must be a Memory, got {type(memory).__name__}")
        for name, value, limit in (("job_id", job_id, 2**64), ("rank", rank, 2**32)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < limit:
                raise ConfigurationError(
                    f"{name} must be an integer in [0, {limit}), got {value!r}"
                )
        self.memory = memory
        self.job_id = job_id
        self.rank = rank

    @property
    def num_elements(self) -> int:
        return self.memory.num_elements

    @property
    def residual(self) -> np.ndarray:
        """The memory's residual as numpy (a device memory returns a copy)."""
        return self.memory.residual

    @residual.setter
    def residual(self, value: np.ndarray) -> None:
        self.memory.set_residual(value)

    def get_residual(self) -> np.ndarray:
        """A host copy of the residual."""
        return self.memory.get_residual()

    def set_residual(self, value: np.ndarray) -> None:
        """Replace the residual (float32, length :attr:`num_elements`)."""
        self.memory.set_residual(value)

    @abc.abstractmethod
    def compress(self, update: Any, step: int) -> tuple[bytes, EncodingStats]:
        """Add ``update`` to the memory, encode, and return ``(frame, stats)``."""

    @abc.abstractmethod
    def decompress_sum(
        self, frames: Sequence[bytes | memoryview], step: int, out: np.ndarray | None = None
    ) -> np.ndarray:
        """Sum all ranks' frames (``frames[i]`` from rank ``i``) into ``out`` (zeroed first)."""

    def decompress_sparse_sum(
        self, frames: Sequence[bytes | memoryview], step: int, scratch: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """The sum of :meth:`decompress_sum` as ``(index, values)`` — every element some frame
        touched, ascending, and its sum — or None when this compressor (or one of these
        frames) has no sparse form; ``scratch`` is a zero float32 vector, left zero."""
        return None

    def get_state(self) -> dict[str, Any]:
        """This rank's compressor state: ``{"memory.residual": ..., ...}``."""
        return prefixed("memory", self.memory.get_state())

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state` output."""
        self.memory.set_state(unprefixed("memory", state))

    def _check(self, name: str, array: object) -> np.ndarray:
        if (
            not isinstance(array, np.ndarray)
            or array.dtype != np.float32
            or array.shape != (self.num_elements,)
        ):
            got = (
                f"{array.dtype} array of shape {array.shape}"
                if isinstance(array, np.ndarray)
                else type(array).__name__
            )
            raise ConfigurationError(
                f"{name} must be a float32 array of shape ({self.num_elements},), got {got}"
            )
        return array


def prefixed(prefix: str, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with every key written ``prefix.key`` (flat nested state dicts)."""
    return {f"{prefix}.{key}": value for key, value in state.items()}


def unprefixed(prefix: str, state: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``state`` under ``prefix.``, without the prefix."""
    if not isinstance(state, dict):
        raise ConfigurationError(f"state must be a dict, got {type(state).__name__}")
    start = prefix + "."
    return {key[len(start):]: value for key, value in state.items() if key.startswith(start)}


class ThresholdCompressor(Compressor):
    """Error-feedback threshold compression of one worker's flattened update vector.

    The memory's residual starts at zeros. Each :meth:`compress` adds the update to it,
    encodes the elements with ``|r| >= tau`` as ``±tau`` (subtracting them in place), lets the
    memory post-process it (e.g. clip), and returns a wire frame. Shake-up steps encode with
    ``tau * shake_up.factor`` and are not reported to ``threshold.observe`` (their sparsity
    says nothing about tau). State: ``memory.residual`` plus the threshold algorithm's state
    under ``threshold.`` (e.g. ``threshold.tau``).

    Args:
        num_elements: Length of the update vector.
        threshold: Chooses tau each step (this compressor's own copy: it keeps state).
        shake_up: Shake-up schedule (None: never).
        post_processor: Applied to the residual after each encode (e.g.
            :class:`~sparkdl.compression.threshold.ResidualClipping`).
        job_id: Written into every frame; frames of another job are rejected.
        rank: This worker's rank, written into every frame.
        memory: The residual memory; default a new :class:`HostMemory` with
            ``post_processor``. Subclasses that encode elsewhere pass their own
            (``memory_type``).
    """

    #: The memory type :meth:`compress` works on.
    memory_type: ClassVar[type[Memory]] = HostMemory

    def __init__(
        self,
        num_elements: int,
        threshold: ThresholdAlgorithm,
        *,
        shake_up: ShakeUp | None = None,
        post_processor: ResidualPostProcessor | None = None,
        job_id: int = 0,
        rank: int = 0,
        memory: Memory | None = None,
    ) -> None:
        if memory is None:
            memory = HostMemory(num_elements, post_processor)
        elif post_processor is not None or memory.num_elements != num_elements:
            raise ConfigurationError(
                "give either a memory (with its own post-processor and num_elements "
                f"{num_elements!r}) or a post_processor, got memory {memory!r} and "
                f"post_processor {post_processor!r}"
            )
        if not isinstance(memory, self.memory_type):
            raise ConfigurationError(
                f"{type(self).__name__} needs a {self.memory_type.__name__}, "
                f"got {type(memory).__name__}"
            )
        if not isinstance(threshold, ThresholdAlgorithm):
            raise ConfigurationError(
                f"threshold must be a ThresholdAlgorithm, got {type(threshold).__name__}"
            )
        if shake_up is not None and not isinstance(shake_up, ShakeUp):
            raise ConfigurationError(f"shake_up must be a ShakeUp, got {shake_up!r}")
        super().__init__(memory, job_id=job_id, rank=rank)
        self.threshold = threshold
        self.shake_up = shake_up

    @property
    def post_processor(self) -> ResidualPostProcessor | None:
        return self.memory.post_processor

    def get_state(self) -> dict[str, Any]:
        return {**super().get_state(), **prefixed("threshold", self.threshold.get_state())}

    def set_state(self, state: dict[str, Any]) -> None:
        known = ("memory.", "threshold.")
        unknown = sorted(k for k in state if not k.startswith(known))
        if unknown:
            raise ConfigurationError(f"{type(self).__name__} state has unknown keys {unknown}")
        threshold = unprefixed("threshold", state)
        super().set_state(state)
        self.threshold.set_state(threshold)

    def shaken_tau(self, tau: float, step: int) -> tuple[bool, float]:
        """``(shake, encode_tau)``: whether ``step`` is a shake-up step, and the tau to
        encode with."""
        shake = self.shake_up is not None and self.shake_up.due(step)
        return shake, tau * self.shake_up.factor if shake and self.shake_up else tau

    def compress(
        self, update: np.ndarray | Sequence[np.ndarray], step: int
    ) -> tuple[bytes, EncodingStats]:
        """Add ``update`` to the residual, encode it, and return ``(frame, stats)``.

        ``update``: the float32 vector, or its consecutive pieces (float32 arrays of any
        shape whose sizes add up to ``num_elements``; each is added to its slice of the
        residual, so the caller need not concatenate them)."""
        if isinstance(self.memory, PiecewiseMemory):
            raise ConfigurationError(
                "the residual is held in pieces whose owner adds the update: call compress_held"
            )
        started = time.perf_counter()
        residual = self.memory.residual
        if not isinstance(update, np.ndarray):
            self._add_pieces(residual, update)
            add = None
        elif self.threshold.uses_residual:
            self._check("update", update)
            np.add(residual, update, out=residual)
            add = None
        else:
            add = self._check("update", update)  # fused into the encode sweep
        tau = self.threshold.select(residual, step)  # reads the residual only if uses_residual
        shake, encode_tau = self.shaken_tau(tau, step)
        encoded = threshold_encode(residual, encode_tau, add=add)
        self.memory.post_process(tau, step)
        return self.finish_frame(encoded, step, shake, started)

    def hold_residual_in(self, memory: PiecewiseMemory) -> None:
        """Keep the residual in ``memory`` from now on: the current residual and the
        post-processor move there. Its owner then adds each update to it and calls
        :meth:`compress_held` instead of :meth:`compress` (the same frames, the same bits)."""
        if not isinstance(memory, PiecewiseMemory) or memory.num_elements != self.num_elements:
            raise ConfigurationError(
                f"need a PiecewiseMemory of {self.num_elements} elements, got {memory!r}"
            )
        memory.set_residual(self.memory.get_residual())
        memory.post_processor = self.memory.post_processor
        self.memory = memory

    def compress_held(self, step: int) -> tuple[bytes, EncodingStats]:
        """:meth:`compress` of a :class:`~sparkdl.compression.memory.PiecewiseMemory` that
        already holds this step's update: select tau, encode and post-process the pieces in
        place, without ever concatenating them. The update added to the memory is checked by
        the encode sweep itself: a non-finite element raises
        :class:`~sparkdl.errors.NonFiniteError` before anything is encoded (the residual and
        the threshold's observations unchanged; a threshold that picks tau from a sample may
        have picked it)."""
        memory = self.memory
        if not isinstance(memory, PiecewiseMemory):
            raise ConfigurationError("compress_held needs a PiecewiseMemory (hold_residual_in)")
        started = time.perf_counter()
        residual = memory.pieces()
        tau = self.threshold.select_pieces(residual, step)
        shake, encode_tau = self.shaken_tau(tau, step)
        encoded = threshold_encode(residual, encode_tau, check_finite=True)
        memory.post_process(tau, step)
        return self.finish_frame(encoded, step, shake, started)

    def _add_pieces(self, residual: np.ndarray, pieces: Sequence[np.ndarray]) -> None:
        arrays = [np.asarray(piece) for piece in pieces]
        sizes = [a.size for a in arrays]
        if sum(sizes) != self.num_elements or any(a.dtype != np.float32 for a in arrays):
            raise ConfigurationError(
                f"update pieces must be float32 arrays of {self.num_elements} elements in all, "
                f"got sizes {sizes} and dtypes {sorted({str(a.dtype) for a in arrays})}"
            )
        start = 0
        for array, size in zip(arrays, sizes):
            piece = residual[start:start + size]
            np.add(piece, array.reshape(-1), out=piece)
            start += size

    def finish_frame(
        self, encoded: EncodedUpdate, step: int, shake: bool, started: float
    ) -> tuple[bytes, EncodingStats]:
        """Feed the threshold algorithm, frame the message, and measure (shared by every
        threshold encoder, host or device: a shake-up step's sparsity does not steer the
        threshold)."""
        if not shake:
            self.threshold.observe(encoded.nnz, self.num_elements)
        frame = pack_frame(encoded, job_id=self.job_id, rank=self.rank, step=step)
        stats = EncodingStats(
            step=step,
            tau=encoded.tau,
            nnz=encoded.nnz,
            num_elements=self.num_elements,
            sparsity=encoded.nnz / self.num_elements if self.num_elements else 0.0,
            encoding="sparse" if encoded.encoding is Encoding.SPARSE else "bitmap",
            bytes_encoded=len(frame),
            encode_seconds=time.perf_counter() - started,
            shake_up=shake,
        )
        return frame, stats

    def decompress_sum(
        self, frames: Sequence[bytes | memoryview], step: int, out: np.ndarray | None = None
    ) -> np.ndarray:
        """Sum all ranks' frames (``frames[i]`` from rank ``i``) into ``out`` (zeroed first).

        Frames are validated and decoded in rank order, so the float32 result is identical on
        every worker. Raises :class:`CommunicationError` for a bad frame (naming its rank).
        """
        if out is None:
            out = np.zeros(self.num_elements, np.float32)
        else:
            self._check("out", out)
            out.fill(0)
        for position, header, payload in self._unpacked(frames, step):
            self._decode(position, header, payload, out)
        return out

    def decompress_sparse_sum(
        self, frames: Sequence[bytes | memoryview], step: int, scratch: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """:meth:`decompress_sum` in O(entries) when every frame is sparse: the same additions
        in the same order (rank order, starting from zero), done on the entries alone (a
        merge of sorted index lists; ``scratch`` is checked and left zero)."""
        self._check("scratch", scratch)
        unpacked = list(self._unpacked(frames, step))
        if any(header.encoding is not Encoding.SPARSE for _, header, _ in unpacked):
            return None
        indices: list[np.ndarray] = []
        values: list[np.ndarray] = []
        for position, header, payload in unpacked:
            try:
                entries, signed = sparse_entries(payload, self.num_elements, header.tau)
            except CommunicationError as exc:
                raise CommunicationError(f"bad frame from rank {position}: {exc}") from None
            if entries.size:
                indices.append(entries)
                values.append(signed)
        if len(indices) <= 1:  # 0 + v == v exactly
            if not indices:
                return np.zeros(0, np.int64), np.zeros(0, np.float32)
            return indices[0].astype(np.int64), values[0]
        return _merge_sums(indices, values)

    def _unpacked(
        self, frames: Sequence[bytes | memoryview], step: int
    ) -> list[tuple[int, Any, Any]]:
        """``(position, header, payload)`` of every frame, all validated first."""
        world_size = len(frames)
        out: list[tuple[int, Any, Any]] = []
        for position, frame in enumerate(frames):
            header, payload = unpack_frame(
                frame,
                job_id=self.job_id,
                num_elements=self.num_elements,
                world_size=world_size,
                step=step,
            )
            if header.rank != position:
                raise CommunicationError(
                    f"bad frame at position {position}: rank expected {position}, got {header.rank}"
                )
            out.append((position, header, payload))
        return out

    def _decode(self, position: int, header: Any, payload: Any, out: np.ndarray) -> None:
        try:
            decode_into(header.encoding, payload, self.num_elements, header.tau, out)
        except CommunicationError as exc:
            raise CommunicationError(f"bad frame from rank {position}: {exc}") from None


def _merge_sums(
    indices: Sequence[np.ndarray], values: Sequence[np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """The union (int64, ascending) of several ascending unique index lists, and at each
    union index the float32 sum, from zero in list order, of the lists' values there. The
    values of one list are ``+t`` or ``-t`` for one ``t > 0`` (as from :func:`sparse_entries`).

    Each entry becomes one int64 key ``index, list, sign`` (high to low bits); one sort of
    all keys groups them by index, each group in list order, and the key gives back the
    value. The groups are summed left to right, one vectorised addition per rank within a
    group: the same additions, in the same order, as merging the lists one at a time."""
    lists = len(indices)
    bits = (2 * lists - 1).bit_length()  # (list << 1) | sign
    table = np.empty(1 << bits, np.float32)
    ordered = np.empty(sum(index.size for index in indices), np.int64)
    start = 0
    for position, (index, value) in enumerate(zip(indices, values)):
        key = ordered[start : start + index.size]
        start += index.size
        np.left_shift(index, bits, out=key, dtype=np.int64)
        key |= position << 1
        key |= np.signbit(value)
        t = np.abs(value[0])
        table[2 * position], table[2 * position + 1] = t, -t
    # keys are unique: any sort gives one order; timsort merges two ascending runs fastest
    ordered.sort(kind="stable" if lists <= 2 else None)
    summands = table[ordered & ((1 << bits) - 1)]
    ordered >>= bits
    first = np.empty(ordered.size, np.bool_)
    first[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    total = summands[starts]  # 0 + v == v exactly
    sizes = np.empty_like(starts)
    np.subtract(starts[1:], starts[:-1], out=sizes[:-1])
    sizes[-1] = ordered.size - starts[-1]
    for rank in range(1, int(sizes.max())):
        more = np.flatnonzero(sizes > rank)
        total[more] += summands[starts[more] + rank]
    return ordered[first], total


class CompressorConfig(abc.ABC):
    """What a training master carries to its workers to build their compressors: plain
    configuration (``get_config`` / ``from_config``, Keras-style), no per-worker state."""

    #: The collective its messages travel by: ``"allgather"`` (every rank's frame reaches
    #: every rank: threshold) or ``"allreduce"`` (the messages are summed: PowerSGD).
    collective: ClassVar[str] = "allgather"

    @abc.abstractmethod
    def build(self, num_elements: int, *, job_id: int, rank: int,
              shapes: Sequence[Sequence[int]] | None = None) -> Compressor:
        """A new compressor for one worker's ``num_elements``-element update (host side);
        ``shapes``: the trainable tensors' shapes in the update's order (for compressors
        that work per tensor)."""

    @abc.abstractmethod
    def get_config(self) -> dict[str, Any]:
        """Constructor arguments, JSON-compatible."""

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> CompressorConfig:
        """Rebuild from :meth:`get_config` output."""
        try:
            return cls(**config)
        except TypeError as exc:
            raise ConfigurationError(f"bad {cls.__name__} config {config!r}: {exc}") from None

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


class ThresholdCompressorConfig(CompressorConfig):
    """Threshold compression (Strom 2015): the default of ``SharedTrainingMaster``.

    Args:
        threshold: The threshold algorithm (default :class:`AdaptiveThreshold` starting at
            1e-3). Every worker gets its own copy.
        shake_up: Shake-up schedule (default :class:`ShakeUp`: never).
        residual_post_processor: Applied to the residual after each encode (default
            :class:`ResidualClipping`: ``±5 tau`` every 5 steps; None: nothing).
    """

    def __init__(
        self,
        threshold: ThresholdAlgorithm | None = None,
        shake_up: ShakeUp | None = None,
        residual_post_processor: ResidualPostProcessor | None = ResidualClipping(),  # noqa: B008
    ) -> None:
        threshold = threshold if threshold is not None else AdaptiveThreshold()
        shake_up = shake_up if shake_up is not None else ShakeUp()
        if not isinstance(threshold, ThresholdAlgorithm):
            raise ConfigurationError(
                f"threshold must be a ThresholdAlgorithm, got {type(threshold).__name__}"
            )
        if not isinstance(shake_up, ShakeUp):
            raise ConfigurationError(f"shake_up must be a ShakeUp, got {shake_up!r}")
        if residual_post_processor is not None and not isinstance(
            residual_post_processor, ResidualPostProcessor
        ):
            raise ConfigurationError(
                "residual_post_processor must be a ResidualPostProcessor, "
                f"got {residual_post_processor!r}"
            )
        self.threshold = threshold
        self.shake_up = shake_up
        self.residual_post_processor = copy.deepcopy(residual_post_processor)

    def build(self, num_elements: int, *, job_id: int, rank: int,
              shapes: Sequence[Sequence[int]] | None = None) -> ThresholdCompressor:
        return ThresholdCompressor(
            num_elements,
            copy.deepcopy(self.threshold),
            shake_up=self.shake_up,
            post_processor=self.residual_post_processor,
            job_id=job_id,
            rank=rank,
        )

    def get_config(self) -> dict[str, Any]:
        post = self.residual_post_processor
        return {
            "threshold": threshold_to_config(self.threshold),
            "shake_up": threshold_to_config(self.shake_up),
            "residual_post_processor": None if post is None else threshold_to_config(post),
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ThresholdCompressorConfig:
        config = dict(config)
        for key in ("threshold", "shake_up", "residual_post_processor"):
            if isinstance(config.get(key), dict):
                config[key] = threshold_from_config(config[key])
        return super().from_config(config)  # type: ignore[return-value]


_COMPRESSORS: dict[str, type[CompressorConfig]] = {}


def register_compressor(cls: type[CompressorConfig]) -> type[CompressorConfig]:
    """Class decorator: make a :class:`CompressorConfig` subclass known to
    :func:`compressor_from_config` by its class name (its module must be imported wherever
    the config is rebuilt; ``SharedTrainingMaster.from_config`` imports the recorded one)."""
    if not (isinstance(cls, type) and issubclass(cls, CompressorConfig)):
        raise ConfigurationError(f"only CompressorConfig subclasses register, got {cls!r}")
    known = _COMPRESSORS.get(cls.__name__)
    if known is not None and known is not cls:
        raise ConfigurationError(
            f"a different compressor named {cls.__name__!r} is registered ({known.__module__})"
        )
    _COMPRESSORS[cls.__name__] = cls
    return cls


register_compressor(ThresholdCompressorConfig)


def compressor_to_config(config: CompressorConfig) -> dict[str, Any]:
    """``{"class_name", "module", "config"}``: plain data that rebuilds ``config`` with
    :func:`compressor_from_config`."""
    if not isinstance(config, CompressorConfig):
        raise ConfigurationError(f"compressor must be a CompressorConfig, got {config!r}")
    cls = type(config)
    if _COMPRESSORS.get(cls.__name__) is not cls:
        raise ConfigurationError(
            f"cannot serialise compressor {cls.__name__}: decorate it with register_compressor"
        )
    return {"class_name": cls.__name__, "module": cls.__module__, "config": config.get_config()}


def compressor_from_config(config: dict[str, Any]) -> CompressorConfig:
    """Inverse of :func:`compressor_to_config` (the class must be registered here)."""
    if not isinstance(config, dict) or not isinstance(config.get("class_name"), str):
        raise ConfigurationError(f"compressor config needs a 'class_name', got {config!r}")
    name = config["class_name"]
    cls = _COMPRESSORS.get(name)
    if cls is None:
        raise unknown_name("compressor class_name", name, _COMPRESSORS,
                           where=f"compressor of module {config.get('module')!r}")
    args = config.get("config", {})
    if not isinstance(args, dict):
        raise ConfigurationError(f"compressor 'config' must be a dict, got {args!r}")
    return cls.from_config(dict(args))
