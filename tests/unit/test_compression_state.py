"""Explicit state of the compression pieces (GRACE's split): threshold algorithms, memories,
compressors; residual post-processors; compressor configs that travel as plain data."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pytest

from sparkdl.compression import (
    DEFAULT_TAU,
    AdaptiveThreshold,
    CompressorConfig,
    FixedThreshold,
    HostMemory,
    ResidualClipping,
    ResidualPostProcessor,
    ShakeUp,
    TargetSparsityThreshold,
    ThresholdCompressor,
    ThresholdCompressorConfig,
    compressor_from_config,
    compressor_to_config,
    register_compressor,
)
from sparkdl.errors import ConfigurationError


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.int32), b.view(np.int32))


def test_one_default_initial_tau() -> None:
    assert DEFAULT_TAU == 1e-3
    assert AdaptiveThreshold().initial == AdaptiveThreshold().tau == 1e-3
    assert TargetSparsityThreshold().initial == TargetSparsityThreshold().tau == 1e-3


@pytest.mark.parametrize(
    "make",
    [
        lambda: AdaptiveThreshold(initial=1e-2, min_sparsity=0.05, max_sparsity=0.1),
        lambda: TargetSparsityThreshold(sparsity=0.02, initial=1e-2),
        lambda: FixedThreshold(0.01),
    ],
)
def test_threshold_state_round_trip_continues_identically(make) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    a, b = make(), make()
    for step in range(6):
        residual = (rng.standard_normal(5000) * 1e-2).astype(np.float32)
        a.select(residual, step)
        a.observe(int(rng.integers(0, 5000)), 5000)
    state = a.get_state()
    assert all(isinstance(v, (int, float)) for v in state.values())
    json.dumps(state)  # plain numbers
    if not isinstance(a, FixedThreshold):
        assert state["tau"] != b.tau  # it moved
    b.set_state(state)
    assert b.get_state() == state or math.isnan(state.get("last_sparsity", 0.0))
    for step in range(6, 12):
        residual = (rng.standard_normal(5000) * 1e-2).astype(np.float32)
        assert a.select(residual, step) == b.select(residual, step)
        nnz = int(rng.integers(0, 5000))
        a.observe(nnz, 5000)
        b.observe(nnz, 5000)


def test_adaptive_state_before_any_step() -> None:
    algo = AdaptiveThreshold()
    state = algo.get_state()
    assert state["tau"] == 1e-3 and math.isnan(state["last_sparsity"])
    other = AdaptiveThreshold(initial=0.5)
    other.set_state(state)
    assert other.tau == 1e-3 and other.last_sparsity is None


@pytest.mark.parametrize(
    ("algo", "state", "match"),
    [
        (AdaptiveThreshold(), {"tau": 1e-3}, "keys"),
        (AdaptiveThreshold(), {"tau": -1.0, "last_sparsity": 0.1}, "tau"),
        (TargetSparsityThreshold(), {"tau": 1e-3, "extra": 1}, "keys"),
        (TargetSparsityThreshold(), {"tau": "big"}, "tau"),
        (FixedThreshold(1.0), {"tau": 2.0}, "keys"),
        (FixedThreshold(1.0), [1.0], "dict"),
    ],
)
def test_bad_threshold_state_is_one_clear_error(algo, state, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigurationError, match=match):
        algo.set_state(state)


def test_host_memory_state() -> None:
    memory = HostMemory(4)
    assert memory.get_state()["residual"].tolist() == [0.0] * 4
    memory.set_state({"residual": np.arange(4, dtype=np.float32)})
    state = memory.get_state()
    state["residual"][0] = 9  # a copy
    assert memory.residual.tolist() == [0.0, 1.0, 2.0, 3.0]
    for bad in ({"residual": np.zeros(5, np.float32)}, {"residual": np.zeros(4)}, {}):
        with pytest.raises(ConfigurationError):
            memory.set_state(bad)


def _compressor(rank: int = 0) -> ThresholdCompressor:
    return ThresholdCompressor(
        20_000,
        AdaptiveThreshold(initial=1e-2, min_sparsity=1e-3, max_sparsity=1e-2),
        shake_up=ShakeUp(frequency=3, factor=0.25),
        post_processor=ResidualClipping(factor=3.0, frequency=4),
        job_id=5,
        rank=rank,
    )


def test_compressor_state_restores_residual_and_threshold_exactly() -> None:
    rng = np.random.default_rng(1)
    a, b = _compressor(), _compressor()
    for step in range(7):
        a.compress((rng.standard_normal(20_000) * 3e-3).astype(np.float32), step)
    state = a.get_state()
    assert set(state) == {"memory.residual", "threshold.tau", "threshold.last_sparsity"}
    assert state["threshold.tau"] != 1e-2
    b.set_state(state)
    for step in range(7, 15):
        update = (rng.standard_normal(20_000) * 3e-3).astype(np.float32)
        assert a.compress(update.copy(), step)[0] == b.compress(update.copy(), step)[0]
        assert _same_bits(a.residual, b.residual)
    with pytest.raises(ConfigurationError, match="unknown keys"):
        b.set_state({**state, "residual": state["memory.residual"]})


class HalveSmall(ResidualPostProcessor):
    """A second post-processor: halve residual elements below ``tau / 2`` in magnitude."""

    def apply(self, residual: np.ndarray, tau: float, step: int) -> None:
        small = np.abs(residual) < np.float32(tau) / 2
        residual[small] *= np.float32(0.5)

    def get_config(self) -> dict:
        return {}


def test_residual_post_processor_is_an_interface() -> None:
    assert isinstance(ResidualClipping(), ResidualPostProcessor)
    residual = np.array([10.0, -10.0, 0.5, 3.0], np.float32)
    ResidualClipping(factor=2.0, frequency=2).apply(residual, 1.0, step=1)  # not due
    assert residual.tolist() == [10.0, -10.0, 0.5, 3.0]
    ResidualClipping(factor=2.0, frequency=2).apply(residual, 1.0, step=2)
    assert residual.tolist() == [2.0, -2.0, 0.5, 2.0]
    comp = ThresholdCompressor(4, FixedThreshold(1.0), post_processor=HalveSmall())
    comp.compress(np.array([0.25, 0.75, -0.25, 1.5], np.float32), 0)
    assert comp.residual.tolist() == [0.125, 0.75, -0.125, 0.5]
    with pytest.raises(ConfigurationError, match="post_processor"):
        ThresholdCompressor(4, FixedThreshold(1.0), post_processor=object())  # type: ignore[arg-type]


def test_threshold_compressor_config_round_trips_as_plain_data() -> None:
    config = ThresholdCompressorConfig(
        TargetSparsityThreshold(sparsity=0.01), ShakeUp(4, 1 / 3), ResidualClipping(2.0, 3)
    )
    data = json.loads(json.dumps(compressor_to_config(config)))
    again = compressor_from_config(data)
    assert isinstance(again, ThresholdCompressorConfig)
    assert again.get_config() == config.get_config()
    assert compressor_from_config(compressor_to_config(ThresholdCompressorConfig(
        residual_post_processor=None))).residual_post_processor is None
    default = ThresholdCompressorConfig()
    assert isinstance(default.threshold, AdaptiveThreshold) and default.threshold.tau == 1e-3
    assert default.residual_post_processor == ResidualClipping()
    # every worker gets its own threshold state
    one, two = default.build(10, job_id=1, rank=0), default.build(10, job_id=1, rank=1)
    assert one.threshold is not two.threshold and one.rank == 0 and two.rank == 1
    for bad in ({"class_name": "Nope"}, {"config": {}}, {"class_name": "ThresholdCompressorConfig",
                                                        "config": {"tau": 1}}):
        with pytest.raises(ConfigurationError):
            compressor_from_config(bad)


@register_compressor
@dataclass(repr=False)
class SignCompressorConfig(CompressorConfig):
    """A new compressor in one class: every element is sent as ±tau (fixed tau) whenever its
    residual is non-zero, i.e. a threshold compressor at the smallest tau."""

    tau: float = 0.5

    def build(self, num_elements: int, *, job_id: int, rank: int) -> ThresholdCompressor:
        return ThresholdCompressor(num_elements, FixedThreshold(self.tau), job_id=job_id,
                                   rank=rank)

    def get_config(self) -> dict:
        return {"tau": self.tau}


def test_a_registered_compressor_config_round_trips() -> None:
    data = compressor_to_config(SignCompressorConfig(0.25))
    assert data["module"] == __name__
    again = compressor_from_config(json.loads(json.dumps(data)))
    assert isinstance(again, SignCompressorConfig) and again.tau == 0.25

    class Unregistered(SignCompressorConfig):
        pass

    with pytest.raises(ConfigurationError, match="register_compressor"):
        compressor_to_config(Unregistered())
