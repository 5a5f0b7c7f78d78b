"""Custom training steps: an overridden compute_loss is what the exchange differentiates; an
overridden train_step is refused on the driver, before any worker starts."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from _comm_harness import run_threads

from sparkdl.errors import ConfigurationError
from sparkdl.training.exchanges.dense import DenseAllreduceExchange
from sparkdl.training.model_check import check_training_step
from sparkdl.training.weights import Weighted


class PenalizedLoss(keras.Sequential):
    """Twice the compiled loss plus an L1 penalty of the first kernel."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        loss = super().compute_loss(x, y, y_pred, sample_weight, training=training)
        return 2.0 * loss + 0.05 * keras.ops.sum(keras.ops.abs(self.layers[0].kernel))


class OwnStep(keras.Sequential):
    def train_step(self, data):
        return super().train_step(data)


def _model(cls: type = keras.Sequential) -> keras.Model:
    keras.utils.set_random_seed(5)
    model = cls([keras.Input((4,)), keras.layers.Dense(6, "tanh"), keras.layers.Dense(3)])
    model.compile(keras.optimizers.SGD(0.1), jit_compile=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _batches(steps: int, weighted: bool) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [(rng.normal(size=(8, 4)).astype(np.float32), rng.integers(0, 3, 8),
             rng.uniform(0, 2, 8).astype(np.float32) if weighted else np.ones(8, np.float32))
            for _ in range(steps)]


def _exchange_weights(cls: type, batches: list, weighted: bool) -> list[np.ndarray]:
    model = _model(cls)

    def train(rank: int, comm) -> None:  # type: ignore[no-untyped-def]
        exchange = DenseAllreduceExchange(model, comm)
        for x, y, w in batches:
            exchange.step(x, Weighted(y, w) if weighted else y, 0)
        exchange.finish()

    run_threads(1, train)
    return model.get_weights()


@pytest.mark.parametrize("weighted", [False, True])
def test_an_overridden_compute_loss_is_what_the_exchange_differentiates(weighted):
    batches = _batches(3, weighted)
    ours = _exchange_weights(PenalizedLoss, batches, weighted)
    reference = _model(PenalizedLoss)
    for x, y, w in batches:
        reference.train_on_batch(x, y, sample_weight=w if weighted else None)
    for got, expected in zip(ours, reference.get_weights(), strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    plain = _exchange_weights(keras.Sequential, batches, weighted)
    assert not np.allclose(plain[0], ours[0], atol=1e-4)  # the override acted


def test_an_overridden_train_step_is_refused_naming_it_and_the_alternative(tmp_path):
    with pytest.raises(ConfigurationError,
                       match=r"model class OwnStep overrides train_step.*Override compute_loss"):
        check_training_step(_model(OwnStep))
    from sparkdl.parallel import ParallelWrapper
    from sparkdl.training.masters import DenseTrainingMaster

    wrapper = ParallelWrapper(_model(OwnStep), DenseTrainingMaster(8, num_workers=1))
    with pytest.raises(ConfigurationError, match="OwnStep overrides train_step"):
        wrapper.fit(str(tmp_path / "never-read"))  # refused before the data is even looked at
    check_training_step(_model(PenalizedLoss))  # compute_loss alone is fine
    check_training_step(_model())
