"""The step graphs follow the model's ``jit_compile`` (XLA), as Keras's ``fit`` does.

Ranks are threads of this process joined by a real TCP ring (no Spark, no mocks).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
from _comm_harness import run_threads

from sparkdl.compression.threshold import FixedThreshold
from sparkdl.training.masters import (
    DenseTrainingMaster,
    ParameterAveragingTrainingMaster,
    SharedTrainingMaster,
)


def _sharing() -> SharedTrainingMaster:
    return SharedTrainingMaster(batch_size_per_worker=4, num_workers=2,
                                threshold=FixedThreshold(1e-3))


MODES = {
    "dense": lambda: DenseTrainingMaster(batch_size_per_worker=4, num_workers=2),
    "averaging": lambda: ParameterAveragingTrainingMaster(
        batch_size_per_worker=4, num_workers=2, averaging_frequency=2),
    # the fused path, the residual held in the optimizer's variables
    "sharing": _sharing,
    # the same master; the model's AdamW reads the weights, so the update is taken back out
    # of them (the fallback)
    "sharing-fallback": _sharing,
}


class HostRoundTrip(keras.layers.Layer):
    """The identity through ``tf.numpy_function``: an op XLA cannot compile, in a layer that
    claims to support it (so Keras keeps ``jit_compile=True``)."""

    def call(self, x: Any) -> Any:
        echoed = tf.numpy_function(lambda a: a, [x], tf.float32)
        return x + 0.0 * tf.reshape(echoed, tf.shape(x))


def _model(jit_compile: bool, host_op: bool = False, mode: str = "") -> keras.Model:
    keras.utils.set_random_seed(3)
    layers = [keras.Input((5,)), *([HostRoundTrip()] if host_op else []),
              keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)]
    model = keras.Sequential(layers)
    optimizer = (keras.optimizers.AdamW(0.01) if mode == "sharing-fallback"
                 else keras.optimizers.SGD(0.1, momentum=0.9))
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=jit_compile)
    return model


def _batch(rank: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(10 * rank + step)
    return rng.standard_normal((4, 5)).astype(np.float32), rng.integers(0, 3, 4).astype(np.int64)


def _train(mode: str, jit_compile: bool, steps: int = 4) -> list[np.ndarray]:
    models = [_model(jit_compile, mode=mode) for _ in range(2)]

    def fn(rank: int, comm: Any) -> np.ndarray:
        exchange = MODES[mode]().create_exchange(models[rank], comm, job_id=1)
        assert exchange.jit_compile is jit_compile
        for step in range(steps):
            assert exchange.step(*_batch(rank, step), step).finite_update
        exchange.evaluate_batch(*_batch(rank, steps))
        exchange.finish()
        exchange.close()
        return np.concatenate([w.ravel() for w in models[rank].get_weights()])

    return run_threads(2, fn)


@pytest.mark.parametrize("mode", list(MODES))
def test_xla_compiled_steps_keep_replicas_identical_and_train_as_without(mode: str) -> None:
    compiled = _train(mode, jit_compile=True)
    plain = _train(mode, jit_compile=False)
    assert compiled[0].tobytes() == compiled[1].tobytes()
    # sharing's threshold may send an element one step apart when its last bits differ
    tolerance = 1e-6 if mode in ("dense", "averaging") else 1e-2
    np.testing.assert_allclose(compiled[0], plain[0], rtol=1e-5, atol=tolerance)
    initial = np.concatenate([w.ravel() for w in _model(False, mode=mode).get_weights()])
    assert not np.allclose(compiled[0], initial)  # it trained


@pytest.mark.parametrize("mode", list(MODES))
def test_the_step_is_compiled_with_xla_only_when_the_model_says_so(mode: str) -> None:
    """An op XLA cannot compile fails the step under ``jit_compile=True`` (the graph really
    went to XLA) and trains without it."""
    from sparkdl.comm import create_communicator

    comm = create_communicator("tcp", 0, 1, lambda s: [s], secret=b"k" * 32, timeout_s=10)
    try:
        for jit_compile in (False, True):
            model = _model(jit_compile, host_op=True, mode=mode)
            assert model.jit_compile is jit_compile
            exchange = MODES[mode]().create_exchange(model, comm, job_id=1)
            if mode.startswith("sharing"):  # the path the test means to take
                assert (exchange.fallback_reason is None) == (mode == "sharing")
            if jit_compile:
                with pytest.raises(tf.errors.OpError, match=r"(?i)xla|PyFunc|numpy_function"):
                    exchange.step(*_batch(0, 0), 0)
            else:
                assert exchange.step(*_batch(0, 0), 0).finite_update
            exchange.close()
    finally:
        comm.close()
