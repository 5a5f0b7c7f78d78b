"""The one-line ``fit:`` summary names the mode and only the settings a user changed."""

from __future__ import annotations

from sparkdl.compression import AdaptiveThreshold
from sparkdl.compression.powersgd import PowerSGDCompressorConfig
from sparkdl.training.masters import (
    DenseTrainingMaster,
    ParameterAveragingTrainingMaster,
    SharedTrainingMaster,
)


def test_default_masters_are_their_mode_alone():
    assert SharedTrainingMaster().describe() == "sharing"
    assert DenseTrainingMaster(64, 8).describe() == "dense"  # workers and batch are said apart
    assert ParameterAveragingTrainingMaster().describe() == "averaging"


def test_changed_settings_are_named_with_their_values():
    assert (ParameterAveragingTrainingMaster(averaging_frequency=10, seed=1).describe()
            == "averaging (seed=1, averaging_frequency=10)")
    assert SharedTrainingMaster(overlap=True).describe() == "sharing (overlap=True)"


def test_a_compressor_is_its_short_name_and_changed_parameters():
    powersgd = SharedTrainingMaster(compressor=PowerSGDCompressorConfig(rank=8))
    assert powersgd.describe() == "sharing (compressor=PowerSGD(rank=8))"
    default_rank = SharedTrainingMaster(compressor=PowerSGDCompressorConfig())
    assert default_rank.describe() == "sharing (compressor=PowerSGD())"
    threshold = SharedTrainingMaster(threshold=AdaptiveThreshold(initial=4e-3))
    described = threshold.describe()
    assert described == ("sharing (compressor=Threshold(threshold="
                         "AdaptiveThreshold(initial=0.004)))"), described
    assert len(described) < 120 and len(repr(threshold)) > 300  # what the log showed before
