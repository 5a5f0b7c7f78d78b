"""The dense exchange's deferred optimizer step: step t+1's one TensorFlow call applies step
t's mean gradient, then takes its own; the bits are those of applying each step at once, and
every reader of the weights sees them whole."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from _comm_harness import run_threads

from sparkdl.comm import create_communicator
from sparkdl.training.exchanges import dense
from sparkdl.training.exchanges.dense import DenseAllreduceExchange
from sparkdl.training.exchanges.variables import weights_checksum


def _model() -> keras.Model:
    keras.utils.set_random_seed(4)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(20, "relu"),
                              keras.layers.BatchNormalization(), keras.layers.Dense(3)])
    model.compile(keras.optimizers.Adam(1e-2), jit_compile=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _batches(rank: int, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(rank)
    return [(rng.normal(size=(8, 5)).astype(np.float32), rng.integers(0, 3, 8))
            for _ in range(count)]


def _train(world: int, drain_every_step: bool) -> list[tuple[str, list[float], int]]:
    models = [_model() for _ in range(world)]

    def train(rank: int, comm) -> tuple[str, list[float], int]:  # type: ignore[no-untyped-def]
        exchange = DenseAllreduceExchange(models[rank], comm)
        alone = 0
        apply_alone = exchange._apply_alone

        def counted(pending):  # type: ignore[no-untyped-def]
            nonlocal alone
            alone += 1
            return apply_alone(pending)

        exchange._apply_alone = counted  # type: ignore[method-assign]
        losses = []
        for step, (x, y) in enumerate(_batches(rank, 6)):
            losses.append(exchange.step(x, y, step).loss)
            if drain_every_step:
                exchange.drain()
        exchange.finish()
        return weights_checksum(models[rank].trainable_variables), losses, alone

    return run_threads(world, train)


@pytest.mark.parametrize("world", [1, 2])
def test_the_deferred_optimizer_step_gives_the_bits_of_applying_each_step_at_once(world):
    deferred, at_once = _train(world, False), _train(world, True)
    assert deferred == [(s, losses, 1) for s, losses, _ in at_once]  # one apply alone: finish
    assert [alone for _, _, alone in at_once] == [6] * world
    assert len({checksum for checksum, _, _ in deferred}) == 1  # replicas bit-identical


def test_every_reader_of_the_weights_sees_the_last_step_applied():
    def train(rank: int, comm) -> None:  # type: ignore[no-untyped-def]
        model = _model()
        exchange = DenseAllreduceExchange(model, comm)
        (x, y), (x2, y2) = _batches(0, 2)
        def weights() -> list[np.ndarray]:
            return [v.numpy() for v in model.trainable_variables]

        before = weights()
        exchange.step(x, y, 0)
        unchanged = [np.array_equal(a, b) for a, b in zip(before, weights())]
        assert all(unchanged)  # the optimizer step waits for the next step's graph
        loss = exchange.evaluate_batch(x2, y2)  # drains first
        changed = [not np.array_equal(a, b) for a, b in zip(before, weights())]
        assert any(changed)
        assert loss == exchange.evaluate_batch(x2, y2)
        exchange.step(x, y, 1)
        state = exchange.get_state()  # drains first: the optimizer has taken both steps
        assert int(state["optimizer.0"]) == 2

    run_threads(1, train)


@pytest.mark.parametrize("wire", ["float32", "bfloat16"])
def test_with_two_ranks_the_mean_lands_in_one_reused_buffer_that_tensorflow_reads_in_place(wire):
    models = [_model() for _ in range(2)]

    def train(rank: int, comm) -> list[bool]:  # type: ignore[no-untyped-def]
        exchange = DenseAllreduceExchange(models[rank], comm, wire_dtype=wire)
        shared = []
        for step, (x, y) in enumerate(_batches(rank, 3)):
            exchange.step(x, y, step)
            buffer = exchange._buffer(np.dtype(np.float32))
            pending = np.asarray(exchange._pending)
            shared.append(pending.ctypes.data == buffer.ctypes.data
                          and buffer.ctypes.data % 64 == 0)
        exchange.finish()
        return shared

    assert run_threads(2, train) == [[True] * 3] * 2


@pytest.mark.parametrize("world", [1, 2])
def test_the_gradient_stays_in_its_variables_pieces_with_the_bits_of_the_flat_path(
    world, monkeypatch
):
    """On the deferred float32 path with large variables the gradient reaches the collective
    as one array per variable (never concatenated; one rank applies them as they are): the
    same weights and losses, bit for bit, as the flat gradient."""
    def run(pieces: bool) -> list[tuple[str, list[float], list[str]]]:
        # this model's variables are small: the flat path unless the bound is lowered
        monkeypatch.setattr(dense, "PIECES_MIN_ELEMENTS", 1 if pieces else 1 << 16)
        models = [_model() for _ in range(world)]

        def train(rank: int, comm) -> tuple[str, list[float], list[str]]:  # type: ignore[no-untyped-def]
            exchange = DenseAllreduceExchange(models[rank], comm)
            sent = []
            communicate = exchange.communicate

            def spy(message, step):  # type: ignore[no-untyped-def]
                sent.append(type(message).__name__)
                return communicate(message, step)

            exchange.communicate = spy  # type: ignore[method-assign]
            losses = [exchange.step(x, y, step).loss
                      for step, (x, y) in enumerate(_batches(rank, 5))]
            exchange.finish()
            return weights_checksum(models[rank].trainable_variables), losses, sent

        return run_threads(world, train)

    in_pieces, flat = run(True), run(False)
    assert [sent for _, _, sent in in_pieces] == [["list"] * 5] * world
    assert [sent for _, _, sent in flat] == [["ndarray"] * 5] * world
    assert [(c, losses) for c, losses, _ in in_pieces] == [(c, losses) for c, losses, _ in flat]
    assert len({c for c, _, _ in in_pieces}) == 1  # replicas bit-identical


def test_pieces_only_where_the_variables_are_large_on_average():
    def exchange(*units: int, wire: str = "float32", **options: object) -> DenseAllreduceExchange:
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((256,))] + [keras.layers.Dense(u) for u in units])
        model.compile(keras.optimizers.SGD(0.1), loss="mse")
        comm = create_communicator("tcp", 0, 1, lambda s: [s], secret=b"s" * 32, timeout_s=10)
        return DenseAllreduceExchange(model, comm, wire_dtype=wire, **options)  # type: ignore[arg-type]

    assert exchange(1024).trainable.size >= 2 * dense.PIECES_MIN_ELEMENTS
    assert exchange(1024)._in_pieces()  # 263,168 elements in 2 variables
    assert not exchange(*[16] * 20)._in_pieces()  # 40 variables of 400 elements on average
    assert not exchange(1024, wire="bfloat16")._in_pieces()
    assert not exchange(1024, overlap=True)._in_pieces()
