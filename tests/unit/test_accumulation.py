"""Gradient accumulation: k micro-batches per exchange are one step with a k-times larger
batch (dense), and a resume in the middle of an accumulation continues exactly."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from _comm_harness import run_threads

from sparkdl.errors import ConfigurationError
from sparkdl.training.exchanges.dense import DenseAllreduceExchange

K, B, STEPS = 4, 8, 3  # micro-batches per exchange, micro-batch rows, exchanges


def _linear() -> keras.Model:
    """A linear model whose arithmetic is exact in float32: dyadic weights, inputs and
    targets, MSE, SGD with a power-of-two rate, power-of-two batch sizes, so the order of the
    sums cannot matter. Each step adds mantissa bits to the weights: after 2 exchanges they
    still fit float32's 24 (a third rounds a bias in its last bit, order-dependently)."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.set_weights([np.array([[0.5], [-0.25], [0.125]], np.float32),
                       np.array([0.25], np.float32)])
    model.compile(keras.optimizers.SGD(2.0 ** -6), "mse", jit_compile=False)
    return model


def _mlp() -> keras.Model:
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(8, "tanh"),
                              keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(0.01), "mse", jit_compile=False)
    return model


def _rows(rank: int, exchange_step: int, dyadic: bool) -> tuple[np.ndarray, np.ndarray]:
    """This rank's K x B rows of one exchange."""
    rng = np.random.default_rng(100 * rank + exchange_step)
    if dyadic:
        return (rng.integers(-2, 3, (K * B, 3)).astype(np.float32),
                rng.integers(-4, 5, (K * B, 1)).astype(np.float32))
    return (rng.normal(size=(K * B, 3)).astype(np.float32),
            rng.normal(size=(K * B, 1)).astype(np.float32))


def _train(make, world: int, accumulate: int, dyadic: bool, steps: int = STEPS,
           overlap: bool = False) -> list[list[np.ndarray]]:
    models = [make() for _ in range(world)]

    def train(rank: int, comm) -> None:  # type: ignore[no-untyped-def]
        exchange = DenseAllreduceExchange(models[rank], comm, overlap=overlap)
        exchange.accumulate(accumulate)
        rows = K * B // accumulate
        for step in range(steps):
            x, y = _rows(rank, step, dyadic)
            for m in range(accumulate):
                exchange.step(x[m * rows:(m + 1) * rows], y[m * rows:(m + 1) * rows], step)
        exchange.finish()

    run_threads(world, train)
    return [m.get_weights() for m in models]


@pytest.mark.parametrize(("world", "overlap"), [(1, False), (2, False), (2, True)])
def test_k_micro_batches_are_bit_for_bit_one_step_with_a_k_times_larger_batch(world, overlap):
    # with overlap, both exchange every K micro-batches one exchange late
    accumulated = _train(_linear, world, K, dyadic=True, steps=2, overlap=overlap)
    large = _train(_linear, world, 1, dyadic=True, steps=2, overlap=overlap)
    for got, expected in zip(accumulated, large, strict=True):
        for a, b in zip(got, expected, strict=True):
            assert np.array_equal(a, b)
    assert not np.array_equal(large[0][0], _linear().get_weights()[0])  # it trained


def test_on_arbitrary_floats_accumulation_matches_the_larger_batch_to_rounding():
    # Not bitwise here: TensorFlow reduces the larger batch's per-row terms in one sum, the
    # accumulation sums K partial sums, and float32 addition is not associative.
    accumulated = _train(_mlp, 1, K, dyadic=False)[0]
    large = _train(_mlp, 1, 1, dyadic=False)[0]
    for a, b in zip(accumulated, large, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_resume_in_the_middle_of_an_accumulation_continues_exactly():
    x, y = _rows(0, 0, dyadic=False)
    micro = [(x[m * B:(m + 1) * B], y[m * B:(m + 1) * B]) for m in range(K)] * 2

    def run(split: int | None) -> list[np.ndarray]:
        model = _mlp()
        out: list[np.ndarray] = []

        def train(rank: int, comm) -> None:  # type: ignore[no-untyped-def]
            exchange = DenseAllreduceExchange(model, comm)
            exchange.accumulate(K)
            for i, (bx, by) in enumerate(micro):
                if i == split:  # a new worker from the weights and the saved state
                    state, weights = exchange.get_state(), model.get_weights()
                    assert state["accumulated_steps"] == split % K
                    fresh = _mlp()
                    fresh.set_weights(weights)
                    exchange = DenseAllreduceExchange(fresh, comm)
                    exchange.accumulate(K)
                    exchange.set_state(state)
                exchange.step(bx, by, i)
            out.extend(exchange.model.get_weights())

        run_threads(1, train)
        return out

    for a, b in zip(run(None), run(K + 2), strict=True):
        assert np.array_equal(a, b)


def test_accumulation_is_refused_where_the_update_is_not_the_gradient():
    from sparkdl.training.masters import SharedTrainingMaster

    def check(rank: int, comm) -> None:  # type: ignore[no-untyped-def]
        exchange = SharedTrainingMaster(num_workers=1).create_exchange(_mlp(), comm, job_id=1)
        with pytest.raises(ConfigurationError, match=r"accumulate_steps=2 needs .*'dense'"):
            exchange.accumulate(2)

    run_threads(1, check)


class _NeverLaunched:
    """A launcher the fit must refuse before: running it fails the test."""

    bind_host = driver_host = "127.0.0.1"
    threads_per_worker = 1
    elastic_events: list = []  # type: ignore[type-arg]

    def check_slots(self, num_workers: int) -> None:
        pass

    def model_dir(self, data_uri: str, checkpoint_dir: str | None) -> str:
        from sparkdl.training.model_files import temporary_model_dir

        return temporary_model_dir()

    def run(self, spec, secret):  # type: ignore[no-untyped-def]
        raise AssertionError("the fit launched its workers")

    def cancel(self) -> None:
        pass


def _fit_until_launch(tmp_path, master, accumulate: int, epochs: int, model=None):  # type: ignore[no-untyped-def]
    from test_data_reader import make_shards

    from sparkdl.fit_options import FitOptions
    from sparkdl.training.driver.run_fit import run_fit

    uri, _ = make_shards(tmp_path / "train", [[16, 16], [16, 16]])  # 64 rows
    if model is None:
        model = keras.Sequential([keras.Input((2, 3)), keras.layers.Flatten(),
                                  keras.layers.Dense(3, "softmax")])
        model.compile("sgd", "sparse_categorical_crossentropy", jit_compile=False)
    options = FitOptions(epochs=epochs, accumulate_steps=accumulate, verbose=0)
    return run_fit(model, master, _NeverLaunched(), uri, options)  # type: ignore[arg-type]


def test_accumulate_steps_beyond_the_fits_steps_is_refused_before_the_workers_start(tmp_path):
    """4 steps an epoch (64 rows, 2 workers x 8) for 2 epochs: accumulating 9 micro-batches
    would never apply an update (the weights unchanged, the same loss every epoch)."""
    from sparkdl.training.masters import DenseTrainingMaster

    with pytest.raises(ConfigurationError, match=r"^accumulate_steps=9 is more than the fit's 8 "
                       r"steps \(4 steps per epoch x 2 epochs\)"):
        _fit_until_launch(tmp_path, DenseTrainingMaster(8, 2), 9, 2)
    with pytest.raises(AssertionError, match="launched"):  # 8 micro-batches: one update
        _fit_until_launch(tmp_path / "ok", DenseTrainingMaster(8, 2), 8, 2)
