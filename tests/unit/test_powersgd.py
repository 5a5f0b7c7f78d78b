"""PowerSGD (issue 22.2): rank-r factors summed by allreduce, error feedback in its memory,
the same bits on every rank, exact resume, and its configuration."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from _comm_harness import run_threads
from _models import zero_branch_model

from sparkdl.compression import compressor_from_config, compressor_to_config
from sparkdl.compression.powersgd import PowerSGDCompressor, PowerSGDCompressorConfig
from sparkdl.config import load_config
from sparkdl.errors import ConfigurationError
from sparkdl.training.exchanges.dense import DenseAllreduceExchange
from sparkdl.training.exchanges.powersgd import PowerSGDExchange
from sparkdl.training.exchanges.variables import weights_checksum
from sparkdl.training.masters import SharedTrainingMaster, master_from_training_config

SHAPES = [(30, 20), (20,), (3, 3, 4, 8), (8,), (2, 2)]


def _size(shapes: list[tuple[int, ...]]) -> int:
    return sum(int(np.prod(s)) for s in shapes)


def _round(compressors: list[PowerSGDCompressor], updates: list[np.ndarray], step: int
           ) -> list[np.ndarray]:
    """One step of every rank, the allreduces done as sums in rank order (each rank holds its
    own copy of the first sum, which the compressor orthogonalises in place)."""
    firsts = [c.compress(u, step)[0] for c, u in zip(compressors, updates, strict=True)]
    first_sum = np.sum(firsts, axis=0, dtype=np.float32)
    held = [first_sum.copy() for _ in compressors]
    seconds = [c.compress_second(f) for c, f in zip(compressors, held, strict=True)]
    second_sum = np.sum(seconds, axis=0, dtype=np.float32)
    return [c.decompress(f, second_sum, len(compressors))
            for c, f in zip(compressors, held, strict=True)]


def test_small_tensors_travel_dense_and_matrices_as_factors():
    c = PowerSGDCompressor(SHAPES, rank=2)
    assert [b.low_rank for b in c.blocks] == [True, False, True, False, False]
    # dense: 20 + 8 + 4; P: 30*2 + 36*2; Q: 20*2 + 8*2
    assert (c.first_size, c.second_size) == (32 + 60 + 72, 40 + 16)


def test_every_rank_decodes_the_same_bits_and_error_feedback_keeps_what_was_not_sent():
    world, size = 3, _size(SHAPES)
    compressors = [PowerSGDCompressor(SHAPES, rank=2, worker_rank=r) for r in range(world)]
    rng = np.random.default_rng(0)
    sent = np.zeros(size, np.float64)
    given = np.zeros(size, np.float64)
    for step in range(6):
        updates = [rng.normal(size=size).astype(np.float32) for _ in range(world)]
        given += np.mean(updates, axis=0, dtype=np.float64)
        means = _round(compressors, updates, step)
        assert all(np.array_equal(means[0], m) for m in means[1:])
        sent += means[0]
    kept = np.mean([c.get_residual() for c in compressors], axis=0, dtype=np.float64)
    np.testing.assert_allclose(sent + kept, given, atol=1e-4)  # nothing lost, only delayed
    assert np.abs(kept).max() > 0.1  # rank 2 of random matrices keeps much back


def test_a_low_rank_mean_is_found_exactly_after_warm_started_power_iterations():
    rng = np.random.default_rng(1)
    u, v = rng.normal(size=(30, 1)), rng.normal(size=(1, 20))
    matrix = (u @ v).astype(np.float32).ravel()
    compressors = [PowerSGDCompressor([(30, 20)], rank=1, worker_rank=r) for r in range(2)]
    for step in range(3):
        means = _round(compressors, [matrix, matrix], step)
    np.testing.assert_allclose(means[0], matrix, rtol=1e-4, atol=1e-4)


def test_before_start_step_the_whole_gradient_is_averaged():
    rng = np.random.default_rng(2)
    size = _size(SHAPES)
    compressors = [PowerSGDCompressor(SHAPES, start_step=1, worker_rank=r) for r in range(2)]
    updates = [rng.normal(size=size).astype(np.float32) for _ in range(2)]
    means = _round(compressors, updates, 0)
    np.testing.assert_array_equal(means[0], (updates[0] + updates[1]) / np.float32(2))
    assert not compressors[0].get_residual().any()


def test_state_resumes_with_the_same_bits():
    rng = np.random.default_rng(3)
    size = _size(SHAPES)
    updates = [[rng.normal(size=size).astype(np.float32) for _ in range(2)] for _ in range(4)]
    straight = [PowerSGDCompressor(SHAPES, worker_rank=r) for r in range(2)]
    for step in range(4):
        expected = _round(straight, updates[step], step)
    resumed = [PowerSGDCompressor(SHAPES, worker_rank=r) for r in range(2)]
    for step in range(2):
        _round(resumed, updates[step], step)
    states = [c.get_state() for c in resumed]
    fresh = [PowerSGDCompressor(SHAPES, worker_rank=r) for r in range(2)]
    for c, state in zip(fresh, states, strict=True):
        c.set_state(state)
    for step in (2, 3):
        got = _round(fresh, updates[step], step)
    assert np.array_equal(got[0], expected[0])
    with pytest.raises(ConfigurationError, match=r"q\.0"):
        fresh[0].set_state({"memory.residual": np.zeros(size, np.float32)})


def test_a_tensor_whose_update_was_all_zero_once_trains_again_afterwards():
    """A zero compensated update (a zero-initialised branch's first step) makes ``Q`` zero;
    warm-started from it, every later ``P = MQ`` would be zero too and the tensor would never
    move again. The collapsed ``Q`` is drawn afresh, the same on every rank."""
    rng = np.random.default_rng(4)
    compressors = [PowerSGDCompressor([(30, 20)], rank=2, worker_rank=r) for r in range(2)]
    zero = np.zeros(600, np.float32)
    means = _round(compressors, [zero, zero], 0)
    assert not means[0].any()
    for step in (1, 2):
        updates = [rng.normal(size=600).astype(np.float32) for _ in range(2)]
        means = _round(compressors, updates, step)
        assert np.array_equal(means[0], means[1])
    assert np.abs(means[0]).max() > 0.1, "the tensor stopped training after one zero update"


def test_a_huge_finite_update_does_not_collapse_q_for_good():
    """A column norm that overflows float32 (one update of 1e20) must not leave a zero or
    non-finite ``Q``: that step's factors are dropped (error feedback keeps the update) and
    the next steps train."""
    rng = np.random.default_rng(5)
    compressors = [PowerSGDCompressor([(30, 20)], rank=2, worker_rank=r) for r in range(2)]
    huge = rng.normal(size=600).astype(np.float32) * np.float32(1e20)
    means = _round(compressors, [huge, huge], 0)
    assert np.isfinite(means[0]).all()
    for compressor in compressors:  # forget the huge update, as after a clipped step
        compressor.set_residual(np.zeros(600, np.float32))
    updates = [rng.normal(size=600).astype(np.float32) for _ in range(2)]
    for step in (1, 2):
        means = _round(compressors, updates, step)
    assert np.isfinite(means[0]).all() and np.abs(means[0]).max() > 0.1


def test_a_non_finite_q_in_a_checkpoint_is_refused():
    compressor = PowerSGDCompressor([(30, 20)], rank=2)
    state = compressor.get_state()
    state["q.0"] = np.full_like(state["q.0"], np.nan)
    with pytest.raises(ConfigurationError, match=r"q\.0.*not finite"):
        compressor.set_state(state)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"rank": 0}, "rank must be an integer >= 1"),
     ({"min_compression": 0.5}, "min_compression must be a number >= 1"),
     ({"warm_start": "yes"}, "warm_start must be true or false")],
)
def test_bad_settings_name_the_setting(kwargs, message):
    with pytest.raises(ConfigurationError, match=message):
        PowerSGDCompressorConfig(**kwargs)


def test_the_config_round_trips_and_the_device_encoder_is_refused():
    config = PowerSGDCompressorConfig(rank=2, start_step=5)
    again = compressor_from_config(compressor_to_config(config))
    assert again.get_config() == config.get_config()
    master = SharedTrainingMaster.from_config(SharedTrainingMaster(compressor=config).get_config())
    assert master.compressor.get_config() == config.get_config()
    with pytest.raises(ConfigurationError, match="encoder='device'"):
        SharedTrainingMaster(compressor=config, encoder="device")


def test_the_yaml_keys_build_a_powersgd_master(tmp_path):
    conf = tmp_path / "c.yaml"
    conf.write_text("training:\n  mode: sharing\n  compression: powersgd\n"
                    "  powersgd:\n    rank: 2\n    start_step: 3\n")
    training = load_config(str(conf)).training
    master = master_from_training_config(training)
    assert isinstance(master.compressor, PowerSGDCompressorConfig)
    assert (master.compressor.rank, master.compressor.start_step) == (2, 3)
    conf.write_text("training:\n  compression: powersgd\n  powersgd:\n    rnak: 2\n")
    with pytest.raises(ConfigurationError, match="rnak"):
        load_config(str(conf))
    conf.write_text("training:\n  compression: topk\n")
    with pytest.raises(ConfigurationError, match="compression"):
        load_config(str(conf))


def _model() -> keras.Model:
    keras.utils.set_random_seed(4)
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(32, "relu"),
                              keras.layers.Dense(16, "relu"), keras.layers.Dense(3)])
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9), jit_compile=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _data(rank: int, world: int, steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(steps * world * 16, 12)).astype(np.float32)
    y = (x[:, :3].argmax(axis=1)).astype(np.int64)
    return [(x[i:i + 16], y[i:i + 16])
            for i in range(rank * 16, len(x), world * 16)]


def _fit(world: int, exchange_type: str, steps: int, overlap: bool = False,
         state_at: int | None = None, models: list[keras.Model] | None = None
         ) -> list[tuple[str, float, object]]:
    models = models or [_model() for _ in range(world)]

    def train(rank: int, comm) -> tuple[str, float, object]:  # type: ignore[no-untyped-def]
        model = models[rank]
        if exchange_type == "powersgd":
            shapes = [tuple(v.shape) for v in model.trainable_variables]
            compressor = PowerSGDCompressorConfig(rank=2).build(
                sum(int(np.prod(s)) for s in shapes), job_id=0, rank=rank, shapes=shapes)
            exchange = PowerSGDExchange(model, comm, compressor, overlap=overlap)
        else:
            exchange = DenseAllreduceExchange(model, comm)
        state = None
        losses = []
        for step, (x, y) in enumerate(_data(rank, world, steps)):
            losses.append(exchange.step(x, y, step).loss)
            if step == state_at:
                state = (exchange.get_state(), [v.numpy() for v in model.variables])
        exchange.finish()
        return weights_checksum(model.trainable_variables), float(np.mean(losses[-5:])), state

    return run_threads(world, train)


def test_replicas_stay_bit_identical_and_train_as_well_as_dense():
    powersgd, dense = _fit(3, "powersgd", 40), _fit(3, "dense", 40)
    assert len({checksum for checksum, _, _ in powersgd}) == 1
    first_loss = _fit(3, "dense", 1)[0][1]
    assert powersgd[0][1] < 0.5 * first_loss  # it learns
    assert powersgd[0][1] < dense[0][1] + 0.15  # about as well as dense


def test_a_kernel_whose_first_gradient_is_zero_trains_as_under_dense():
    moved = {}
    for exchange in ("powersgd", "dense"):
        models = [zero_branch_model() for _ in range(2)]
        before = models[0].layers[1].kernel.numpy().copy()
        results = _fit(2, exchange, 12, models=models)
        assert len({checksum for checksum, _, _ in results}) == 1
        moved[exchange] = float(np.abs(models[0].layers[1].kernel.numpy() - before).max())
    assert moved["dense"] > 0
    assert moved["powersgd"] > 0.2 * moved["dense"], moved  # not frozen after step 0


def test_with_overlap_replicas_stay_bit_identical():
    results = _fit(2, "powersgd", 12, overlap=True)
    assert len({checksum for checksum, _, _ in results}) == 1


def test_an_exchange_resumed_from_its_state_continues_with_the_same_bits():
    straight = _fit(2, "powersgd", 10)
    halfway = _fit(2, "powersgd", 10, state_at=4)
    models = [_model() for _ in range(2)]

    def resume(rank: int, comm) -> str:  # type: ignore[no-untyped-def]
        state, weights = halfway[rank][2]
        model = models[rank]
        shapes = [tuple(v.shape) for v in model.trainable_variables]
        compressor = PowerSGDCompressorConfig(rank=2).build(
            sum(int(np.prod(s)) for s in shapes), job_id=0, rank=rank, shapes=shapes)
        exchange = PowerSGDExchange(model, comm, compressor)
        for variable, value in zip(model.variables, weights, strict=True):
            variable.assign(value)
        exchange.set_state(state)
        for step, (x, y) in enumerate(_data(rank, 2, 10)):
            if step > 4:
                exchange.step(x, y, step)
        exchange.finish()
        return weights_checksum(model.trainable_variables)

    assert run_threads(2, resume) == [checksum for checksum, _, _ in straight]


def test_a_rank_above_every_matrix_is_said_at_fit_time(tmp_path, caplog) -> None:
    """powersgd.rank is bounded generously by the configuration (1024); one that compresses
    none of this model's matrices is said in one line when the fit starts (finding 8)."""
    import logging

    import keras
    from test_accumulation import _fit_until_launch

    from sparkdl.compression.powersgd import PowerSGDCompressorConfig, rank_too_large
    from sparkdl.training.masters import SharedTrainingMaster

    assert rank_too_large([(6, 16), (16,), (16, 3), (3,)], 4) is None  # 6x16 compresses
    assert rank_too_large([(16,)], 100) is None  # no matrix at all
    assert rank_too_large([(64, 64)], 40) is None  # below 64: min_compression decides
    line = rank_too_large([(6, 16), (16,), (16, 3)], 100)
    assert line is not None and line.startswith(
        "powersgd.rank=100 is not below the smaller dimension of any of the model's 2 weight "
        "matrices (at most 6)")
    master = SharedTrainingMaster(8, 2, compressor=PowerSGDCompressorConfig(rank=100))
    model = keras.Sequential([keras.Input((2, 3)), keras.layers.Flatten(),
                              keras.layers.Dense(3, "softmax")])
    model.compile("sgd", "sparse_categorical_crossentropy", jit_compile=False)
    with caplog.at_level(logging.WARNING, logger="sparkdl"), \
            pytest.raises(AssertionError, match="launched"):
        _fit_until_launch(tmp_path, master, 1, 1, model)
    assert any("powersgd.rank=100 is not below" in r.getMessage() for r in caplog.records)


def test_compression_a_small_models_auto_mode_does_not_use_is_said(caplog) -> None:
    """mode 'auto' trains a small model dense: its compression key is then unused, said in
    one line (mode averaging or dense with compression: powersgd is refused by the config)."""
    import logging

    training = load_config(data={"training": {"compression": "powersgd"}}).training
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with caplog.at_level(logging.WARNING, logger="sparkdl"):
        master = master_from_training_config(training, model)
    assert master.mode == "dense"
    assert any("training.compression 'powersgd' is not used: mode 'auto' chose 'dense'"
               in r.getMessage() for r in caplog.records), caplog.records
