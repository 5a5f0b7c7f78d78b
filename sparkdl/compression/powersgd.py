"""PowerSGD (Vogels et al. 2019): rank-r compression whose messages are summed by an allreduce.

Each worker's gradient, compensated by its memory (error feedback), is split per tensor. A
tensor whose matrix form ``M`` (``prod(shape[:-1]) × shape[-1]``, Keras's kernel layout) is at
least ``min_compression`` times larger than its factors is sent as two rank-``r`` factors; the
others (biases, normalisation vectors, small matrices) are sent whole. One step, on every
worker, in GRACE's order (the exchange drives it, :class:`~sparkdl.training.exchanges.powersgd.
PowerSGDExchange`)::

    M = memory.compensate(gradient)
    first  = [dense tensors, P = M Q]          -> allreduce (sum)
    orthogonalise P;  second = Mᵀ P            -> allreduce (sum)
    Q = second / N;   mean ≈ [dense / N, P Qᵀ]
    memory.update(M - mean)                    (low-rank tensors only; dense ones are exact)

Every worker orthogonalises the same summed ``P`` and divides the same summed ``Q``, so the
decompressed mean has the same bits on every rank. ``Q`` starts from a seeded normal draw
(the same on every rank) and, with ``warm_start``, the next step starts from this step's ``Q``
(one power iteration per step, as PyTorch's ``powerSGD_hook``). Bytes per worker per step
are those of the factors and the dense tensors: independent of the number of workers except
for the ring allreduce's own ``2(N−1)/N``. Before ``start_step`` the whole gradient is
allreduced (a warm-up of plain averaging, PyTorch's ``start_powerSGD_iter``).

State: ``memory.residual`` and one ``q.<i>`` per compressed tensor (checkpointed: a resumed
fit continues with the same bits).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from sparkdl.compression.compressor import (
    Compressor,
    CompressorConfig,
    EncodingStats,
    prefixed,
    register_compressor,
    unprefixed,
)
from sparkdl.compression.memory import HostMemory
from sparkdl.errors import ConfigurationError

__all__ = ["PowerSGDCompressor", "PowerSGDCompressorConfig", "message_floats"]

#: Added to a column's norm before dividing (PyTorch's ``orthogonalization_epsilon``): an
#: all-zero column stays zero instead of becoming NaN.
EPSILON = np.float32(1e-8)


@dataclass(frozen=True)
class _Block:
    """One tensor's place in the flat update: ``[start, start + rows * cols)``."""

    start: int
    rows: int
    cols: int
    low_rank: bool

    @property
    def size(self) -> int:
        return self.rows * self.cols

    @property
    def stop(self) -> int:
        return self.start + self.size


def _matrix_shape(shape: Sequence[int]) -> tuple[int, int]:
    if len(shape) < 2:
        return int(np.prod(shape, dtype=np.int64)), 1
    return int(np.prod(shape[:-1], dtype=np.int64)), int(shape[-1])


def _plan(shapes: Sequence[Sequence[int]], rank: int, min_compression: float) -> list[_Block]:
    """Each tensor's place in the flat update and whether it travels as factors: a matrix
    with at least ``min_compression`` times its factors' elements."""
    blocks, start = [], 0
    for shape in shapes:
        rows, cols = _matrix_shape(shape)
        low_rank = len(shape) >= 2 and rows * cols >= min_compression * (rows + cols) * rank
        blocks.append(_Block(start, rows, cols, low_rank))
        start += rows * cols
    return blocks


def message_floats(shapes: Sequence[Sequence[int]], rank: int = 4,
                   min_compression: float = 2.0) -> int:
    """Floats one PowerSGD step allreduces, both messages together: ``(rows + cols) · rank``
    per compressed matrix, the whole of every other tensor (no compressor built)."""
    return sum((b.rows + b.cols) * rank if b.low_rank else b.size
               for b in _plan(shapes, rank, min_compression))


def rank_too_large(shapes: Sequence[Sequence[int]], rank: int,
                   min_compression: float = 2.0) -> str | None:
    """A line saying that ``rank`` compresses none of a model's matrices (``shapes``) because
    it is not below their smaller dimension (PowerSGD would then allreduce every tensor
    whole, silently); ``None`` when some matrix is compressed or there is none."""
    matrices = [_matrix_shape(s) for s in shapes if len(s) >= 2]
    if not matrices or any(b.low_rank for b in _plan(shapes, rank, min_compression)):
        return None
    widest = max(min(m) for m in matrices)
    if rank < widest:
        return None  # min_compression, not the rank, keeps the factors whole
    return (f"powersgd.rank={rank} is not below the smaller dimension of any of the model's "
            f"{len(matrices)} weight matrices (at most {widest}): no tensor is compressed and "
            "every step allreduces the whole update")


class PowerSGDCompressor(Compressor):
    """One worker's PowerSGD state: the residual, each compressed tensor's ``Q``.

    Args:
        shapes: The trainable tensors' shapes, in the flat update's order.
        rank: The approximation rank ``r``.
        min_compression: Compress a tensor only if its matrix has at least this many times
            the factors' elements (``rows · cols ≥ min_compression · (rows + cols) · r``).
        warm_start: Start each step's power iteration from the previous step's ``Q``.
        start_step: Steps before this one allreduce the whole gradient.
        seed: Seed of the initial ``Q`` (the same on every worker).
        job_id: This job's id; rank: this worker's rank (as every compressor).
    """

    #: The collective the exchange uses for this compressor's messages.
    collective: ClassVar[str] = "allreduce"

    def __init__(
        self,
        shapes: Sequence[Sequence[int]],
        *,
        rank: int = 4,
        min_compression: float = 2.0,
        warm_start: bool = True,
        start_step: int = 0,
        seed: int = 0,
        job_id: int = 0,
        worker_rank: int = 0,
    ) -> None:
        blocks = _plan(shapes, rank, min_compression)
        super().__init__(HostMemory(sum(b.size for b in blocks)), job_id=job_id,
                         rank=worker_rank)
        self.approximation_rank = rank
        self.warm_start = warm_start
        self.start_step = start_step
        self.seed = seed
        self.blocks = blocks
        self._low = [b for b in blocks if b.low_rank]
        self._dense = [b for b in blocks if not b.low_rank]
        self._dense_size = sum(b.size for b in self._dense)
        self._qs = self._initial_qs()
        self._matrices: list[np.ndarray] = []  # this step's compensated M, per low-rank block
        self._compensated: np.ndarray | None = None
        self._plain = False  # this step allreduces the whole gradient (before start_step)
        self._step = 0
        #: ``(tensor block, step, "zero" | "not finite")`` of each ``Q`` drawn afresh after it
        #: collapsed, for the exchange to report
        self.redrawn: list[tuple[int, int, str]] = []

    # The sizes ----------------------------------------------------------------------------

    @property
    def first_size(self) -> int:
        """Elements of the first allreduce: the dense tensors, then every ``P``."""
        return self._dense_size + sum(b.rows * self.approximation_rank for b in self._low)

    @property
    def second_size(self) -> int:
        """Elements of the second allreduce: every ``Q``."""
        return sum(b.cols * self.approximation_rank for b in self._low)

    def _initial_qs(self) -> list[np.ndarray]:
        generator = np.random.default_rng(self.seed)
        return [self._draw_q(block, generator) for block in self._low]

    def _draw_q(self, block: _Block, generator: np.random.Generator) -> np.ndarray:
        q = generator.standard_normal((block.cols, self.approximation_rank)).astype(np.float32)
        _orthogonalise(q)
        return q

    # One step, in GRACE's order -------------------------------------------------------------

    def compress(self, update: Any, step: int) -> tuple[np.ndarray, EncodingStats]:  # type: ignore[override]
        """``memory.compensate``, then the first message: the dense tensors and ``P = M Q``
        (before ``start_step``: the whole compensated gradient)."""
        started = time.perf_counter()
        update = self._check("update", np.asarray(update))
        memory = self.memory
        assert isinstance(memory, HostMemory)
        compensated = memory.compensate(update)
        self._compensated = compensated
        self._step = step
        self._plain = step < self.start_step
        if self._plain:
            first = compensated.copy()
        else:
            if not self.warm_start:
                self._qs = self._initial_qs()
            first = np.empty(self.first_size, np.float32)
            at = 0
            for block in self._dense:
                first[at:at + block.size] = compensated[block.start:block.stop]
                at += block.size
            self._matrices = []
            for block, q in zip(self._low, self._qs, strict=True):
                matrix = compensated[block.start:block.stop].reshape(block.rows, block.cols)
                self._matrices.append(matrix)
                size = block.rows * self.approximation_rank
                np.matmul(matrix, q, out=first[at:at + size].reshape(block.rows, -1))
                at += size
        stats = EncodingStats(
            step=step, tau=0.0, nnz=int(first.size), num_elements=self.num_elements,
            sparsity=first.size / max(1, self.num_elements), encoding="powersgd",
            bytes_encoded=int(first.nbytes + 4 * (0 if self._plain else self.second_size)),
            encode_seconds=time.perf_counter() - started, shake_up=False,
        )
        return first, stats

    def compress_second(self, first_sum: np.ndarray) -> np.ndarray:
        """The second message from the first's sum over all ranks: each ``P`` orthogonalised
        (in place, the same bits on every rank), then ``Mᵀ P`` with this rank's ``M``. Empty
        on a plain step."""
        if self._plain:
            return np.empty(0, np.float32)
        second = np.empty(self.second_size, np.float32)
        at, offset = self._dense_size, 0
        for block, matrix in zip(self._low, self._matrices, strict=True):
            p = first_sum[at:at + block.rows * self.approximation_rank].reshape(block.rows, -1)
            _orthogonalise(p)
            size = block.cols * self.approximation_rank
            np.matmul(matrix.T, p, out=second[offset:offset + size].reshape(block.cols, -1))
            at += p.size
            offset += size
        return second

    def decompress(self, first_sum: np.ndarray, second_sum: np.ndarray, world_size: int,
                   out: np.ndarray | None = None) -> np.ndarray:
        """The mean update (float32, every rank the same bits) from both messages' sums, and
        ``memory.update``: the residual becomes what this rank's compensated update kept
        back (low-rank tensors; dense tensors travel exactly)."""
        compensated = self._compensated
        if compensated is None:
            raise ConfigurationError("decompress needs a compress of the same step first")
        self._compensated = None
        n = np.float32(world_size)
        mean = np.empty(self.num_elements, np.float32) if out is None else out
        if self._plain:
            np.divide(first_sum, n, out=mean)
            compensated[...] = 0  # the whole update was sent
            return mean
        at = 0
        for block in self._dense:
            np.divide(first_sum[at:at + block.size], n, out=mean[block.start:block.stop])
            compensated[block.start:block.stop] = 0
            at += block.size
        offset = 0
        for i, block in enumerate(self._low):
            p = first_sum[at:at + block.rows * self.approximation_rank].reshape(block.rows, -1)
            size = block.cols * self.approximation_rank
            q = second_sum[offset:offset + size].reshape(block.cols, -1) / n
            approx = mean[block.start:block.stop].reshape(block.rows, block.cols)
            if q.any() and np.isfinite(q).all() and np.isfinite(p).all():
                np.matmul(p, q.T, out=approx)
                self._qs[i] = q
            else:
                # a zero Q (a zero update: warm-started from it, P = MQ stays zero and the
                # tensor never moves again) or a non-finite one (a column norm past float32):
                # nothing of this tensor is sent this step (the residual keeps it) and Q is
                # drawn afresh, from the same seed and step on every rank (q and p are the
                # sums every rank holds, so every rank takes this branch alike)
                approx[...] = 0
                self._qs[i] = self._draw_q(
                    block, np.random.default_rng([self.seed, i, self._step]))
                self.redrawn.append(
                    (i, self._step, "zero" if np.isfinite(q).all() else "not finite"))
            at += p.size
            offset += size
        self._matrices = []
        memory = self.memory
        assert isinstance(memory, HostMemory)
        for block in self._low:
            memory.update(mean[block.start:block.stop], block.start)
        return mean

    def decompress_sum(self, frames: Sequence[bytes | memoryview], step: int,
                       out: np.ndarray | None = None) -> np.ndarray:
        raise ConfigurationError(
            "PowerSGD's messages are summed by an allreduce, not gathered as frames: "
            "use compress, compress_second and decompress (PowerSGDExchange)"
        )

    # State --------------------------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        return {**super().get_state(),
                **prefixed("q", {str(i): q.copy() for i, q in enumerate(self._qs)})}

    def set_state(self, state: dict[str, Any]) -> None:
        qs = unprefixed("q", state)
        if sorted(qs) != sorted(str(i) for i in range(len(self._qs))):
            raise ConfigurationError(
                f"PowerSGD state needs q.0 … q.{len(self._qs) - 1}, got {sorted(qs)}")
        restored = []
        for i, q in enumerate(self._qs):
            value = np.asarray(qs[str(i)])
            if value.dtype != np.float32 or value.shape != q.shape:
                raise ConfigurationError(
                    f"PowerSGD state q.{i} must be a float32 array of shape {q.shape}, "
                    f"got {value.dtype} array of shape {value.shape}")
            if not np.isfinite(value).all():
                raise ConfigurationError(
                    f"PowerSGD state q.{i} is not finite (a corrupted checkpoint?): "
                    f"{int(np.size(value) - np.isfinite(value).sum())} of {value.size} "
                    "elements are NaN or infinite")
            restored.append(value.copy())
        super().set_state(state)
        self._qs = restored


def _orthogonalise(matrix: np.ndarray) -> None:
    """Gram-Schmidt on the columns of ``matrix``, in place (deterministic: a fixed order of
    numpy operations on the same input gives the same bits)."""
    for i in range(matrix.shape[1]):
        column = matrix[:, i]
        column /= np.sqrt(column @ column) + EPSILON
        if i + 1 < matrix.shape[1]:
            rest = matrix[:, i + 1:]
            rest -= np.outer(column, column @ rest)


@register_compressor
class PowerSGDCompressorConfig(CompressorConfig):
    """PowerSGD (``training.compression: powersgd``; ``SharedTrainingMaster(compressor=...)``).

    Args:
        rank: The approximation rank (default 4; PyTorch's default is 1, Vogels et al. use
            2–4 for image models: rank 4 keeps the digits and LeNet models at dense's
            accuracy).
        min_compression: Compress a tensor only where its factors are at least this many
            times smaller than it (PyTorch's ``min_compression_rate``, default 2).
        warm_start: Reuse the previous step's ``Q`` (default True).
        start_step: Allreduce the whole gradient before this step (default 0).
        seed: Seed of the initial ``Q``, the same on every worker (default 0).
    """

    collective = "allreduce"

    def __init__(self, rank: int = 4, min_compression: float = 2.0, warm_start: bool = True,
                 start_step: int = 0, seed: int = 0) -> None:
        for name, value, low in (("rank", rank, 1), ("start_step", start_step, 0),
                                 ("seed", seed, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigurationError(f"powersgd {name} must be an integer >= {low}, "
                                         f"got {value!r}")
        if (isinstance(min_compression, bool) or not isinstance(min_compression, (int, float))
                or not min_compression >= 1):
            raise ConfigurationError(
                f"powersgd min_compression must be a number >= 1, got {min_compression!r}")
        if not isinstance(warm_start, bool):
            raise ConfigurationError(f"powersgd warm_start must be true or false, "
                                     f"got {warm_start!r}")
        self.rank = rank
        self.min_compression = float(min_compression)
        self.warm_start = warm_start
        self.start_step = start_step
        self.seed = seed

    def build(self, num_elements: int, *, job_id: int, rank: int,
              shapes: Sequence[Sequence[int]] | None = None) -> PowerSGDCompressor:
        if shapes is None:
            raise ConfigurationError("PowerSGD needs the trainable tensors' shapes")
        compressor = PowerSGDCompressor(
            shapes, rank=self.rank, min_compression=self.min_compression,
            warm_start=self.warm_start, start_step=self.start_step, seed=self.seed,
            job_id=job_id, worker_rank=rank)
        if compressor.num_elements != num_elements:
            raise ConfigurationError(
                f"the shapes hold {compressor.num_elements} elements, the update {num_elements}")
        return compressor

    def get_config(self) -> dict[str, Any]:
        return {"rank": self.rank, "min_compression": self.min_compression,
                "warm_start": self.warm_start, "start_step": self.start_step,
                "seed": self.seed}
