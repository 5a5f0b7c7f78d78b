"""ThresholdCompressor: replicas stay bit-identical; nothing is lost or invented."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from sparkdl.compression import (
    AdaptiveThreshold,
    EncodingStats,
    FixedThreshold,
    ResidualClipping,
    ShakeUp,
    TargetSparsityThreshold,
    ThresholdAlgorithm,
    ThresholdCompressor,
    decode_into,
    unpack_frame,
)
from sparkdl.errors import CommunicationError, ConfigurationError


def test_workers_stay_bit_identical() -> None:
    rng = np.random.default_rng(0)
    n, world = 20_000, 3
    start = rng.standard_normal(n).astype(np.float32)
    params = [start.copy() for _ in range(world)]
    compressors = [
        ThresholdCompressor(
            n,
            AdaptiveThreshold(initial=1e-2),
            shake_up=ShakeUp(frequency=4, factor=0.2),
            post_processor=ResidualClipping(factor=5.0, frequency=5),
            job_id=42,
            rank=rank,
        )
        for rank in range(world)
    ]
    out = np.empty(n, np.float32)
    encodings = set()
    for step in range(30):
        frames = []
        for rank, comp in enumerate(compressors):
            update = (rng.standard_normal(n) * 1e-2 * (rank + 1)).astype(np.float32)
            frame, stats = comp.compress(update, step)
            encodings.add(stats.encoding)
            frames.append(frame)
        sums = [comp.decompress_sum(frames, step) for comp in compressors]
        for rank in range(world):
            assert np.array_equal(sums[rank].view(np.int32), sums[0].view(np.int32))
            params[rank] -= sums[rank]
        assert compressors[1].decompress_sum(frames, step, out=out) is out
        assert np.array_equal(out, sums[0])
    for rank in range(world):
        assert np.array_equal(params[rank].view(np.int32), params[0].view(np.int32))
    assert not np.array_equal(params[0], start)


def test_sent_plus_residual_equals_sum_of_updates_exactly() -> None:
    # Updates on a 2**-16 grid and tau a power of two: every float32 operation is exact, so
    # "everything sent + final residual == sum of all updates" holds with no rounding at all.
    rng = np.random.default_rng(1)
    n = 50_000
    comp = ThresholdCompressor(
        n, FixedThreshold(2.0**-6), shake_up=ShakeUp(frequency=5, factor=0.5)
    )
    sent = np.zeros(n, np.float64)
    total = np.zeros(n, np.float64)
    for step in range(40):
        update = (rng.integers(-2000, 2001, n) * 2.0**-16).astype(np.float32)
        total += update
        frame, stats = comp.compress(update, step)
        assert stats.shake_up == (step > 0 and step % 5 == 0)
        sent += comp.decompress_sum([frame], step)
    assert np.array_equal(sent + comp.residual, total)


def test_sent_plus_residual_close_to_sum_of_updates() -> None:
    # General float32 values: each step is exact by the encoding property; only the
    # float32 accumulation of updates into the residual rounds.
    rng = np.random.default_rng(2)
    n = 30_000
    comp = ThresholdCompressor(n, TargetSparsityThreshold(sparsity=0.01))
    sent = np.zeros(n, np.float64)
    total = np.zeros(n, np.float64)
    for step in range(30):
        update = (rng.standard_normal(n) * np.float32(1e-3)).astype(np.float32)
        total += update
        before = comp.residual + update
        frame, stats = comp.compress(update, step)
        decoded = comp.decompress_sum([frame], step)
        assert np.array_equal(decoded + comp.residual, before)  # exact, per step
        sent += decoded
        assert 0.005 < stats.sparsity < 0.02
    assert np.allclose(sent + comp.residual, total, rtol=0, atol=1e-6)


def test_stats_and_threshold_feedback() -> None:
    n = 10_000
    algo = AdaptiveThreshold(initial=1.0, min_sparsity=1e-3, max_sparsity=1e-2)
    comp = ThresholdCompressor(n, algo, shake_up=ShakeUp(frequency=2, factor=0.5))
    update = np.full(n, 0.1, np.float32)
    frame, stats = comp.compress(update, 1)  # nothing reaches tau = 1 -> tau shrinks
    assert isinstance(stats, EncodingStats)
    assert (stats.step, stats.nnz, stats.tau, stats.encoding) == (1, 0, 1.0, "sparse")
    assert stats.sparsity == 0.0 and not stats.shake_up
    assert stats.bytes_encoded == len(frame) and stats.encode_seconds >= 0
    assert algo.threshold(2) < 1.0
    tau = algo.threshold(2)
    frame, stats = comp.compress(update, 2)  # shake-up: tau * 0.5, not observed
    assert stats.shake_up and stats.tau == pytest.approx(tau * 0.5, rel=1e-6)
    assert algo.threshold(3) == tau


def test_clipping_bounds_the_residual() -> None:
    n = 1000
    comp = ThresholdCompressor(n, FixedThreshold(0.5), post_processor=ResidualClipping(2.0, 3))
    big = np.full(n, 10.0, np.float32)
    comp.compress(big, 1)
    assert comp.residual.max() == 9.5  # not a clipping step
    comp.compress(big, 3)
    assert comp.residual.max() == 1.0  # clipped to 2 * tau


def test_residual_algorithms_see_the_updated_residual() -> None:
    class Spy(ThresholdAlgorithm):
        uses_residual = True

        def __init__(self) -> None:
            self.seen: list[float] = []

        def threshold(self, step: int) -> float:
            return 1.0

        def select(self, residual: np.ndarray, step: int) -> float:
            self.seen.append(float(residual.sum()))
            return 1.0

        def get_config(self) -> dict:
            return {}

    spy = Spy()
    comp = ThresholdCompressor(4, spy)
    comp.compress(np.full(4, 0.25, np.float32), 0)
    assert spy.seen == [1.0]


def test_bad_arguments() -> None:
    with pytest.raises(ConfigurationError):
        ThresholdCompressor(-1, FixedThreshold(1.0))
    with pytest.raises(ConfigurationError):
        ThresholdCompressor(10, 0.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        ThresholdCompressor(10, FixedThreshold(1.0), rank=-1)
    comp = ThresholdCompressor(10, FixedThreshold(1.0))
    for bad in (np.zeros(10, np.float64), np.zeros(9, np.float32), np.zeros((10, 1), np.float32)):
        with pytest.raises(ConfigurationError):
            comp.compress(bad, 0)
    with pytest.raises(ConfigurationError):
        comp.decompress_sum([], 0, out=np.zeros(10, np.float64))


def test_decompress_sum_rejects_bad_frame_lists() -> None:
    n = 100
    comps = [ThresholdCompressor(n, FixedThreshold(0.5), job_id=7, rank=r) for r in range(2)]
    update = np.linspace(-1, 1, n, dtype=np.float32)
    frames = [c.compress(update, 3)[0] for c in comps]
    assert comps[0].decompress_sum(frames, 3).any()
    with pytest.raises(CommunicationError, match="rank"):
        comps[0].decompress_sum(frames[::-1], 3)  # out of rank order
    with pytest.raises(CommunicationError, match="rank"):
        comps[0].decompress_sum(frames[1:], 3)  # rank 1 >= world size 1
    with pytest.raises(CommunicationError, match="step"):
        comps[0].decompress_sum(frames, 4)
    other_job = ThresholdCompressor(n, FixedThreshold(0.5), job_id=8)
    with pytest.raises(CommunicationError, match="job_id"):
        other_job.decompress_sum(frames[:1], 3)
    other_size = ThresholdCompressor(n + 1, FixedThreshold(0.5), job_id=7)
    with pytest.raises(CommunicationError, match="num_elements"):
        other_size.decompress_sum(frames[:1], 3)
    assert not comps[0].decompress_sum([], 3).any()


def test_frame_decodes_to_the_encoded_update() -> None:
    n = 64
    comp = ThresholdCompressor(n, FixedThreshold(0.5), job_id=1, rank=0)
    update = np.arange(n, dtype=np.float32) / 32 - 1
    frame, _ = comp.compress(update, 0)
    header, payload = unpack_frame(frame, job_id=1, num_elements=n, world_size=1, step=0)
    out = np.zeros(n, np.float32)
    decode_into(header.encoding, payload, n, header.tau, out)
    assert np.array_equal(out + comp.residual, update)


def test_sparse_sum_is_the_dense_sum_at_its_entries_and_leaves_the_scratch_zero() -> None:
    rng = np.random.default_rng(4)
    n, world = 5_000, 3
    compressors = [ThresholdCompressor(n, FixedThreshold(1e-2), job_id=7, rank=rank)
                   for rank in range(world)]
    scratch = np.zeros(n, np.float32)
    kinds = set()
    for step, scale in enumerate([4e-3, 4e-3, 1.0]):  # the last step's frames are bitmaps
        frames = []
        for comp in compressors:
            frame, stats = comp.compress((rng.standard_normal(n) * scale).astype(np.float32),
                                         step)
            frames.append(frame)
            kinds.add(stats.encoding)
        dense = compressors[0].decompress_sum(frames, step)
        sparse = compressors[0].decompress_sparse_sum(frames, step, scratch)
        assert not scratch.any()
        if stats.encoding == "bitmap":
            assert sparse is None
            continue
        index, values = sparse
        assert np.all(np.diff(index) > 0)
        rebuilt = np.zeros(n, np.float32)
        rebuilt[index] = values
        assert np.array_equal(rebuilt.view(np.int32), dense.view(np.int32))
    assert kinds == {"sparse", "bitmap"}
    first, _ = compressors[0].compress((rng.standard_normal(n) * 4e-3).astype(np.float32), 9)
    second, _ = compressors[1].compress((rng.standard_normal(n) * 4e-3).astype(np.float32), 9)
    with pytest.raises(CommunicationError):
        compressors[0].decompress_sparse_sum([first, second[:-1]], 9, scratch)
    assert not scratch.any()


def test_sparse_sum_of_overlapping_frames_adds_in_rank_order_bit_for_bit() -> None:
    """Five ranks with different taus and signs touching the same elements: the merged
    entries hold exactly the dense sum's float32 values (rank order, from zero)."""
    rng = np.random.default_rng(5)
    n, world = 2_000, 5
    shared = (rng.standard_normal(n) * 1e-2).astype(np.float32)
    shared[rng.random(n) < 0.95] = 0.0  # the same ~100 elements on every rank
    frames = []
    for rank in range(world):
        comp = ThresholdCompressor(n, FixedThreshold(1e-3 * (1 + rank / 7)), job_id=7,
                                   rank=rank)
        frames.append(comp.compress(shared * np.float32(1 - rank % 2 * 2), 0)[0])
    dense = comp.decompress_sum(frames, 0)
    index, values = comp.decompress_sparse_sum(frames, 0, np.zeros(n, np.float32))
    rebuilt = np.zeros(n, np.float32)
    rebuilt[index] = values
    assert np.array_equal(rebuilt.view(np.int32), dense.view(np.int32))
    assert np.all(np.diff(index) > 0) and 50 < index.size < 200


@pytest.mark.parametrize("threshold", [TargetSparsityThreshold(1e-2), FixedThreshold(2e-3)])
def test_pieces_encode_exactly_like_the_flat_update(threshold) -> None:  # type: ignore[no-untyped-def]
    """The residual, tau and every frame match the flat update's bit for bit."""
    rng = np.random.default_rng(6)
    sizes = [70_000, 3, 65_536, 1, 9_000]
    n = sum(sizes)
    flat_comp = ThresholdCompressor(n, copy.deepcopy(threshold), job_id=1)
    piece_comp = ThresholdCompressor(n, copy.deepcopy(threshold), job_id=1)
    for step in range(6):
        update = (rng.standard_normal(n) * 1e-3).astype(np.float32)
        pieces = [p.copy() for p in np.split(update, np.cumsum(sizes)[:-1])]
        expected = flat_comp.compress(update, step)
        got = piece_comp.compress(pieces, step)
        assert got[0] == expected[0] and got[1].tau == expected[1].tau
        assert np.array_equal(piece_comp.residual.view(np.int32),
                              flat_comp.residual.view(np.int32))


def test_merge_sums_matches_pairwise_union_and_searchsorted_bit_for_bit() -> None:
    from sparkdl.compression.compressor import _merge_sums

    rng = np.random.default_rng(12)
    t = np.float32(0.375)
    for case in range(300):
        n = int(rng.choice([1, 2, 9, 1000, 1 << 20]))
        lists = []
        for rank in range(int(rng.integers(2, 9))):
            kind = (case + rank) % 4
            if kind == 0 and lists:  # the same index list as the previous rank
                index = lists[-1][0].copy()
            elif kind == 1:  # empty
                index = np.zeros(0, np.int64)
            else:
                size = int(rng.integers(0, min(n, 3000) + 1))
                index = np.sort(rng.choice(n, size, replace=False))
            signed = np.where(rng.random(index.size) < 0.5, -t, t).astype(np.float32)
            signed *= np.float32(rng.choice([1, 2.0**-20, 3.0]))  # sums that round
            lists.append((index.astype(np.int32), signed))
        lists = [x for x in lists if x[0].size] or [(np.arange(1, dtype=np.int32), t[None])]
        # reference: the lists merged one at a time (the previous implementation)
        union, expected = lists[0][0].astype(np.int64), lists[0][1]
        for entries, signed in lists[1:]:
            merged = np.union1d(union, entries)
            summed = np.zeros(merged.size, np.float32)
            summed[np.searchsorted(merged, union)] = expected
            summed[np.searchsorted(merged, entries)] += signed
            union, expected = merged, summed
        if len(lists) == 1:
            continue
        got_index, got_total = _merge_sums([x[0] for x in lists], [x[1] for x in lists])
        assert got_index.dtype == np.int64 and got_index.tobytes() == union.tobytes()
        assert got_total.dtype == np.float32 and got_total.tobytes() == expected.tobytes()
