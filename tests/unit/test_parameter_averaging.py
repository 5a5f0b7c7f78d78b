"""Parameter averaging's rounds: replicas leave every average with the same bits, the mean of
what each rank held, read from and written to the variables' own buffers; so do the
non-trainable statistics at the end of an epoch."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from _comm_harness import run_threads

from sparkdl.training.exchanges.host_views import read_no_copy
from sparkdl.training.exchanges.variables import FlatVariables
from sparkdl.training.masters import DenseTrainingMaster, ParameterAveragingTrainingMaster

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


def _local_exchange(model: tf.keras.Model, comm):  # type: ignore[no-untyped-def]
    """An averaging exchange that averages only when told to (:meth:`average`)."""
    return ParameterAveragingTrainingMaster(8, 2, averaging_frequency=10**6) \
        .create_exchange(model, comm, job_id=1)


def test_every_average_leaves_both_replicas_with_the_mean_of_their_parameters():
    models = [_model() for _ in range(2)]

    def train(rank: int, comm):  # type: ignore[no-untyped-def]
        exchange = _local_exchange(models[rank], comm)
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


def _addresses(variables) -> list[int]:  # type: ignore[no-untyped-def]
    return [np.asarray(read_no_copy(v)).ctypes.data for v in variables]


def test_an_average_reads_and_writes_the_variables_own_buffers_through_one_kept_vector():
    models = [_model() for _ in range(2)]

    def train(rank: int, comm):  # type: ignore[no-untyped-def]
        exchange = _local_exchange(models[rank], comm)
        for step, (x, y) in enumerate(_batches(rank, 2)):
            exchange.step(x, y, step)
        variables = [*exchange.trainable.variables, *exchange.optimizer_state.variables]
        before = _addresses(variables)
        exchange.average()
        result = exchange._result
        exchange.average()
        found = (before, _addresses(variables), result is exchange._result,
                 result.size == exchange.trainable.size + exchange.optimizer_state.size)
        exchange.close()
        return found

    for before, after, kept, sized in run_threads(2, train):
        assert after == before  # written in place: no new buffer for any variable
        assert kept and sized


def test_a_model_larger_than_the_window_is_averaged_window_by_window(monkeypatch):
    from sparkdl.training.exchanges import averaging

    monkeypatch.setattr(averaging, "AVERAGE_WINDOW", 64)
    models = [_model() for _ in range(2)]

    def train(rank: int, comm):  # type: ignore[no-untyped-def]
        exchange = _local_exchange(models[rank], comm)
        for step, (x, y) in enumerate(_batches(rank, 2)):
            exchange.step(x, y, step)
        before = exchange._averaged.read()
        exchange.average()
        found = (before, exchange._averaged.read(), exchange._result.size)
        exchange.close()
        return found

    (mine, mine_after, window), (theirs, theirs_after, _) = run_threads(2, train)
    assert window == 64 < mine.size  # several windows
    assert mine_after.tobytes() == theirs_after.tobytes()
    # two ranks: the ring's sum is exact in either order, the halving too
    np.testing.assert_array_equal(mine_after, (mine + theirs) / np.float32(2))


def test_the_step_an_average_follows_hands_it_reads_of_the_buffers_from_its_own_graph():
    models = [_model() for _ in range(2)]

    def train(rank: int, comm):  # type: ignore[no-untyped-def]
        exchange = ParameterAveragingTrainingMaster(8, 2, averaging_frequency=FREQUENCY) \
            .create_exchange(models[rank], comm, job_id=1)
        variables = [*exchange.trainable.variables, *exchange.optimizer_state.variables]
        seen: list[tuple[np.ndarray, bool]] = []
        reduce = exchange.mean_over_ranks

        def mean_over_ranks(pieces, out):  # type: ignore[no-untyped-def]
            aliased = all(np.shares_memory(p, np.asarray(read_no_copy(v)))
                          for p, v in zip(pieces, variables, strict=True))
            seen.append((np.concatenate(pieces), aliased))
            return reduce(pieces, out)

        def read_all():  # type: ignore[no-untyped-def]
            raise AssertionError("the round read the variables in a TensorFlow call of its own")

        exchange.mean_over_ranks = mean_over_ranks
        exchange._averaged._views.read_all = read_all
        for step, (x, y) in enumerate(_batches(rank, 2 * FREQUENCY)):
            exchange.step(x, y, step)
            if step == FREQUENCY - 1:
                after_first = np.concatenate([exchange.trainable.read(),
                                              exchange.optimizer_state.read()])
        exchange.close()
        return seen, after_first

    ranks = run_threads(2, train)
    assert [len(seen) for seen, _ in ranks] == [2, 2]  # one round every FREQUENCY steps
    (before_0, aliased_0), (before_1, aliased_1) = ranks[0][0][0], ranks[1][0][0]
    assert aliased_0 and aliased_1  # the buffers themselves, through the graph's reads
    assert not np.array_equal(before_0, before_1)
    mean_0, mean_1 = ranks[0][1], ranks[1][1]
    assert mean_0.tobytes() == mean_1.tobytes()
    np.testing.assert_array_equal(mean_0, (before_0 + before_1) / np.float32(2))


def test_step_with_average_averages_through_a_one_rank_communicator_where_a_fit_skips():
    def train(rank: int, comm):  # type: ignore[no-untyped-def]
        exchange = ParameterAveragingTrainingMaster(8, 1, averaging_frequency=2) \
            .create_exchange(_model(), comm, job_id=1)
        rounds: list[int] = []
        reduce = exchange.mean_over_ranks

        def mean_over_ranks(pieces, out):  # type: ignore[no-untyped-def]
            rounds.append(len(pieces))
            return reduce(pieces, out)

        exchange.mean_over_ranks = mean_over_ranks
        batches = _batches(rank, 5)
        for step, (x, y) in enumerate(batches[:4]):
            exchange.step(x, y, step)  # one rank: every average is skipped
        skipped = len(rounds)
        before = exchange.trainable.read()
        exchange.step_with_average(*batches[4], 4)
        averaged = len([*exchange.trainable.variables, *exchange.optimizer_state.variables])
        found = (skipped, rounds == [averaged], exchange._since_average, before,
                 exchange.trainable.read())
        exchange.close()
        return found

    [(skipped, one_round, since, before, after)] = run_threads(1, train)
    assert skipped == 0
    assert one_round  # one round, over the parameters and the optimizer's variables
    assert since == 0
    assert not np.array_equal(before, after)  # its local step, then the (identity) mean


def test_end_of_epoch_leaves_both_replicas_with_the_mean_of_their_batchnorm_statistics():
    def bn_model() -> tf.keras.Model:
        tf.keras.utils.set_random_seed(5)
        model = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(8),
                                     tf.keras.layers.BatchNormalization(),
                                     tf.keras.layers.Dense(3)])
        model.compile(optimizer="sgd", loss=tf.keras.losses.SparseCategoricalCrossentropy(
            from_logits=True))
        return model

    models = [bn_model() for _ in range(2)]

    def train(rank: int, comm):  # type: ignore[no-untyped-def]
        exchange = DenseTrainingMaster(8, 2).create_exchange(models[rank], comm, job_id=1)
        for step, (x, y) in enumerate(_batches(rank, 3)):
            exchange.step(x, y, step)
        exchange.drain()
        before = exchange.non_trainable.read()
        exchange.end_epoch(0)
        after = exchange.non_trainable.read()
        exchange.close()
        return before, after

    (before_0, after_0), (before_1, after_1) = run_threads(2, train)
    assert before_0.size == 2 * 8 and not np.array_equal(before_0, before_1)
    assert after_0.tobytes() == after_1.tobytes()
    np.testing.assert_array_equal(after_0, (before_0 + before_1) / np.float32(2))


def test_replace_by_writes_each_variables_own_buffer_with_assigns_bits():
    model, twin = _model(), _model()
    flat = np.random.default_rng(0).normal(0, 1, FlatVariables(model.variables).size) \
        .astype(np.float32)
    aliased: list[bool] = []

    def reduce(pieces, out):  # type: ignore[no-untyped-def]
        aliased.extend(np.shares_memory(p, np.asarray(read_no_copy(v)))
                       for p, v in zip(pieces, model.variables, strict=True))
        out[:] = flat
        return out

    addresses = _addresses(model.variables)
    FlatVariables(model.variables).replace_by(reduce, np.empty(flat.size, np.float32))
    FlatVariables(twin.variables).assign(flat)
    assert aliased and all(aliased)  # read in place
    assert _addresses(model.variables) == addresses  # written in place
    for mine, theirs in zip(model.variables, twin.variables, strict=True):
        assert np.asarray(mine).tobytes() == np.asarray(theirs).tobytes()
    np.testing.assert_array_equal(FlatVariables(model.variables).read(), flat)


def test_replace_by_a_smaller_result_vector_reduces_in_windows_in_place():
    variables = [tf.Variable(np.arange(7, dtype=np.float32)),
                 tf.Variable(np.arange(7, 19, dtype=np.float32).reshape(3, 4)),
                 tf.Variable(np.arange(19, 21, dtype=np.float32))]
    addresses = _addresses(variables)
    out = np.empty(5, np.float32)
    windows: list[int] = []

    def double(pieces, window):  # type: ignore[no-untyped-def]
        assert np.shares_memory(window, out)  # the kept vector, never a new one
        windows.append(window.size)
        window[:] = 2 * np.concatenate(pieces)
        return window

    FlatVariables(variables).replace_by(double, out)
    assert windows == [5, 5, 5, 5, 1]  # 21 elements, pieces split across windows
    assert _addresses(variables) == addresses  # written in place
    np.testing.assert_array_equal(FlatVariables(variables).read(),
                                  2 * np.arange(21, dtype=np.float32))


def test_replace_by_falls_back_to_one_flat_read_for_other_dtypes_and_checks_the_length():
    variables = [tf.Variable(np.zeros((2, 3), np.float64)), tf.Variable(np.zeros(4, np.float32))]
    given: list[list[np.ndarray]] = []

    def count(pieces, out):  # type: ignore[no-untyped-def]
        given.append(pieces)
        return np.arange(10, dtype=np.float32)

    FlatVariables(variables).replace_by(count, np.empty(10, np.float32))
    assert [p.shape for p in given[0]] == [(10,)]  # one flat read
    assert variables[0].dtype == tf.float64
    np.testing.assert_array_equal(variables[0].numpy(), np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(variables[1].numpy(), np.arange(6, 10))
    with pytest.raises(ValueError, match="expected a vector of 10 elements"):
        FlatVariables(variables).replace_by(lambda p, out: out[:9], np.empty(10, np.float32))
    with pytest.raises(ValueError, match=r"expected a vector of 4 elements, got \(5,\)"):
        FlatVariables(variables[1:]).replace_by(lambda p, out: np.zeros(5, np.float32),
                                                np.empty(4, np.float32))
