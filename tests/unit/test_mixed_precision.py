"""Mixed precision in the exchanges: the loss is scaled before the gradient and the gradient
unscaled before the update (so the update is the float32 model's, not 1/scale of it), and a
non-finite gradient on any rank skips the step on every rank, halving the scale alike."""

from __future__ import annotations

from collections.abc import Callable

import keras
import numpy as np
import pytest
from _comm_harness import run_threads

from sparkdl.compression.threshold import FixedThreshold
from sparkdl.training.exchanges.averaging import ParameterAveragingExchange
from sparkdl.training.exchanges.dense import DenseAllreduceExchange
from sparkdl.training.exchanges.exchange import UpdateExchange
from sparkdl.training.masters import SharedTrainingMaster

SCALE = 2.0 ** 15  # LossScaleOptimizer's initial scale


def _model(policy: str, optimizer: Callable[[], keras.optimizers.Optimizer]) -> keras.Model:
    keras.mixed_precision.set_global_policy(policy)
    try:
        keras.utils.set_random_seed(5)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, "tanh"),
                                  keras.layers.Dense(3, dtype="float32")])
        model.compile(optimizer(), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      jit_compile=False)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return model


def _batch(rank: int, huge: bool = False) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(16, 6)).astype(np.float32)
    if huge:  # float16 overflows in the scaled backward pass of this batch
        x *= 6e4
    return x, rng.integers(0, 3, 16).astype(np.int32)


Make = Callable[[keras.Model, object], UpdateExchange]
DENSE: Make = lambda model, comm: DenseAllreduceExchange(model, comm)  # noqa: E731
TAU = 1e-3
SHARING: Make = lambda model, comm: SharedTrainingMaster(  # noqa: E731
    16, 2, threshold=FixedThreshold(TAU), encoder="host").create_exchange(model, comm, job_id=1)


def _step_once(make: Make, policy: str, world: int, optimizer=lambda: keras.optimizers.SGD(0.5),
               huge_rank: int | None = None) -> list[tuple[list[np.ndarray], dict, float]]:
    models = [_model(policy, optimizer) for _ in range(world)]

    def train(rank: int, comm) -> tuple[list[np.ndarray], dict, float]:  # type: ignore[no-untyped-def]
        exchange = make(models[rank], comm)
        before = [w.copy() for w in models[rank].get_weights()]
        outcome = exchange.step(*_batch(rank, huge=rank == huge_rank), 0)
        exchange.finish()
        assert outcome.finite_update
        scale = exchange.loss_scale.value if exchange.loss_scale else 1.0
        delta = [a - b for a, b in zip(models[rank].get_weights(), before, strict=True)]
        return delta, outcome.extra, scale

    return run_threads(world, train)


def test_the_applied_update_is_the_float32_models_not_divided_by_the_loss_scale():
    model = _model("mixed_float16", lambda: keras.optimizers.SGD(0.5))
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)  # Keras wrapped it
    (mixed, extra, scale), = _step_once(DENSE, "mixed_float16", 1)
    (full, _, _), = _step_once(DENSE, "float32", 1)
    assert scale == SCALE and extra["loss_scale_skipped"] == 0.0
    for got, expected in zip(mixed, full, strict=True):
        assert np.abs(expected).max() > 1e-2  # the step moved every variable
        np.testing.assert_allclose(got, expected, rtol=0.02, atol=2e-4)


def test_sharing_encodes_the_unscaled_update():
    # SGD(0.5)'s update is ~1e-2 per element: well above tau when unscaled, 2**15 times
    # below it if it were not; the same elements reach tau as in the float32 model
    (mixed, _, scale), = _step_once(SHARING, "mixed_float16", 1)
    (full, _, _), = _step_once(SHARING, "float32", 1)
    assert scale == SCALE
    got, expected = np.concatenate([d.ravel() for d in mixed]), np.concatenate(
        [d.ravel() for d in full])
    assert np.count_nonzero(expected) > expected.size // 2
    assert np.mean(got == expected) > 0.97  # elements near tau may round either way


def test_two_ranks_apply_the_same_unscaled_mean_gradient():
    mixed = _step_once(DENSE, "mixed_float16", 2)
    full = _step_once(DENSE, "float32", 2)
    assert all(np.array_equal(x, y) for x, y in zip(mixed[0][0], mixed[1][0], strict=True))
    for got, expected in zip(mixed[0][0], full[0][0], strict=True):
        np.testing.assert_allclose(got, expected, rtol=0.02, atol=2e-4)


@pytest.mark.parametrize("make", [DENSE, SHARING], ids=["dense", "sharing"])
def test_an_overflow_on_one_rank_skips_the_step_and_halves_the_scale_on_every_rank(make):
    results = _step_once(make, "mixed_float16", 2, optimizer=lambda: keras.optimizers.Adam(0.1),
                         huge_rank=1)
    for delta, extra, scale in results:
        assert scale == SCALE / 2
        assert extra["loss_scale_skipped"] == 1.0
        assert all(not d.any() for d in delta)  # no weight moved on either rank


def test_adam_state_takes_no_non_finite_gradient_and_training_goes_on():
    model = _model("mixed_float16", lambda: keras.optimizers.Adam(0.01))

    def train(rank: int, comm) -> list[float]:  # type: ignore[no-untyped-def]
        exchange = DenseAllreduceExchange(model, comm)
        exchange.step(*_batch(0, huge=True), 0)  # skipped
        scales = [exchange.loss_scale.value]
        for step in range(1, 4):
            exchange.step(*_batch(step), step)
            scales.append(exchange.loss_scale.value)
        return scales

    scales, = run_threads(1, train)
    assert scales == [SCALE / 2] * 4
    assert all(np.isfinite(v.numpy()).all() for v in model.optimizer.variables)
    assert int(model.optimizer.inner_optimizer.iterations.numpy()) == 3  # the skip is no step


def test_the_scale_doubles_after_dynamic_growth_steps_finite_steps():
    def optimizer() -> keras.optimizers.Optimizer:
        return keras.optimizers.SGD(0.1)

    model = _model("mixed_float16", optimizer)
    model.optimizer.dynamic_growth_steps = 2

    def train(rank: int, comm) -> list[float]:  # type: ignore[no-untyped-def]
        exchange = DenseAllreduceExchange(model, comm)
        scales = []
        for step in range(4):
            exchange.step(*_batch(step), step)
            scales.append(exchange.loss_scale.value)
        return scales

    scales, = run_threads(1, train)
    assert scales == [SCALE, 2 * SCALE, 2 * SCALE, 4 * SCALE]


def test_parameter_averaging_steps_as_keras_train_step_with_its_loss_scale():
    (mixed, _, _), = _step_once(
        lambda m, c: ParameterAveragingExchange(m, c, averaging_frequency=1, save_updater=True),
        "mixed_float16", 1)
    (full, _, _), = _step_once(
        lambda m, c: ParameterAveragingExchange(m, c, averaging_frequency=1, save_updater=True),
        "float32", 1)
    for got, expected in zip(mixed, full, strict=True):
        np.testing.assert_allclose(got, expected, rtol=0.02, atol=2e-4)


def test_a_shipped_mixed_float16_model_keeps_its_loss_scale_optimizer_and_state():
    import tempfile
    from pathlib import Path

    from sparkdl.training.model_files import load_model, write_model
    from sparkdl.training.serialization import model_from_bytes, model_to_bytes

    model = _model("mixed_float16", lambda: keras.optimizers.Adam(0.01))
    model.optimizer.build(model.trainable_variables)
    model.optimizer.dynamic_scale.assign(1024.0)
    with tempfile.TemporaryDirectory() as tmp:  # in memory, and as the file tasks read
        ref = write_model(model, Path(tmp).as_uri())
        for loaded in (model_from_bytes(model_to_bytes(model)), load_model(ref)):
            assert isinstance(loaded.optimizer, keras.optimizers.LossScaleOptimizer)
            assert float(loaded.optimizer.dynamic_scale.numpy()) == 1024.0
            assert loaded.layers[0].compute_dtype == "float16"
    assert not isinstance(model._compile_config.config["optimizer"],
                          keras.optimizers.LossScaleOptimizer)  # the model's config is restored


def test_mixed_bfloat16_needs_no_loss_scale_and_applies_the_float32_update():
    model = _model("mixed_bfloat16", lambda: keras.optimizers.SGD(0.5))
    assert not isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    (mixed, _, scale), = _step_once(DENSE, "mixed_bfloat16", 1)
    (full, _, _), = _step_once(DENSE, "float32", 1)
    assert scale == 1.0
    for got, expected in zip(mixed, full, strict=True):
        np.testing.assert_allclose(got, expected, rtol=0.05, atol=1e-3)


@pytest.mark.parametrize("make", [
    lambda m, c: DenseAllreduceExchange(m, c, overlap=True),
    lambda m, c: SharedTrainingMaster(16, 2, threshold=FixedThreshold(TAU), encoder="host",
                                      overlap=True).create_exchange(m, c, job_id=1),
], ids=["dense", "sharing"])
def test_with_overlap_skips_and_scales_stay_alike_and_replicas_bit_identical(make):
    models = [_model("mixed_float16", lambda: keras.optimizers.Adam(0.01)) for _ in range(2)]

    def train(rank: int, comm) -> tuple[list[float], list[np.ndarray]]:  # type: ignore[no-untyped-def]
        exchange = make(models[rank], comm)
        scales = []
        for step in range(6):
            exchange.step(*_batch(10 * step + rank, huge=rank == 1 and step in (1, 4)), step)
            scales.append(exchange.loss_scale.value)
        exchange.finish()
        return scales, models[rank].get_weights()

    (scales0, weights0), (scales1, weights1) = run_threads(2, train)
    assert scales0 == scales1 and min(scales0) < SCALE  # the overflows halved the scale
    assert all(np.array_equal(a, b) for a, b in zip(weights0, weights1, strict=True))
    assert all(np.isfinite(w).all() for w in weights0)
