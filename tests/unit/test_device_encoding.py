"""DeviceThresholdCompressor: same frames and residuals as the numpy encoder, bit for bit,
and only the encoded message leaves the device."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.device_encoding import record_host_copies
from sparkdl.compression import (
    AdaptiveThreshold,
    FixedThreshold,
    ResidualClipping,
    ShakeUp,
    TargetSparsityThreshold,
    ThresholdAlgorithm,
    ThresholdCompressor,
    unpack_frame,
)
from sparkdl.config import TrainingConfig
from sparkdl.errors import ConfigurationError
from sparkdl.training.exchanges.device_encoding import DeviceThresholdCompressor, variables_on_gpu
from sparkdl.training.masters import (
    SharedTrainingMaster,
    master_from_config,
    master_from_training_config,
)

# Every value is 0 or has magnitude >= 2**-90, so no float32 operation of the encoder
# produces a subnormal (TensorFlow flushes those to zero, numpy does not; see the module
# docstring of sparkdl.training.exchanges.device_encoding).
_TINY = 2.0**-90
_HAS_GPU = bool(tf.config.list_physical_devices("GPU"))


def _pair(
    n: int, make: Callable[[], ThresholdAlgorithm], **kwargs: object
) -> tuple[ThresholdCompressor, DeviceThresholdCompressor]:
    return (
        ThresholdCompressor(n, make(), **kwargs),  # type: ignore[arg-type]
        DeviceThresholdCompressor(n, make(), **kwargs),  # type: ignore[arg-type]
    )


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.int32), b.view(np.int32))


def _check_step(
    host: ThresholdCompressor, dev: DeviceThresholdCompressor, update: np.ndarray, step: int
) -> str:
    frame_h, stats_h = host.compress(update.copy(), step)
    frame_d, stats_d = dev.compress(tf.constant(update), step)
    assert frame_d == frame_h, (step, stats_h, stats_d)
    for field in ("tau", "nnz", "encoding", "bytes_encoded", "shake_up", "sparsity"):
        assert getattr(stats_d, field) == getattr(stats_h, field), field
    assert _same_bits(dev.residual, host.residual), step
    return stats_h.encoding


def _random_update(rng: np.random.Generator, n: int, scale: float, zeros: float) -> np.ndarray:
    """Log-uniform magnitudes over several decades around ``scale``, random signs, some
    exact zeros, some exact multiples of the scale (rounding ties)."""
    magnitude = scale * 10.0 ** rng.uniform(-3, 2, n)
    values = np.where(rng.random(n) < 0.5, -magnitude, magnitude)
    values[rng.random(n) < zeros] = 0.0
    grid = rng.random(n) < 0.1
    values[grid] = scale * rng.integers(-8, 9, int(grid.sum()))
    out = values.astype(np.float32)
    out[(out != 0) & (np.abs(out) < _TINY)] = np.float32(_TINY)
    return out


THRESHOLDS: dict[str, Callable[[float], Callable[[], ThresholdAlgorithm]]] = {
    "fixed": lambda tau: lambda: FixedThreshold(tau),
    "adaptive": lambda tau: (
        lambda: AdaptiveThreshold(initial=tau, min_sparsity=1e-2, max_sparsity=0.2)
    ),
    "target": lambda tau: lambda: TargetSparsityThreshold(sparsity=0.05, initial=tau),
}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(0, 400),
    seed=st.integers(0, 2**32 - 1),
    log_tau=st.floats(-27, 4),
    log_scale=st.floats(-3, 2),
    zeros=st.floats(0, 1),
    algorithm=st.sampled_from(sorted(THRESHOLDS)),
    shake=st.integers(0, 3),
    clip_every=st.integers(0, 3),
    clip_factor=st.sampled_from([0.0, 0.5, 1.0, 2.5, 5.0]),
)
def test_frames_and_residuals_match_host_encoder(
    n: int,
    seed: int,
    log_tau: float,
    log_scale: float,
    zeros: float,
    algorithm: str,
    shake: int,
    clip_every: int,
    clip_factor: float,
) -> None:
    rng = np.random.default_rng(seed)
    tau = max(2.0**log_tau, 2.0**-80)
    host, dev = _pair(
        n,
        THRESHOLDS[algorithm](tau),
        shake_up=ShakeUp(frequency=shake, factor=0.25),
        post_processor=ResidualClipping(factor=clip_factor, frequency=clip_every),
        job_id=7,
        rank=1,
    )
    for step in range(5):
        update = _random_update(rng, n, tau * 10.0**log_scale, zeros)
        _check_step(host, dev, update, step)
    assert host.threshold.get_config() == dev.threshold.get_config()
    assert getattr(host.threshold, "tau", None) == getattr(dev.threshold, "tau", None)


@pytest.mark.parametrize("algorithm", sorted(THRESHOLDS))
def test_long_run_switches_encodings_like_the_host(algorithm: str) -> None:
    rng = np.random.default_rng(1)
    n = 70_000  # more than one 65,536-element chunk of the numpy encoder
    host, dev = _pair(
        n,
        THRESHOLDS[algorithm](1e-2),
        shake_up=ShakeUp(frequency=4, factor=0.1),
        post_processor=ResidualClipping(factor=5.0, frequency=5),
    )
    seen = set()
    for step in range(12):
        scale = 10.0 ** rng.uniform(-4, -1)
        update = (rng.standard_normal(n) * scale).astype(np.float32)
        seen.add(_check_step(host, dev, update, step))
    if algorithm != "target":  # target sparsity 0.05 stays sparse-or-bitmap by design
        assert seen == {"sparse", "bitmap"}


@pytest.mark.parametrize("n", [300_001, 2_500_003])
def test_target_sparsity_samples_the_same_blocks_as_the_host(n: int) -> None:
    """Vectors large enough that the sample is blocks, not the whole vector (32 of every 128
    elements at 300,001; 32 of every 1,216 at 2,500,003): the same tau, frames and residual."""
    rng = np.random.default_rng(n)
    host, dev = _pair(n, lambda: TargetSparsityThreshold(sparsity=1e-3, initial=1e-2))
    plan = host.threshold.sample_plan(n, 0)
    assert plan.blocks > 1 and plan.blocks * plan.width < n
    for step in range(3):
        update = (rng.standard_normal(n) * rng.choice([1e-3, 1e-1], n)).astype(np.float32)
        _check_step(host, dev, update, step)
    assert host.threshold.tau == dev.threshold.tau


@pytest.mark.parametrize("count", [4, 5])
def test_encoding_switch_point_counts_candidates(count: int) -> None:
    # n = 64: the bitmap is 16 bytes, so up to 4 sparse entries (16 bytes) stay sparse.
    n = 64
    host, dev = _pair(n, lambda: FixedThreshold(2.0**-24))
    update = np.zeros(n, np.float32)
    update[:count] = np.float32(1.0) + np.float32(2.0**-23)  # odd mantissa: inexact, skipped
    update[10] = np.float32(-1.0)  # exact: encoded
    expected = "bitmap" if count + 1 > 4 else "sparse"
    assert _check_step(host, dev, update, 0) == expected
    zeros = np.zeros(n, np.float32)
    assert _check_step(host, dev, zeros, 1) == expected
    _, stats = dev.compress(tf.constant(zeros), 2)
    assert stats.nnz == 1  # only the exact element; the switch counted candidates
    assert stats.encoding == expected


def test_zero_length_all_pass_and_special_values() -> None:
    host, dev = _pair(0, lambda: FixedThreshold(0.5))
    for step in range(3):
        assert _check_step(host, dev, np.zeros(0, np.float32), step) == "sparse"
    for n in (1, 3, 4, 5, 17, 1000):
        host, dev = _pair(n, lambda: FixedThreshold(0.5), post_processor=ResidualClipping(2.0, 2))
        rng = np.random.default_rng(n)
        everything = (rng.choice([-1, 1], n) * rng.uniform(0.5, 3, n)).astype(np.float32)
        assert _check_step(host, dev, everything, 0) == "bitmap"  # 4n > ceil(n / 4) bytes
        special = np.zeros(n, np.float32)
        special[0] = np.inf
        special[-1] = -np.inf if n > 1 else np.inf
        special[n // 2] = -0.0 if n > 2 else special[n // 2]
        for step in range(1, 4):
            _check_step(host, dev, special, step)
    host, dev = _pair(8, lambda: FixedThreshold(0.5))
    nan = np.array([np.nan, 1.0, -np.nan, -1.0, 0.0, -0.0, 0.25, 2.0], np.float32)
    _check_step(host, dev, nan, 0)


def test_residual_get_set_round_trip() -> None:
    rng = np.random.default_rng(3)
    n = 1000
    host, dev = _pair(n, lambda: AdaptiveThreshold(initial=1e-2))
    start = (rng.standard_normal(n) * 1e-2).astype(np.float32)
    host.residual = start.copy()
    dev.residual = start.copy()
    assert _same_bits(dev.get_residual(), start)
    for step in range(3):
        _check_step(host, dev, (rng.standard_normal(n) * 1e-2).astype(np.float32), step)
    with pytest.raises(ConfigurationError):
        dev.set_residual(np.zeros(n + 1, np.float32))
    with pytest.raises(ConfigurationError):
        dev.compress(tf.zeros([n + 1]), 9)
    assert isinstance(dev.variable, tf.Variable)


def test_decompress_sum_matches_host() -> None:
    rng = np.random.default_rng(4)
    n, world = 5000, 3
    pairs = [_pair(n, lambda: FixedThreshold(0.05), job_id=1, rank=r) for r in range(world)]
    for step in range(3):
        updates = [
            (rng.standard_normal(n) * 0.03 * (r + 1)).astype(np.float32) for r in range(world)
        ]
        frames_h = [p[0].compress(u, step)[0] for p, u in zip(pairs, updates)]
        frames_d = [p[1].compress(tf.constant(u), step)[0] for p, u in zip(pairs, updates)]
        assert frames_h == frames_d
        total_h = pairs[0][0].decompress_sum(frames_h, step)
        total_d = pairs[2][1].decompress_sum(frames_d, step)
        assert _same_bits(total_h, total_d)
        assert unpack_frame(frames_d[1], job_id=1, num_elements=n)[0].rank == 1


# Only the message crosses to the host -------------------------------------------------------


@pytest.mark.parametrize("algorithm", sorted(THRESHOLDS))
def test_compress_copies_only_the_message_to_the_host(algorithm: str) -> None:
    n = 200_000
    dev = DeviceThresholdCompressor(
        n,
        THRESHOLDS[algorithm](0.05)(),
        shake_up=ShakeUp(frequency=2),
        post_processor=ResidualClipping(frequency=3),
    )
    rng = np.random.default_rng(5)
    seen = set()
    for step, scale in enumerate([1e-3, 1e-2, 0.2, 1e-2]):
        update = tf.constant((rng.standard_normal(n) * scale).astype(np.float32))
        with record_host_copies() as sizes:
            frame, stats = dev.compress(update, step)
        seen.add(stats.encoding)
        payload = len(frame) - 44
        assert sum(sizes) <= payload + 64, (stats, sizes)
        assert max(sizes) < n  # never the update (4n bytes) or anything of its size
    assert seen == {"sparse", "bitmap"}  # both message kinds were checked


# Training ----------------------------------------------------------------------------------


def _model(seed: int = 0):  # type: ignore[no-untyped-def]
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def _train(encoder: str, steps: int = 8):  # type: ignore[no-untyped-def]
    from sparkdl.comm import create_communicator
    from sparkdl.training.exchanges.variables import weights_checksum

    model = _model()
    comm = create_communicator("tcp", 0, 1, lambda s: [s], secret=b"x" * 32, timeout_s=10)
    try:
        master = SharedTrainingMaster(
            8,
            1,
            threshold=AdaptiveThreshold(initial=1e-3, min_sparsity=0.05, max_sparsity=0.3),
            shake_up=ShakeUp(frequency=3, factor=0.2),
            residual_clipping=ResidualClipping(factor=2.0, frequency=4),
            encoder=encoder,
        )
        exchange = master.create_exchange(model, comm, job_id=3)
        rng = np.random.default_rng(0)
        host_copies: list[int] = []
        for step in range(steps):
            x = rng.standard_normal((8, 8)).astype(np.float32)
            y = rng.integers(0, 3, 8).astype(np.int64)
            with record_host_copies() as sizes:
                exchange.step(x, y, step)
            host_copies.append(sum(sizes))  # bytes copied to the host in this step
        exchange.finish()
        residual = np.asarray(exchange.compressor.residual).copy()
        return (
            type(exchange.compressor),
            weights_checksum(model.trainable_variables),
            residual,
            max(host_copies),
            exchange.trainable.size,
        )
    finally:
        comm.close()


def test_training_with_device_encoder_matches_host_bitwise() -> None:
    kind_h, weights_h, residual_h, copied_h, n = _train("host")
    kind_d, weights_d, residual_d, copied_d, _ = _train("device")
    kind_a, weights_a, *_ = _train("auto")
    assert kind_h is ThresholdCompressor and kind_d is DeviceThresholdCompressor
    # auto: the device encoder exactly when the model sits on a GPU
    assert kind_a is (DeviceThresholdCompressor if _HAS_GPU else ThresholdCompressor)
    assert weights_d == weights_h == weights_a
    assert _same_bits(residual_d, residual_h)
    # the host path takes the update as zero-copy views; the device path copies only messages
    assert copied_h < 4 * n and copied_d < 4 * n


# Configuration -----------------------------------------------------------------------------


def test_master_encoder_config_round_trip() -> None:
    for encoder in ("auto", "host", "device"):
        master = SharedTrainingMaster(encoder=encoder)
        config = master.get_config()
        assert config["encoder"] == encoder
        again = master_from_config(config)
        assert isinstance(again, SharedTrainingMaster) and again.encoder == encoder
    assert SharedTrainingMaster().encoder == "auto"
    with pytest.raises(ConfigurationError):
        SharedTrainingMaster(encoder="gpu")
    training = TrainingConfig(mode="sharing", encoder="device")
    assert master_from_training_config(training).encoder == "device"  # type: ignore[attr-defined]
    assert TrainingConfig().encoder == "auto"


def test_variables_on_gpu_reads_keras_and_tf_variables() -> None:
    assert variables_on_gpu(_model().trainable_variables) == _HAS_GPU
    assert variables_on_gpu([tf.Variable([1.0])]) == _HAS_GPU
    assert not variables_on_gpu([])
    with tf.device("/CPU:0"):
        assert not variables_on_gpu([tf.Variable([1.0])])
