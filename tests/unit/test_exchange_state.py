"""UpdateExchange.get_state()/set_state(): a rank's whole exchange state (residual, its own
threshold state, optimizer, pending sum, averaging counter) restores training exactly;
SharedTrainingMaster(compressor=...); averaging's loss after averaging."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from sparkdl.comm import create_communicator
from sparkdl.compression import (
    AdaptiveThreshold,
    FixedThreshold,
    ResidualClipping,
    ResidualPostProcessor,
    ShakeUp,
    ThresholdCompressorConfig,
)
from sparkdl.config import TrainingConfig
from sparkdl.errors import ConfigurationError
from sparkdl.training.exchanges.variables import weights_checksum
from sparkdl.training.masters import (
    DenseTrainingMaster,
    ParameterAveragingTrainingMaster,
    SharedTrainingMaster,
    master_from_config,
    master_from_training_config,
)


@pytest.fixture
def comm():  # type: ignore[no-untyped-def]
    comm = create_communicator("tcp", 0, 1, lambda s: [s], secret=b"s" * 32, timeout_s=10)
    yield comm
    comm.close()


def _model() -> keras.Model:
    keras.utils.set_random_seed(3)
    model = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(12, activation="relu"), keras.layers.Dense(3)]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def _batches(seed: int, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal((8, 6)).astype(np.float32), rng.integers(0, 3, 8).astype(np.int64))
        for _ in range(count)
    ]


MASTERS = {
    "sharing-host": lambda: SharedTrainingMaster(
        8, 1,
        threshold=AdaptiveThreshold(initial=1e-2, min_sparsity=0.05, max_sparsity=0.2),
        shake_up=ShakeUp(frequency=3, factor=0.3),
        residual_clipping=ResidualClipping(factor=2.0, frequency=4),
        encoder="host",
    ),
    "sharing-device": lambda: SharedTrainingMaster(
        8, 1,
        threshold=AdaptiveThreshold(initial=1e-2, min_sparsity=0.05, max_sparsity=0.2),
        encoder="device",
    ),
    "averaging": lambda: ParameterAveragingTrainingMaster(8, 1, averaging_frequency=3),
    "dense": lambda: DenseTrainingMaster(8, 1),
}


@pytest.mark.parametrize("name", sorted(MASTERS))
def test_state_round_trip_continues_bit_identically(name: str, comm) -> None:  # type: ignore[no-untyped-def]
    master = MASTERS[name]()
    batches = _batches(0, 12)
    model = _model()
    exchange = master.create_exchange(model, comm, job_id=1)
    for step, (x, y) in enumerate(batches[:5]):
        exchange.step(x, y, step)
    exchange.finish()  # as before a checkpoint: weights saved with the model
    state = exchange.get_state()
    for key, value in state.items():
        assert isinstance(value, (np.ndarray, int, float)), (key, type(value))
    if name.startswith("sharing"):
        assert state["compressor.memory.residual"].any()
        assert state["compressor.threshold.tau"] != 1e-2  # it adapted
        assert not state["pending"].any()  # finish() applied it
    if name == "averaging":
        assert state["since_average"] == 0
    weights = model.get_weights()

    other = _model()
    other.set_weights(weights)
    restored = master.create_exchange(other, comm, job_id=1)
    restored.set_state(state)
    for step, (x, y) in enumerate(batches[5:], start=5):
        a, b = exchange.step(x, y, step), restored.step(x, y, step)
        assert a.loss == b.loss and a.extra == {k: b.extra[k] for k in a.extra}
    exchange.finish()
    restored.finish()
    assert weights_checksum(model.trainable_variables) == weights_checksum(
        other.trainable_variables
    )
    again, final = restored.get_state(), exchange.get_state()
    assert set(again) == set(final)
    for key in final:
        assert np.array_equal(np.asarray(again[key]), np.asarray(final[key])), key


def test_sharing_state_between_steps_has_no_pending_sum_and_an_older_one_is_applied(
    comm,
) -> None:  # type: ignore[no-untyped-def]
    """Every decoded sum is applied within its step, so ``pending`` is zeros between steps;
    a checkpoint from before that (a sum still pending) restores onto W + pending."""
    master = MASTERS["sharing-host"]()
    batches = _batches(1, 6)
    model = _model()
    exchange = master.create_exchange(model, comm, job_id=1)
    for step, (x, y) in enumerate(batches[:3]):
        exchange.step(x, y, step)
    state = exchange.get_state()
    assert not state["pending"].any()
    rng = np.random.default_rng(3)
    pending = np.where(rng.random(state["pending"].size) < 0.1, np.float32(1e-3), 0).astype(
        np.float32
    )
    other = _model()
    other.set_weights(model.get_weights())
    restored = master.create_exchange(other, comm, job_id=1)
    restored.set_state({**state, "pending": pending})
    expected = np.concatenate([w.ravel() for w in model.get_weights()]) + pending
    got = np.concatenate([w.ravel() for w in other.get_weights()])
    weights = restored._shared or other.trainable_variables  # fused: the model holds W
    shared = np.concatenate([np.asarray(w).ravel() for w in weights])
    assert np.array_equal(got, expected) and np.array_equal(shared, expected)
    with pytest.raises(ConfigurationError, match="pending"):
        restored.set_state({k: v for k, v in state.items() if k != "pending"})


def test_bad_state_is_one_clear_error(comm) -> None:  # type: ignore[no-untyped-def]
    exchange = MASTERS["sharing-host"]().create_exchange(
        _model(), comm, job_id=1
    )
    state = exchange.get_state()
    with pytest.raises(ConfigurationError, match="keys"):
        exchange.set_state({k: v for k, v in state.items() if k != "optimizer.1"})
    with pytest.raises(ConfigurationError, match="residual"):
        exchange.set_state({**state, "compressor.memory.residual": np.zeros(3, np.float32)})
    averaging = MASTERS["averaging"]().create_exchange(
        _model(), comm, job_id=1
    )
    with pytest.raises(ConfigurationError, match="since_average"):
        averaging.set_state({**averaging.get_state(), "since_average": -1})


# SharedTrainingMaster(compressor=...) -----------------------------------------------------


class ZeroTiny(ResidualPostProcessor):
    """Drop residual elements below tau / 100 (any post-processor works on host and device)."""

    def apply(self, residual: np.ndarray, tau: float, step: int) -> None:
        residual[np.abs(residual) < np.float32(tau) / 100] = 0

    def get_config(self) -> dict:
        return {}


def test_master_takes_a_compressor_config(comm) -> None:  # type: ignore[no-untyped-def]
    config = ThresholdCompressorConfig(FixedThreshold(0.01), ShakeUp(2, 1 / 3), None)
    master = SharedTrainingMaster(8, 1, compressor=config, encoder="host")
    assert master.threshold is config.threshold and master.residual_clipping is None
    again = master_from_config(master.get_config())
    assert again.get_config() == master.get_config()
    exchange = again.create_exchange(_model(), comm, job_id=2)
    assert exchange.compressor.threshold.tau == 0.01
    assert exchange.compressor.post_processor is None
    with pytest.raises(ConfigurationError, match="either compressor"):
        SharedTrainingMaster(compressor=config, threshold=FixedThreshold(1.0))
    with pytest.raises(ConfigurationError, match="CompressorConfig"):
        SharedTrainingMaster(compressor=FixedThreshold(1.0))  # type: ignore[arg-type]
    # a configuration written before compressor configs still loads
    old = {"mode": "sharing", "threshold": {"class_name": "FixedThreshold", "tau": 0.5},
           "shake_up": {"frequency": 2, "factor": 0.5},
           "residual_clipping": {"factor": 1.0, "frequency": 2}, "encoder": "host"}
    legacy = master_from_config(old)
    assert legacy.threshold.tau == 0.5 and legacy.shake_up.frequency == 2


def test_any_post_processor_gives_the_same_training_on_host_and_device(comm) -> None:  # type: ignore[no-untyped-def]
    results = []
    for encoder in ("host", "device"):
        config = ThresholdCompressorConfig(
            AdaptiveThreshold(initial=1e-2, min_sparsity=0.05, max_sparsity=0.2),
            residual_post_processor=ZeroTiny(),
        )
        master = SharedTrainingMaster(8, 1, compressor=config, encoder=encoder)
        model = _model()
        exchange = master.create_exchange(model, comm, job_id=1)
        assert exchange.compressor.memory.on_device == (encoder == "device")
        for step, (x, y) in enumerate(_batches(2, 6)):
            exchange.step(x, y, step)
        exchange.finish()
        results.append(
            (weights_checksum(model.trainable_variables), exchange.compressor.get_residual())
        )
    assert results[0][0] == results[1][0]
    assert np.array_equal(results[0][1].view(np.int32), results[1][1].view(np.int32))


# Averaging: the loss after averaging -------------------------------------------------------


def test_averaging_reports_the_loss_after_averaging_when_asked(comm) -> None:  # type: ignore[no-untyped-def]
    batches = _batches(3, 7)
    quiet = ParameterAveragingTrainingMaster(8, 1, averaging_frequency=3).create_exchange(
        _model(), comm, job_id=1
    )
    assert all(not quiet.step(x, y, s).extra for s, (x, y) in enumerate(batches))
    model = _model()
    master = ParameterAveragingTrainingMaster(
        8, 1, averaging_frequency=3, report_score_after_averaging=True
    )
    assert master_from_config(master.get_config()).report_score_after_averaging
    exchange = master.create_exchange(model, comm, job_id=1)
    reported = []
    for step, (x, y) in enumerate(batches):
        extra = exchange.step(x, y, step).extra
        if (step + 1) % 3:
            assert "loss_after_averaging" not in extra, step
            continue
        expected = model.compute_loss(x=x, y=y, y_pred=model(x, training=False))
        assert extra["loss_after_averaging"] == pytest.approx(float(expected), rel=1e-6)
        reported.append(step)
    assert reported == [2, 5]


# Configuration: the knobs -------------------------------------------------------------------


def test_yaml_knobs_reach_the_master() -> None:
    training = TrainingConfig.model_validate({
        "mode": "sharing",
        "threshold": {"decay": 0.9, "initial": 2e-3, "min_elements": 7},
        "shake_up": {"frequency": 10, "factor": 1 / 3},
    })
    master = master_from_training_config(training)
    assert isinstance(master.threshold, AdaptiveThreshold)
    assert master.threshold.decay == 0.9 and master.threshold.initial == 2e-3
    assert master.threshold.min_elements == 7
    assert TrainingConfig().threshold.min_elements == AdaptiveThreshold().min_elements
    assert master.shake_up.frequency == 10 and master.shake_up.factor == pytest.approx(1 / 3)
    assert TrainingConfig().threshold.initial == AdaptiveThreshold().initial == 1e-3
    assert TrainingConfig().threshold.decay == AdaptiveThreshold().decay
    averaging = master_from_training_config(
        TrainingConfig(mode="averaging", report_score_after_averaging=True)
    )
    assert averaging.report_score_after_averaging
    assert not TrainingConfig().report_score_after_averaging
