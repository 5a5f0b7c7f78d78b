"""The exchange template: a new exchange is one method; finiteness, timing and overlap are
done once, in UpdateExchange.step, for every exchange.

Ranks are threads of this process joined by a real TCP ring (no Spark, no mocks).
"""

from __future__ import annotations

import threading
from typing import Any

import keras
import numpy as np
import pytest
from _comm_harness import run_threads

from sparkdl.errors import NonFiniteError
from sparkdl.training.exchanges.exchange import UpdateExchange
from sparkdl.training.worker.loop import PHASES

LR = 0.1


class MajorityVote(UpdateExchange):
    """signSGD with majority vote: the whole exchange is this one method."""

    def communicate(self, message: np.ndarray, step: int) -> np.ndarray:
        return np.sign(self.comm.allreduce(message, "sum")).astype(np.float32)


class Recording(MajorityVote):
    """Records which thread ran each hook, and how often."""

    def __init__(self, *args: Any, nan_at: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[str, str]] = []
        self.nan_at = nan_at

    def _record(self, hook: str) -> None:
        self.calls.append((hook, threading.current_thread().name))

    def compute_update(self, x, y, step):  # type: ignore[no-untyped-def]
        self._record("compute_update")
        loss, update, finite = super().compute_update(x, y, step)
        if step == self.nan_at:
            update = np.full_like(update, np.nan)
            finite = bool(np.isfinite(update).all())
        return loss, update, finite

    def encode(self, update, step):  # type: ignore[no-untyped-def]
        self._record("encode")
        return super().encode(update, step)

    def communicate(self, message, step):  # type: ignore[no-untyped-def]
        self._record("communicate")
        return super().communicate(message, step)

    def decode(self, received, step):  # type: ignore[no-untyped-def]
        self._record("decode")
        return super().decode(received, step)

    def apply(self, decoded, step):  # type: ignore[no-untyped-def]
        self._record("apply")
        return super().apply(decoded, step)


def _model() -> keras.Model:
    keras.utils.set_random_seed(7)
    model = keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)]
    )
    model.compile(optimizer=keras.optimizers.SGD(LR),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _batch(rank: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(10 * rank + step)
    return rng.standard_normal((4, 5)).astype(np.float32), rng.integers(0, 3, 4).astype(np.int64)


def _on_ranks(world: int, fn) -> list[Any]:  # type: ignore[no-untyped-def]
    models = [_model() for _ in range(world)]
    return run_threads(world, lambda rank, comm: fn(rank, comm, models[rank]))


def _flat(model: keras.Model) -> np.ndarray:
    return np.concatenate([w.ravel() for w in model.get_weights()])


@pytest.mark.parametrize("overlap", [False, True])
def test_an_exchange_written_as_one_method_trains_identical_replicas(overlap: bool) -> None:
    steps = 4

    def fn(rank, comm, model):  # type: ignore[no-untyped-def]
        exchange = MajorityVote(model, comm, overlap=overlap)
        before = _flat(model)
        results = [exchange.step(*_batch(rank, s), s) for s in range(steps)]
        exchange.finish()
        return before, _flat(model), results

    (b0, w0, r0), (_, w1, _) = _on_ranks(2, fn)
    assert w0.tobytes() == w1.tobytes()
    # every element moved by a whole number of SGD steps of size LR (signs only)
    moves = (b0 - w0) / np.float32(LR)
    assert np.allclose(moves, np.round(moves), atol=1e-3) and np.abs(moves).max() >= 1
    for result in r0[1:]:  # with overlap the first step has nothing to wait for yet
        assert set(result.timings) == set(PHASES)
        assert result.finite_update
    if overlap:
        assert all("exchange_s" in r.extra for r in r0[1:]) and "exchange_s" not in r0[0].extra


def test_with_overlap_only_the_collective_leaves_the_main_thread() -> None:
    def fn(rank, comm, model):  # type: ignore[no-untyped-def]
        exchange = Recording(model, comm, overlap=True)
        for s in range(3):
            exchange.step(*_batch(rank, s), s)
        exchange.finish()
        return exchange.calls

    calls, = _on_ranks(1, fn)
    threads = {hook: {name for hook_, name in calls if hook_ == hook}
               for hook in ("compute_update", "encode", "communicate", "decode", "apply")}
    assert threads["communicate"] == {"sparkdl-overlap"}
    rank_thread = threads["compute_update"]  # the thread the rank runs on
    assert len(rank_thread) == 1 and "sparkdl-overlap" not in rank_thread
    for hook in ("encode", "decode", "apply"):
        assert threads[hook] == rank_thread
    assert [h for h, _ in calls].count("communicate") == 3
    assert [h for h, _ in calls].count("apply") == 3  # two in steps, the last in finish


def test_a_non_finite_update_ends_the_step_before_anything_is_sent() -> None:
    def fn(rank, comm, model):  # type: ignore[no-untyped-def]
        exchange = Recording(model, comm, nan_at=1)
        ok = exchange.step(*_batch(rank, 0), 0)
        before = _flat(model)
        bad = exchange.step(*_batch(rank, 1), 1)
        return ok, bad, before, _flat(model), exchange.calls

    (ok, bad, before, after, calls), = _on_ranks(1, fn)
    assert ok.finite_update and not bad.finite_update
    assert before.tobytes() == after.tobytes()  # nothing applied
    hooks = [h for h, _ in calls]
    assert hooks == ["compute_update", "encode", "communicate", "decode", "apply",
                     "compute_update"]


class CheckedWhenEncoded(MajorityVote):
    """An exchange whose encode finds the update non-finite (as sharing's sweep over a
    residual held in the optimizer's variables does) at step ``nan_at``."""

    def __init__(self, *args: Any, nan_at: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.nan_at = nan_at
        self.sent: list[int] = []

    def encode(self, update, step):  # type: ignore[no-untyped-def]
        if step == self.nan_at:
            raise NonFiniteError("residual element 0 is nan")
        return super().encode(update, step)

    def communicate(self, message, step):  # type: ignore[no-untyped-def]
        self.sent.append(step)
        return super().communicate(message, step)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_non_finite_update_found_by_the_encode_ends_the_step_before_anything_is_sent(
    overlap: bool,
) -> None:
    def fn(rank, comm, model):  # type: ignore[no-untyped-def]
        exchange = CheckedWhenEncoded(model, comm, nan_at=1, overlap=overlap)
        ok = exchange.step(*_batch(rank, 0), 0)
        exchange.drain()
        before = _flat(model)
        bad = exchange.step(*_batch(rank, 1), 1)
        exchange.finish()
        exchange.close()
        return ok, bad, before, _flat(model), exchange.sent

    (ok, bad, before, after, sent), = _on_ranks(1, fn)
    assert ok.finite_update and not bad.finite_update and bad.timings == {}
    assert before.tobytes() == after.tobytes()  # nothing applied
    assert sent == [0]


def test_the_finiteness_check_is_exact_when_a_finite_sum_overflows() -> None:
    """One summing pass decides the common case; an overflowing sum of finite elements is
    still finite, and a single NaN or inf anywhere is not."""
    import tensorflow as tf

    from sparkdl.training.exchanges.exchange import all_finite

    check = tf.function(all_finite)
    big = tf.fill([1000], np.float32(3e38))
    assert bool(check([big, tf.ones([3])]))
    for bad in (np.nan, np.inf, -np.inf):
        values = np.zeros(1000, np.float32)
        values[617] = bad
        assert not bool(check([tf.ones([2, 2]), tf.constant(values)]))


def test_a_tensor_shares_an_aligned_host_array_and_copies_any_other() -> None:
    """The collective's result reaches the optimizer without a copy where TensorFlow can use
    its memory as it is (64-byte aligned, writable); a misaligned one is copied, never read
    out of place."""
    from sparkdl.training.exchanges.host_views import shared_tensor

    raw = np.zeros(4096 + 16, np.float32)
    start = (-raw.ctypes.data % 64) // 4
    aligned, misaligned = raw[start:start + 4096], raw[start + 1:start + 4097]
    aligned[:] = misaligned[:] = np.arange(4096, dtype=np.float32)
    shared, copied = shared_tensor(aligned), shared_tensor(misaligned)
    raw[:] = -1.0
    assert np.all(shared.numpy() == -1.0)
    assert np.array_equal(copied.numpy(), np.arange(4096, dtype=np.float32))
