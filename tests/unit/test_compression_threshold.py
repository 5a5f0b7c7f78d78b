"""Threshold algorithms, shake-up / clipping schedules, configs and parameter validation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from sparkdl.compression.threshold import (
    MAX_TAU,
    MIN_TAU,
    AdaptiveThreshold,
    FixedThreshold,
    ResidualClipping,
    ShakeUp,
    TargetSparsityThreshold,
    threshold_from_config,
    threshold_to_config,
)
from sparkdl.errors import ConfigurationError


def test_fixed() -> None:
    algo = FixedThreshold(0.5)
    algo.observe(10, 10)
    assert algo.threshold(0) == algo.threshold(99) == 0.5


def test_adaptive_moves_tau_in_the_right_direction() -> None:
    algo = AdaptiveThreshold(initial=1e-3, min_sparsity=1e-4, max_sparsity=1e-2)
    n = 1_000_000
    tau = algo.threshold(0)
    algo.observe(10, n)  # 1e-5: too few sent -> smaller tau
    assert algo.threshold(1) < tau
    assert math.isclose(algo.threshold(1), tau * 0.5 ** (1 / 20))
    tau = algo.threshold(1)
    algo.observe(50_000, n)  # 5e-2: too many sent -> larger tau
    assert algo.threshold(2) > tau
    assert math.isclose(algo.threshold(2), tau / 0.5 ** (1 / 20))
    tau = algo.threshold(2)
    algo.observe(1_000, n)  # 1e-3: inside the band -> unchanged
    assert algo.threshold(3) == tau
    for _ in range(20):  # 20 steps of "too few" halve tau
        algo.observe(0, n)
    assert math.isclose(algo.threshold(4), tau / 2)
    algo.observe(0, 0)  # empty vector: no information
    assert math.isclose(algo.threshold(5), tau / 2)


def test_adaptive_is_clamped() -> None:
    algo = AdaptiveThreshold(initial=1e-11, decay=0.01)
    for _ in range(10):
        algo.observe(0, 100)
    assert algo.threshold(0) == MIN_TAU
    algo = AdaptiveThreshold(initial=1e5, decay=0.01)
    for _ in range(10):
        algo.observe(100, 100)
    assert algo.threshold(0) == MAX_TAU


@pytest.mark.parametrize("sparsity", [1e-3, 1e-2, 0.1])
def test_target_sparsity_roughly_hits_its_target(sparsity: float) -> None:
    rng = np.random.default_rng(1)
    n = 1_000_000
    residual = (rng.standard_normal(n) * rng.choice([1e-4, 1.0, 30.0], n)).astype(np.float32)
    algo = TargetSparsityThreshold(sparsity=sparsity)
    assert algo.uses_residual
    tau = algo.select(residual, step=3)
    passing = np.count_nonzero(np.abs(residual) >= np.float32(tau)) / n
    assert sparsity / 1.5 < passing < sparsity * 1.5
    assert algo.threshold(4) == tau


def test_target_sparsity_small_and_zero_vectors() -> None:
    algo = TargetSparsityThreshold(sparsity=0.5, initial=0.25)
    assert algo.select(np.zeros(0, np.float32), 0) == 0.25
    assert algo.select(np.zeros(100, np.float32), 0) == 0.25  # keeps the previous tau
    tau = algo.select(np.arange(1, 11, dtype=np.float32), 1)
    assert np.count_nonzero(np.arange(1, 11) >= tau) == 5


def test_sample_quantile_is_the_full_partition_bit_for_bit() -> None:
    """The narrowed-down quantile equals ``np.partition`` on the whole sample in every case."""
    from sparkdl.compression.threshold import _largest

    rng = np.random.default_rng(11)
    for case in range(400):
        size = int(rng.choice([1, 100, (1 << 14) - 1, 1 << 14, 70_001, 200_000]))
        kind = case % 9
        if kind == 0:
            sample = rng.normal(0, 1e-3, size)
        elif kind == 1:  # many ties, zeros
            sample = rng.integers(0, 4, size) * 0.5
        elif kind == 2:  # all equal
            sample = np.full(size, 0.125)
        elif kind == 3:  # mostly zero
            sample = np.where(rng.random(size) < 0.999, 0.0, rng.random(size))
        elif kind == 4:  # NaNs (sorted as largest by np.partition)
            sample = rng.random(size)
            sample[rng.integers(0, size, int(rng.integers(1, 200)))] = np.nan
        elif kind == 5:  # heavy tail: the top is far above the subsample's bound
            sample = rng.standard_cauchy(size)
        elif kind == 6:  # a few huge values
            sample = rng.random(size)
            sample[rng.integers(0, size, 50)] = 1e30
        elif kind == 7:  # ties exactly at the top
            sample = np.where(rng.random(size) < 0.01, 2.0, rng.random(size))
        else:  # the subsample holds only the largest: too few kept, the full partition
            sample = rng.random(size)
            sample[::16] += 10.0
        sample = np.abs(sample.astype(np.float32))
        for passing in {1, 2, 7, size // 1000, size // 128, size // 2, size}:
            if not 1 <= passing <= size:
                continue
            kth = size - passing
            expected = np.partition(sample.copy(), kth)[kth]
            got = _largest(sample.copy(), passing)
            assert got.dtype == np.float32
            assert got.tobytes() == expected.tobytes(), (case, size, passing)


def test_shake_up_schedule() -> None:
    assert [s for s in range(13) if ShakeUp(frequency=4).due(s)] == [4, 8, 12]
    assert not any(ShakeUp().due(s) for s in range(100))


def test_clipping_schedule() -> None:
    assert [s for s in range(12) if ResidualClipping().due(s)] == [5, 10]
    assert not any(ResidualClipping(factor=0.0).due(s) for s in range(20))
    assert not any(ResidualClipping(frequency=0).due(s) for s in range(20))


@pytest.mark.parametrize(
    "obj",
    [
        FixedThreshold(0.125),
        AdaptiveThreshold(initial=2e-3, min_sparsity=1e-3, max_sparsity=0.1, decay=0.9),
        TargetSparsityThreshold(sparsity=0.02, initial=1e-2),
        ShakeUp(frequency=3, factor=0.5),
        ResidualClipping(factor=2.0, frequency=7),
    ],
)
def test_config_round_trip(obj: object) -> None:
    config = threshold_to_config(obj)  # type: ignore[arg-type]
    assert config["class_name"] == type(obj).__name__
    restored = threshold_from_config(json.loads(json.dumps(config)))
    assert type(restored) is type(obj)
    assert restored.get_config() == obj.get_config()  # type: ignore[attr-defined]
    assert type(obj).from_config(obj.get_config()).get_config() == obj.get_config()  # type: ignore[attr-defined]
    flat = {"class_name": config["class_name"], **config["config"]}
    assert threshold_from_config(flat).get_config() == obj.get_config()  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"class_name": "Nope"},
        {"class_name": 3},
        {"class_name": "FixedThreshold", "config": {"tau": 1.0, "extra": 1}},
        {"class_name": "FixedThreshold", "config": [1.0]},
        {"class_name": "FixedThreshold"},
        "FixedThreshold",
    ],
)
def test_bad_configs(config: object) -> None:
    with pytest.raises(ConfigurationError):
        threshold_from_config(config)  # type: ignore[arg-type]


BAD = [float("nan"), float("inf"), -1.0, 0.0, "0.1", None, True]


@pytest.mark.parametrize(
    ("factory", "name", "values"),
    [
        (lambda v: FixedThreshold(v), "tau", [*BAD, 1e39, 1e-50]),
        (lambda v: AdaptiveThreshold(initial=v), "initial", BAD),
        (lambda v: AdaptiveThreshold(min_sparsity=v), "min_sparsity", [*BAD, 1.5]),
        (lambda v: AdaptiveThreshold(max_sparsity=v), "max_sparsity", [*BAD, 2.0, 1e-5]),
        (lambda v: AdaptiveThreshold(decay=v), "decay", [*BAD, 1.0, 1.5]),
        (lambda v: TargetSparsityThreshold(sparsity=v), "sparsity", [*BAD, 1.01]),
        (lambda v: TargetSparsityThreshold(initial=v), "initial", BAD),
        (lambda v: ShakeUp(frequency=v), "frequency", [-1, 1.5, "2", None, True]),
        (lambda v: ShakeUp(factor=v), "factor", [*BAD, 1.5]),
        (lambda v: ResidualClipping(factor=v), "factor", [float("nan"), -1.0, "5", None]),
        (lambda v: ResidualClipping(frequency=v), "frequency", [-1, 2.5, None]),
    ],
)
def test_bad_parameters_name_parameter_and_value(factory, name: str, values: list) -> None:  # type: ignore[no-untyped-def]
    for value in values:
        with pytest.raises(ConfigurationError) as info:
            factory(value)
        message = str(info.value)
        assert name in message, message
        assert repr(value) in message or "max_sparsity" in message, message
