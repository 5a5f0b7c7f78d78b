"""Small models (issue 19.5): ``training.mode: auto`` resolves to dense for a small update, and
the adaptive and target-sparsity thresholds send at least ``min_elements`` elements a step."""

from __future__ import annotations

import numpy as np
import pytest

from sparkdl.compression.threshold import (
    DEFAULT_MIN_ELEMENTS,
    AdaptiveThreshold,
    TargetSparsityThreshold,
    threshold_from_config,
    threshold_to_config,
)
from sparkdl.config import JobConfig, TrainingConfig, load_config
from sparkdl.errors import ConfigurationError
from sparkdl.training.masters import (
    AUTO_DENSE_MAX_PARAMETERS,
    DenseTrainingMaster,
    ParameterAveragingTrainingMaster,
    SharedTrainingMaster,
    master_from_training_config,
    num_trainable_parameters,
    resolve_mode,
)


def _dense_model(inputs: int, units: int):  # type: ignore[no-untyped-def]
    import keras

    return keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(units)])


def test_adaptive_tau_does_not_grow_while_at_most_min_elements_pass() -> None:
    n = 131  # the iris MLP: 1 % of it is one element
    starving = AdaptiveThreshold(min_elements=0)
    floored = AdaptiveThreshold()
    assert floored.min_elements == DEFAULT_MIN_ELEMENTS == 32
    tau = floored.threshold(0)
    for algo in (starving, floored):
        algo.observe(DEFAULT_MIN_ELEMENTS, n)  # 24 % sent: far above max_sparsity (1 %)
    assert starving.threshold(1) > tau
    assert floored.threshold(1) == tau
    floored.observe(DEFAULT_MIN_ELEMENTS + 1, n)  # above the floor: the band rules again
    assert floored.threshold(2) > tau


def test_the_floor_is_at_most_half_the_vector() -> None:
    algo = AdaptiveThreshold(min_elements=1000)
    tau = algo.threshold(0)
    algo.observe(5, 10)
    assert algo.threshold(1) == tau
    algo.observe(6, 10)  # more than half of 10: tau still has to select
    assert algo.threshold(2) > tau


def test_the_floor_changes_nothing_on_a_large_vector() -> None:
    plain, floored = AdaptiveThreshold(min_elements=0), AdaptiveThreshold()
    for nnz in (0, 10, 5_000, 50_000, 0, 20_000):
        plain.observe(nnz, 1_000_000)
        floored.observe(nnz, 1_000_000)
        assert plain.threshold(0) == floored.threshold(0)


@pytest.mark.parametrize(("min_elements", "expected"), [(0, 1), (32, 32), (1000, 65)])
def test_target_sparsity_sends_at_least_min_elements(min_elements: int, expected: int) -> None:
    residual = np.random.default_rng(3).standard_normal(131).astype(np.float32)
    algo = TargetSparsityThreshold(sparsity=1e-3, min_elements=min_elements)
    tau = algo.select(residual, step=0)
    assert np.count_nonzero(np.abs(residual) >= np.float32(tau)) == expected


@pytest.mark.parametrize("cls", [AdaptiveThreshold, TargetSparsityThreshold])
def test_min_elements_round_trips_and_is_checked(cls: type) -> None:
    algo = cls(min_elements=7)
    assert threshold_from_config(threshold_to_config(algo)).min_elements == 7
    for bad in (-1, 2.5, True, "8"):
        with pytest.raises(ConfigurationError, match=f"min_elements must be .*{bad!r}"):
            cls(min_elements=bad)


def test_auto_is_dense_up_to_the_crossover_and_sharing_above() -> None:
    assert resolve_mode("auto", 131) == "dense"
    assert resolve_mode("auto", AUTO_DENSE_MAX_PARAMETERS) == "dense"
    assert resolve_mode("auto", AUTO_DENSE_MAX_PARAMETERS + 1) == "sharing"
    for mode in ("sharing", "averaging", "dense"):
        assert resolve_mode(mode, 131) == mode


def test_auto_master_follows_the_models_trainable_parameters() -> None:
    training = TrainingConfig(threshold={"min_elements": 5}, overlap=True)
    assert training.mode == "auto" == JobConfig().training.mode
    small = _dense_model(4, 3)  # 15 parameters
    assert num_trainable_parameters(small) == 15
    dense = master_from_training_config(training, small)
    assert isinstance(dense, DenseTrainingMaster) and dense.overlap is True
    large = _dense_model(256, 256)  # 65,792 parameters: just above the crossover
    assert num_trainable_parameters(large) == AUTO_DENSE_MAX_PARAMETERS + 256
    sharing = master_from_training_config(training, large)
    assert isinstance(sharing, SharedTrainingMaster) and sharing.overlap is True
    assert sharing.threshold.min_elements == 5  # type: ignore[union-attr]
    named = TrainingConfig(mode="averaging")
    assert isinstance(master_from_training_config(named, small),
                      ParameterAveragingTrainingMaster)


def test_auto_without_a_model_is_one_clear_error() -> None:
    with pytest.raises(ConfigurationError, match=r"training\.mode 'auto'.*pass model="):
        master_from_training_config(TrainingConfig())


def test_min_elements_in_yaml_is_checked(tmp_path) -> None:  # type: ignore[no-untyped-def]
    conf = tmp_path / "job.yaml"
    conf.write_text("training:\n  threshold:\n    min_elements: -3\n")
    with pytest.raises(ConfigurationError, match=r"training\.threshold\.min_elements.*-3"):
        load_config(conf)
    ok = load_config(conf, ["training.threshold.min_elements=0"])
    assert ok.training.threshold.min_elements == 0
