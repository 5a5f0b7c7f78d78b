"""A residual held in pieces (one buffer per model variable) encodes, samples, clips and
compresses bit for bit as their concatenation does, and the pieces change in place."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkdl.compression.compressor import ThresholdCompressor
from sparkdl.compression.encoding import CHUNK_ELEMENTS, threshold_encode
from sparkdl.compression.memory import PiecewiseMemory
from sparkdl.compression.pieces import Pieces
from sparkdl.compression.threshold import (
    AdaptiveThreshold,
    FixedThreshold,
    ResidualClipping,
    ResidualPostProcessor,
    SamplePlan,
    ShakeUp,
    TargetSparsityThreshold,
    block_sample,
)
from sparkdl.errors import ConfigurationError, NonFiniteError


def _split(vector: np.ndarray, cuts: list[int]) -> list[np.ndarray]:
    """Copies of ``vector``'s consecutive pieces, the first two reshaped (any shape works)."""
    bounds = [0, *sorted(cuts), vector.size]
    pieces = [vector[a:b].copy() for a, b in itertools.pairwise(bounds)]
    for i, piece in enumerate(pieces[:2]):
        if piece.size % 2 == 0 and piece.size:
            pieces[i] = piece.reshape(2, -1)
    return pieces


def _joined(pieces: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([p.reshape(-1) for p in pieces])


# Chunk-spanning cuts: a piece inside one chunk, pieces across chunk boundaries, a piece
# holding a whole chunk, an empty piece, and (None) the vector as one piece.
N = 3 * CHUNK_ELEMENTS + 1234
CUTS = {
    "one": [],
    "small-first": [3, 17],
    "across-chunks": [CHUNK_ELEMENTS - 5, CHUNK_ELEMENTS + 7, 2 * CHUNK_ELEMENTS + 1],
    "empty-piece": [100, 100, 2 * CHUNK_ELEMENTS],
    "many": list(range(999, N, 20011)),
}


@pytest.mark.parametrize("cuts", CUTS.values(), ids=list(CUTS))
@pytest.mark.parametrize("density", [0.001, 0.05, 0.3], ids=["sparse", "switch", "bitmap"])
def test_encoding_pieces_gives_the_message_and_residual_of_the_whole(
    cuts: list[int], density: float
) -> None:
    rng = np.random.default_rng(len(cuts) + int(density * 1000))
    whole = (rng.standard_normal(N) * 0.1).astype(np.float32)
    # `density` of the elements reach tau, more of them late (the sparse phase switches to
    # the bitmap mid-sweep), a few exact ties at tau
    tau = np.float32(1.0)
    hot = rng.random(N) < density * np.linspace(0.2, 1.8, N)
    whole[hot] = np.float32(1.5) * np.sign(rng.standard_normal(hot.sum())).astype(np.float32)
    whole[rng.integers(0, N, 20)] = tau
    pieces = _split(whole, cuts)
    expected = threshold_encode(whole, float(tau))
    got = threshold_encode(Pieces(pieces), float(tau))
    assert (got.encoding, got.nnz, got.payload, got.tau) == (
        expected.encoding, expected.nnz, expected.payload, expected.tau)
    assert _joined(pieces).tobytes() == whole.tobytes()  # changed in place, the same bits


@pytest.mark.parametrize("cuts", CUTS.values(), ids=list(CUTS))
@pytest.mark.parametrize("density", [0.001, 0.3], ids=["sparse", "bitmap"])
def test_pieces_are_checked_for_finiteness_as_the_whole(cuts: list[int], density: float
                                                        ) -> None:
    """``check_finite`` on pieces: the same bits as the whole when finite; a NaN in the
    last chunk (read through a staged copy where a chunk spans pieces) is named by its flat
    index and no piece changes."""
    rng = np.random.default_rng(7)
    whole = (rng.standard_normal(N) * 0.1).astype(np.float32)
    whole[rng.random(N) < density] = np.float32(1.5)
    pieces = _split(whole, cuts)
    expected = threshold_encode(whole.copy(), 1.0)
    assert threshold_encode(Pieces(pieces), 1.0, check_finite=True) == expected
    pieces = _split(whole, cuts)
    pieces[-1].reshape(-1)[-1] = np.nan
    before = _joined(pieces).tobytes()
    with pytest.raises(NonFiniteError, match=f"residual element {N - 1} is nan"):
        threshold_encode(Pieces(pieces), 1.0, check_finite=True)
    assert _joined(pieces).tobytes() == before


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 40), min_size=1, max_size=6),
       offset=st.integers(0, 50), stride=st.integers(1, 30), width=st.integers(1, 30),
       seed=st.integers(0, 2**16))
def test_blocks_take_put_and_read_address_the_concatenation(
    sizes: list[int], offset: int, stride: int, width: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in sizes]
    pieces = Pieces(arrays)
    whole = _joined(arrays)
    assert pieces.size == whole.size
    period = max(stride, width)
    count = max(0, (whole.size - offset - width) // period + 1)
    expected = [whole[offset + i * period:offset + i * period + width] for i in range(count)]
    plan = SamplePlan(offset, period, width, count, 1)
    assert pieces.blocks(offset, period, width, count).tobytes() == b"".join(
        block.tobytes() for block in expected)
    assert block_sample(whole, plan).tobytes() == pieces.blocks(offset, period, width,
                                                                count).tobytes()
    assert pieces.concatenate().tobytes() == whole.tobytes()
    index = np.flatnonzero(rng.random(whole.size) < 0.4)
    assert pieces.take(index).tobytes() == whole[index].tobytes()
    values = rng.standard_normal(index.size).astype(np.float32)
    pieces.put(index, values)
    whole[index] = values
    assert _joined(arrays).tobytes() == whole.tobytes()
    start = min(offset, whole.size)
    stop = min(start + stride, whole.size)
    assert pieces.read(start, stop).tobytes() == whole[start:stop].tobytes()
    pieces.write(start, np.arange(stop - start, dtype=np.float32))
    whole[start:stop] = np.arange(stop - start, dtype=np.float32)
    assert _joined(arrays).tobytes() == whole.tobytes()


def test_pieces_refuse_arrays_they_cannot_write_in_place() -> None:
    good = np.zeros(4, np.float32)
    frozen = np.zeros(4, np.float32)
    frozen.flags.writeable = False
    for bad, what in ((np.zeros(4), "float64"), (np.zeros((4, 4), np.float32)[:, 1], "False"),
                      (frozen, "writable=False")):
        with pytest.raises(ConfigurationError, match=f"piece 1 .*{what}"):
            Pieces([good, bad])
    with pytest.raises(ConfigurationError, match="add needs the residual as one array"):
        threshold_encode(Pieces([good]), 1.0, add=good)


@pytest.mark.parametrize("sparsity", [1e-3, 0.05])
def test_target_sparsity_samples_the_pieces_as_the_whole(sparsity: float) -> None:
    rng = np.random.default_rng(5)
    whole = rng.standard_normal(N).astype(np.float32)
    pieces = Pieces(_split(whole, CUTS["across-chunks"]))
    a, b = TargetSparsityThreshold(sparsity), TargetSparsityThreshold(sparsity)
    for step in range(4):
        assert a.select(whole, step) == b.select_pieces(pieces, step)


class _Scale(ResidualPostProcessor):
    """Not element by element: scales by the whole residual's largest magnitude."""

    def apply(self, residual: np.ndarray, tau: float, step: int) -> None:
        residual /= np.float32(max(1.0, float(np.abs(residual).max())))

    def get_config(self) -> dict[str, Any]:
        return {}


@pytest.mark.parametrize("processor", [ResidualClipping(2.0, 1), _Scale()],
                         ids=["clipping", "whole-vector"])
def test_post_processors_change_the_pieces_as_the_whole(processor: ResidualPostProcessor
                                                        ) -> None:
    rng = np.random.default_rng(9)
    whole = (rng.standard_normal(1000) * 3).astype(np.float32)
    arrays = _split(whole, [10, 500])
    processor.apply_pieces(Pieces(arrays), 1.0, 1)
    processor.apply(whole, 1.0, 1)
    assert _joined(arrays).tobytes() == whole.tobytes()


class _HeldMemory(PiecewiseMemory):
    """A residual held in arrays of its own (what the sharing exchange's U variables are)."""

    def __init__(self, sizes: list[int]) -> None:
        super().__init__(sum(sizes))
        self.arrays = [np.zeros(s, np.float32) for s in sizes]

    def pieces(self) -> Pieces:
        return Pieces(self.arrays)

    def get_residual(self) -> np.ndarray:
        return _joined(self.arrays)

    def set_residual(self, value: np.ndarray) -> None:
        self.pieces().write(0, self._checked(value))


@pytest.mark.parametrize("threshold", [
    lambda: AdaptiveThreshold(initial=1e-2, min_sparsity=0.01, max_sparsity=0.2),
    lambda: TargetSparsityThreshold(0.1),
    lambda: FixedThreshold(0.05),
], ids=["adaptive", "target-sparsity", "fixed"])
def test_a_compressor_holding_its_residual_in_pieces_sends_the_same_frames(threshold: Any
                                                                          ) -> None:
    """Its owner adds each update to the pieces; frames, state and residual match the
    compressor that adds it to its own vector, step for step (shake-up and clipping too)."""
    sizes = [7, CHUNK_ELEMENTS + 3, 0, 40_000]
    n = sum(sizes)

    def build() -> ThresholdCompressor:
        return ThresholdCompressor(n, threshold(), shake_up=ShakeUp(3, 0.5),
                                   post_processor=ResidualClipping(3.0, 2), job_id=4, rank=1)

    plain, held = build(), build()
    rng = np.random.default_rng(3)
    warm = (rng.standard_normal(n) * 1e-3).astype(np.float32)
    assert plain.compress(warm, 0)[0] == held.compress(warm, 0)[0]
    memory = _HeldMemory(sizes)
    held.hold_residual_in(memory)  # the residual so far moves into the pieces
    assert memory.get_residual().tobytes() == plain.get_residual().tobytes()
    with pytest.raises(ConfigurationError, match="compress_held"):
        held.compress(warm, 1)
    for step in range(1, 9):
        update = (rng.standard_normal(n) * 10.0 ** -rng.integers(1, 4)).astype(np.float32)
        expected = plain.compress(update, step)
        memory.pieces().write(0, memory.get_residual() + update)  # what the optimizer does
        got = held.compress_held(step)
        assert got[0] == expected[0], step
        assert got[1].encoding == expected[1].encoding
        assert held.get_residual().tobytes() == plain.get_residual().tobytes()
    state = held.get_state()
    assert {k: np.asarray(v).tobytes() for k, v in state.items()} == {
        k: np.asarray(v).tobytes() for k, v in plain.get_state().items()}
    held.set_state(plain.get_state())
    with pytest.raises(ConfigurationError, match="PiecewiseMemory"):
        plain.compress_held(9)
