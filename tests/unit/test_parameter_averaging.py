"""Parameter averaging's rounds: replicas leave every average with the same bits, the mean of
what each rank held; the flat assignment it uses writes the variables' own buffers."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from _comm_harness import run_threads

from sparkdl.training.host_views import read_no_copy
from sparkdl.training.masters import ParameterAveragingTrainingMaster
from sparkdl.training.variables import FlatVariables

FREQUENCY = 3


def _model() -> tf.keras.Model:
    tf.keras.utils.set_random_seed(3)
    model = tf.keras.Sequential([
        tf.keras.Input((6,)),
        tf.keras.layers.Dense(8, activation="relu"),
        tf.keras.layers.Dense(3),
    ])
    model.compile(optimizer=tf.keras.optimizers.Adam(0.01),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _batches(rank: int, steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(100 + rank)  # every rank its own data
    return [(rng.normal(0, 1, (8, 6)).astype(np.float32), rng.integers(0, 3, 8))
            for _ in range(steps)]


def test_every_average_leaves_both_replicas_with_the_mean_of_their_parameters():
    models = [_model() for _ in range(2)]

    def train(rank: int, comm):  # type: ignore[no-untyped-def]
        exchange = ParameterAveragingTrainingMaster(8, 2, averaging_frequency=10**6) \
            .create_exchange(models[rank], comm, job_id=1)
        rounds = []
        for step, (x, y) in enumerate(_batches(rank, 2 * FREQUENCY)):
            exchange.step(x, y, step)  # a local step
            if step % FREQUENCY == FREQUENCY - 1:
                before = (exchange.trainable.read(), exchange.optimizer_state.read())
                exchange.average()
                after = (exchange.trainable.read(), exchange.optimizer_state.read())
                rounds.append((before, after))
        exchange.close()
        return rounds

    ranks = run_threads(2, train)
    assert len(ranks[0]) == 2
    for index in range(2):
        (weights_0, state_0), (mean_weights, mean_state) = ranks[0][index]
        (weights_1, state_1), (mean_weights_1, mean_state_1) = ranks[1][index]
        assert not np.array_equal(weights_0, weights_1)  # their own data: they drifted apart
        assert mean_weights.tobytes() == mean_weights_1.tobytes()
        assert mean_state.tobytes() == mean_state_1.tobytes()
        # two ranks: the ring's sum is exact in either order, the halving too
        np.testing.assert_array_equal(mean_weights, (weights_0 + weights_1) / np.float32(2))
        np.testing.assert_array_equal(mean_state, (state_0 + state_1) / np.float32(2))


def test_assign_in_place_writes_each_variables_own_buffer_with_assigns_bits():
    model, twin = _model(), _model()
    flat = np.random.default_rng(0).normal(0, 1, FlatVariables(model.variables).size) \
        .astype(np.float32)
    addresses = [np.asarray(read_no_copy(v)).ctypes.data for v in model.trainable_variables]
    FlatVariables(model.variables).assign_in_place(flat)
    FlatVariables(twin.variables).assign(flat)
    assert [np.asarray(read_no_copy(v)).ctypes.data
            for v in model.trainable_variables] == addresses
    for mine, theirs in zip(model.variables, twin.variables, strict=True):
        assert np.asarray(mine).tobytes() == np.asarray(theirs).tobytes()
    np.testing.assert_array_equal(FlatVariables(model.variables).read(), flat)


def test_assign_in_place_falls_back_to_assign_for_other_dtypes_and_checks_the_length():
    variables = [tf.Variable(np.zeros((2, 3), np.float64)), tf.Variable(np.zeros(4, np.float32))]
    flat = FlatVariables(variables)
    flat.assign_in_place(np.arange(10, dtype=np.float32))
    assert variables[0].dtype == tf.float64
    np.testing.assert_array_equal(variables[0].numpy(), np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(variables[1].numpy(), np.arange(6, 10))
    with pytest.raises(ValueError, match="expected a vector of 10 elements"):
        flat.assign_in_place(np.zeros(9, np.float32))
    with pytest.raises(ValueError, match="expected a vector of 4 elements"):
        FlatVariables(variables[1:]).assign_in_place(np.zeros(5, np.float32))
