"""Training masters: which exchange algorithm the workers run, and its settings.

They mirror the seeds' ``SharedTrainingMaster`` and ``ParameterAveragingTrainingMaster``; a
``DenseTrainingMaster`` is the allreduce baseline both are measured against. Masters are
plain configuration: they round-trip through ``get_config``/``from_config`` and build their
per-worker exchange only inside a worker (where TensorFlow is imported).
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, ClassVar

from sparkdl.compression.threshold import (
    AdaptiveThreshold,
    FixedThreshold,
    ResidualClipping,
    ShakeUp,
    TargetSparsityThreshold,
    ThresholdAlgorithm,
    threshold_from_config,
    threshold_to_config,
)
from sparkdl.errors import ConfigurationError

if TYPE_CHECKING:
    from sparkdl.comm.communicator import Communicator
    from sparkdl.config import TrainingConfig
    from sparkdl.training.exchange import UpdateExchange


#: Where :class:`SharedTrainingMaster` encodes updates: ``"host"`` (numpy), ``"device"``
#: (TensorFlow, on the model's device) or ``"auto"`` (device when the model is on a GPU).
ENCODERS = ("auto", "host", "device")


class TrainingMaster(abc.ABC):
    """Common settings: workers, per-worker batch size, seed."""

    mode: ClassVar[str]

    def __init__(self, batch_size_per_worker: int = 32, num_workers: int = 2, *, seed: int = 42):
        _check_positive("batch_size_per_worker", batch_size_per_worker)
        _check_positive("num_workers", num_workers)
        self.batch_size_per_worker = int(batch_size_per_worker)
        self.num_workers = int(num_workers)
        self.seed = int(seed)

    def get_config(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "batch_size_per_worker": self.batch_size_per_worker,
            "num_workers": self.num_workers,
            "seed": self.seed,
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> TrainingMaster:
        config = dict(config)
        config.pop("mode", None)
        return cls(**config)

    @abc.abstractmethod
    def create_exchange(
        self, model: Any, comm: Communicator, *, job_id: int, classification: bool
    ) -> UpdateExchange:
        """Build this master's per-worker exchange (runs inside a worker)."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items() if k != "mode")
        return f"{type(self).__name__}({args})"


class SharedTrainingMaster(TrainingMaster):
    """Threshold-compressed gradient sharing (Strom 2015), as in DL4J's SharedTrainingMaster."""

    mode = "sharing"

    def __init__(
        self,
        batch_size_per_worker: int = 32,
        num_workers: int = 2,
        *,
        threshold: ThresholdAlgorithm | None = None,
        shake_up: ShakeUp | None = None,
        residual_clipping: ResidualClipping | None = None,
        encoder: str = "auto",
        seed: int = 42,
    ) -> None:
        super().__init__(batch_size_per_worker, num_workers, seed=seed)
        if encoder not in ENCODERS:
            raise ConfigurationError(f"encoder must be one of {ENCODERS}, got {encoder!r}")
        self.encoder = encoder
        self.threshold = threshold if threshold is not None else AdaptiveThreshold()
        self.shake_up = shake_up if shake_up is not None else ShakeUp()
        self.residual_clipping = (
            residual_clipping if residual_clipping is not None else ResidualClipping()
        )

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "threshold": threshold_to_config(self.threshold),
            "shake_up": {"frequency": self.shake_up.frequency, "factor": self.shake_up.factor},
            "residual_clipping": {
                "factor": self.residual_clipping.factor,
                "frequency": self.residual_clipping.frequency,
            },
            "encoder": self.encoder,
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> SharedTrainingMaster:
        config = dict(config)
        config.pop("mode", None)
        if isinstance(config.get("threshold"), dict):
            config["threshold"] = threshold_from_config(config["threshold"])
        if isinstance(config.get("shake_up"), dict):
            config["shake_up"] = ShakeUp(**config["shake_up"])
        if isinstance(config.get("residual_clipping"), dict):
            config["residual_clipping"] = ResidualClipping(**config["residual_clipping"])
        return cls(**config)

    def create_exchange(self, model, comm, *, job_id, classification):
        import copy

        from sparkdl.compression.compressor import ThresholdCompressor
        from sparkdl.training.device_encoding import (
            DeviceThresholdCompressor,
            variable_device,
            variables_on_gpu,
        )
        from sparkdl.training.sharing import GradientSharingExchange
        from sparkdl.training.variables import FlatVariables

        variables = model.trainable_variables
        args = (FlatVariables(variables).size, copy.deepcopy(self.threshold))
        kwargs = {
            "shake_up": self.shake_up,
            "clipping": self.residual_clipping,
            "job_id": job_id,
            "rank": comm.rank,
        }
        on_device = self.encoder == "device" or (
            self.encoder == "auto" and variables_on_gpu(variables)
        )
        compressor: ThresholdCompressor
        if on_device:
            device = variable_device(variables[0]) if variables else None
            compressor = DeviceThresholdCompressor(*args, **kwargs, device=device)
        else:
            compressor = ThresholdCompressor(*args, **kwargs)
        return GradientSharingExchange(model, comm, compressor, classification=classification)


class ParameterAveragingTrainingMaster(TrainingMaster):
    """Local steps, then parameter (and optimizer-state) averaging every
    ``averaging_frequency`` minibatches, as in DL4J's ParameterAveragingTrainingMaster."""

    mode = "averaging"

    def __init__(
        self,
        batch_size_per_worker: int = 32,
        num_workers: int = 2,
        *,
        averaging_frequency: int = 5,
        save_updater: bool = True,
        seed: int = 42,
    ) -> None:
        super().__init__(batch_size_per_worker, num_workers, seed=seed)
        _check_positive("averaging_frequency", averaging_frequency)
        self.averaging_frequency = int(averaging_frequency)
        self.save_updater = bool(save_updater)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "averaging_frequency": self.averaging_frequency,
            "save_updater": self.save_updater,
        }

    def create_exchange(self, model, comm, *, job_id, classification):
        from sparkdl.training.averaging import ParameterAveragingExchange

        return ParameterAveragingExchange(
            model,
            comm,
            averaging_frequency=self.averaging_frequency,
            save_updater=self.save_updater,
            classification=classification,
        )


class DenseTrainingMaster(TrainingMaster):
    """Synchronous dense allreduce-mean of gradients every step (the baseline)."""

    mode = "dense"

    def create_exchange(self, model, comm, *, job_id, classification):
        from sparkdl.training.dense import DenseAllreduceExchange

        return DenseAllreduceExchange(model, comm, classification=classification)


MASTERS: dict[str, type[TrainingMaster]] = {
    m.mode: m for m in (SharedTrainingMaster, ParameterAveragingTrainingMaster, DenseTrainingMaster)
}


def master_from_config(config: dict[str, Any]) -> TrainingMaster:
    """Rebuild a master from :meth:`TrainingMaster.get_config` output."""
    mode = config.get("mode")
    if mode not in MASTERS:
        raise ConfigurationError(f"training mode must be one of {sorted(MASTERS)}, got {mode!r}")
    return MASTERS[mode].from_config(config)


def master_from_training_config(training: TrainingConfig) -> TrainingMaster:
    """Build the master a job configuration's ``training`` section describes."""
    common = {
        "batch_size_per_worker": training.batch_size_per_worker,
        "num_workers": training.num_workers,
        "seed": training.seed,
    }
    if training.mode == "averaging":
        return ParameterAveragingTrainingMaster(
            **common,
            averaging_frequency=training.averaging_frequency,
            save_updater=training.save_updater,
        )
    if training.mode == "dense":
        return DenseTrainingMaster(**common)
    t = training.threshold
    threshold: ThresholdAlgorithm
    if t.algorithm == "fixed":
        threshold = FixedThreshold(t.initial)
    elif t.algorithm == "target_sparsity":
        threshold = TargetSparsityThreshold(sparsity=t.sparsity, initial=t.initial)
    else:
        threshold = AdaptiveThreshold(
            initial=t.initial, min_sparsity=t.min_sparsity, max_sparsity=t.max_sparsity
        )
    return SharedTrainingMaster(
        **common,
        threshold=threshold,
        shake_up=ShakeUp(training.shake_up.frequency, training.shake_up.factor),
        residual_clipping=ResidualClipping(
            training.residual_clipping.factor, training.residual_clipping.frequency
        ),
        encoder=training.encoder,
    )


def _check_positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{name} must be a positive integer, got {value!r}")
