"""The dense allreduce's bfloat16 wire: half the bytes of float32, the same mean gradient to
bfloat16's precision, and the same bits on every rank."""

from __future__ import annotations

import keras
import ml_dtypes
import numpy as np
import pytest
from _comm_harness import run_threads

from sparkdl.config import TrainingConfig
from sparkdl.errors import ConfigurationError
from sparkdl.training.exchanges.dense import DenseAllreduceExchange
from sparkdl.training.masters import DenseTrainingMaster, master_from_config


def _model() -> keras.Model:
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(256, "tanh"),
                              keras.layers.Dense(4)])
    model.compile(keras.optimizers.SGD(0.1), "mse", jit_compile=False)
    return model


def _step(world: int, wire: str) -> list[tuple[list[np.ndarray], int]]:
    models = [_model() for _ in range(world)]

    def train(rank: int, comm) -> tuple[list[np.ndarray], int]:  # type: ignore[no-untyped-def]
        exchange = DenseAllreduceExchange(models[rank], comm, wire_dtype=wire)
        before = models[rank].get_weights()
        rng = np.random.default_rng(rank)
        sent = comm.counters.snapshot()[0]
        exchange.step(rng.normal(size=(16, 32)).astype(np.float32),
                      rng.normal(size=(16, 4)).astype(np.float32), 0)
        sent = comm.counters.snapshot()[0] - sent
        exchange.finish()  # the optimizer step waits for the next step or finish()
        return [a - b for a, b in zip(models[rank].get_weights(), before, strict=True)], sent

    return run_threads(world, train)


@pytest.mark.parametrize("world", [2, 3])
def test_the_bfloat16_wire_halves_the_bytes_and_applies_the_mean_to_its_precision(world):
    full, half = _step(world, "float32"), _step(world, "bfloat16")
    for rank in range(world):
        ratio = half[rank][1] / full[rank][1]
        assert 0.49 < ratio < 0.52, ratio  # half the payload; the frame headers stay
        for a, b in zip(half[0][0], half[rank][0], strict=True):
            assert np.array_equal(a, b)  # the same bits on every rank
    for got, expected in zip(half[0][0], full[0][0], strict=True):
        assert np.abs(expected).max() > 1e-3
        # bfloat16 keeps 8 bits: each rank's value and each hop's sum round to 2**-8 of
        # themselves, so an element where the ranks cancel is off by 2**-8 of their size
        np.testing.assert_allclose(got, expected, rtol=2 ** -6,
                                   atol=2 ** -7 * np.abs(expected).max())


def test_the_ring_sums_bfloat16_arrays_the_same_on_every_rank():
    values = np.random.default_rng(0).normal(size=(3, 1000)).astype(np.float32)

    def reduce(rank: int, comm) -> np.ndarray:  # type: ignore[no-untyped-def]
        return comm.allreduce(values[rank].astype(ml_dtypes.bfloat16), "sum")

    outs = run_threads(3, reduce)
    assert all(o.dtype == ml_dtypes.bfloat16 and np.array_equal(o, outs[0]) for o in outs)
    np.testing.assert_allclose(outs[0].astype(np.float32), values.sum(axis=0), atol=0.05)


def test_wire_dtype_round_trips_through_the_config_and_refuses_other_values():
    master = DenseTrainingMaster(8, 2, wire_dtype="bfloat16")
    assert master_from_config(master.get_config()).wire_dtype == "bfloat16"
    with pytest.raises(ConfigurationError, match="wire_dtype must be 'float32' or 'bfloat16', "
                                                 "got 'float16'"):
        DenseTrainingMaster(wire_dtype="float16")
    assert TrainingConfig(mode="dense", wire_dtype="bfloat16").wire_dtype == "bfloat16"
    with pytest.raises(ValueError,
                       match="wire_dtype: 'bfloat16' applies to mode 'dense', not 'sharing'"):
        TrainingConfig(mode="sharing", wire_dtype="bfloat16")
