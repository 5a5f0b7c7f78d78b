"""Training masters: which exchange algorithm the workers run, and its settings.

They mirror DL4J's ``SharedTrainingMaster`` and ``ParameterAveragingTrainingMaster``; a
``DenseTrainingMaster`` is the allreduce baseline both are measured against. Masters are
plain configuration: they round-trip through ``get_config``/``from_config`` and build their
per-worker exchange only inside a worker (where TensorFlow is imported).
"""

from __future__ import annotations

import abc
import logging
from typing import TYPE_CHECKING, Any, ClassVar, TypedDict

from sparkdl.compression.compressor import (
    CompressorConfig,
    ThresholdCompressorConfig,
    compressor_from_config,
    compressor_to_config,
)
from sparkdl.compression.threshold import (
    AdaptiveThreshold,
    FixedThreshold,
    ResidualClipping,
    ResidualPostProcessor,
    ShakeUp,
    TargetSparsityThreshold,
    ThresholdAlgorithm,
    threshold_from_config,
)
from sparkdl.errors import ConfigurationError

if TYPE_CHECKING:
    from sparkdl.comm.communicator import Communicator
    from sparkdl.config import TrainingConfig
    from sparkdl.training.exchanges.exchange import UpdateExchange


#: Where :class:`SharedTrainingMaster` encodes updates: ``"host"`` (numpy), ``"device"``
#: (TensorFlow, on the model's device) or ``"auto"`` (device when the model is on a GPU).
ENCODERS = ("auto", "host", "device")

log = logging.getLogger("sparkdl.training")

#: ``training.mode: auto`` trains a model of at most this many trainable parameters with
#: :class:`DenseTrainingMaster` and a larger one with :class:`SharedTrainingMaster`. Below it
#: the dense update is at most 256 KiB a step, which a 1 Gb/s link carries in about 2 ms:
#: compression saves little time there and starves a small model (docs/training-modes.md,
#: "Small models").
AUTO_DENSE_MAX_PARAMETERS = 65_536


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
        self, model: Any, comm: Communicator, *, job_id: int
    ) -> UpdateExchange:
        """Build this master's per-worker exchange (runs inside a worker)."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items() if k != "mode")
        return f"{type(self).__name__}({args})"

    def describe(self) -> str:
        """The mode and the settings that differ from this class's defaults, in one short
        line (workers and batch size are said beside it): ``"sharing"``,
        ``"averaging (averaging_frequency=10)"``, ``"sharing (compressor=PowerSGD(rank=4))"``."""
        try:
            defaults = type(self)().get_config()
        except Exception:  # a subclass without defaults: every setting is the user's
            defaults = {}
        changed = [f"{key}={_describe_value(value, defaults.get(key))}"
                   for key, value in self.get_config().items()
                   if key not in _SAID_APART and (key not in defaults or value != defaults[key])]
        return f"{self.mode} ({', '.join(changed)})" if changed else self.mode


_SAID_APART = ("mode", "batch_size_per_worker", "num_workers")


def _describe_value(value: Any, default: Any) -> str:
    """``value`` for :meth:`TrainingMaster.describe`: a nested config (``class_name`` and
    ``config``) as its short class name and the entries that differ from ``default``'s, or
    from its own class's defaults when ``default`` is another class."""
    if not (isinstance(value, dict) and "class_name" in value):
        return repr(value)
    name = value["class_name"]
    if not (isinstance(default, dict) and default.get("class_name") == name):
        default = _default_config(value)
    inner = value.get("config") or {}
    base = (default or {}).get("config") or {}
    parts = [f"{key}={_describe_value(item, base.get(key))}" for key, item in inner.items()
             if key not in base or item != base[key]]
    short = name.removesuffix("CompressorConfig") or name
    return f"{short}({', '.join(parts)})"


def _default_config(config: dict[str, Any]) -> dict[str, Any] | None:
    """The config of a default-constructed compressor of ``config``'s class, or None."""
    import importlib

    try:
        module = importlib.import_module(config["module"])
        return compressor_to_config(getattr(module, config["class_name"])())
    except Exception:  # not a compressor config, or one without defaults
        return None


class SharedTrainingMaster(TrainingMaster):
    """Threshold-compressed gradient sharing (Strom 2015), as in DL4J's SharedTrainingMaster.

    Args:
        batch_size_per_worker: Minibatch size of each worker.
        num_workers: Number of workers (barrier tasks or local processes).
        compressor: A :class:`~sparkdl.compression.CompressorConfig` (plain data, rebuilt on
            every worker); default a :class:`~sparkdl.compression.ThresholdCompressorConfig`
            made of the three arguments below. Give either ``compressor`` or those.
        threshold: Threshold algorithm (default ``AdaptiveThreshold()``, tau from 1e-3).
        shake_up: Shake-up schedule (default never).
        residual_clipping: Residual post-processor (default ``ResidualClipping()``: ±5 tau
            every 5 steps).
        encoder: Where updates are encoded: ``"host"`` (numpy), ``"device"`` (TensorFlow, on
            the model's device) or ``"auto"`` (device when the model is on a GPU).
        overlap: Hide the exchange behind computation (``training.overlap``): step t's
            message is encoded, exchanged and decoded while step t+1 computes its gradient,
            and is applied before step t+1's update (staleness exactly one step, identical on
            every rank; drained at epoch ends, validation and checkpoints).
        seed: Seed of the workers' random state.
    """

    mode = "sharing"

    def __init__(
        self,
        batch_size_per_worker: int = 32,
        num_workers: int = 2,
        *,
        compressor: CompressorConfig | None = None,
        threshold: ThresholdAlgorithm | None = None,
        shake_up: ShakeUp | None = None,
        residual_clipping: ResidualPostProcessor | None = None,
        encoder: str = "auto",
        overlap: bool = False,
        seed: int = 42,
    ) -> None:
        super().__init__(batch_size_per_worker, num_workers, seed=seed)
        self.overlap = _check_bool("overlap", overlap)
        if encoder not in ENCODERS:
            raise ConfigurationError(f"encoder must be one of {ENCODERS}, got {encoder!r}")
        self.encoder = encoder
        parts = {"threshold": threshold, "shake_up": shake_up,
                 "residual_clipping": residual_clipping}
        if compressor is None:
            compressor = ThresholdCompressorConfig(
                threshold,
                shake_up,
                residual_clipping if residual_clipping is not None else ResidualClipping(),
            )
        elif not isinstance(compressor, CompressorConfig):
            raise ConfigurationError(
                f"compressor must be a CompressorConfig, got {type(compressor).__name__}"
            )
        elif any(v is not None for v in parts.values()):
            given = sorted(k for k, v in parts.items() if v is not None)
            raise ConfigurationError(
                f"give either compressor or {given}, not both (they are part of the compressor)"
            )
        if compressor.collective != "allgather" and encoder == "device":
            raise ConfigurationError(
                f"encoder='device' needs a ThresholdCompressorConfig; "
                f"{type(compressor).__name__} runs on the host (use encoder='host' or 'auto')")
        self.compressor = compressor

    # The threshold compressor's parts, as attributes of the master (None for other
    # compressors).

    @property
    def threshold(self) -> ThresholdAlgorithm | None:
        return getattr(self.compressor, "threshold", None)

    @property
    def shake_up(self) -> ShakeUp | None:
        return getattr(self.compressor, "shake_up", None)

    @property
    def residual_clipping(self) -> ResidualPostProcessor | None:
        return getattr(self.compressor, "residual_post_processor", None)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "compressor": compressor_to_config(self.compressor),
            "encoder": self.encoder,
            "overlap": self.overlap,
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> SharedTrainingMaster:
        config = dict(config)
        config.pop("mode", None)
        compressor = config.get("compressor")
        if isinstance(compressor, dict):
            module = compressor.get("module")
            if isinstance(module, str) and module != "sparkdl.compression.compressor":
                # a user's compressor registers itself when its module is imported
                import importlib

                try:
                    importlib.import_module(module)
                except ImportError as exc:
                    raise ConfigurationError(f"compressor module {module!r}: {exc}") from None
            config["compressor"] = compressor_from_config(compressor)
        # the form before compressor configs: the threshold compressor's parts
        if isinstance(config.get("threshold"), dict):
            config["threshold"] = threshold_from_config(config["threshold"])
        if isinstance(config.get("shake_up"), dict):
            config["shake_up"] = ShakeUp(**config["shake_up"])
        if isinstance(config.get("residual_clipping"), dict):
            config["residual_clipping"] = ResidualClipping(**config["residual_clipping"])
        return cls(**config)

    def create_exchange(
        self, model: Any, comm: Communicator, *, job_id: int
    ) -> UpdateExchange:
        from sparkdl.training.exchanges.device_encoding import (
            build_compressor,
            variable_device,
            variables_on_gpu,
        )
        from sparkdl.training.exchanges.sharing import GradientSharingExchange
        from sparkdl.training.exchanges.variables import FlatVariables

        variables = model.trainable_variables
        if self.compressor.collective == "allreduce":
            from sparkdl.compression.powersgd import PowerSGDCompressor
            from sparkdl.training.exchanges.powersgd import PowerSGDExchange

            shapes = [tuple(v.shape) for v in variables]
            built = self.compressor.build(FlatVariables(variables).size, job_id=job_id,
                                          rank=comm.rank, shapes=shapes)
            assert isinstance(built, PowerSGDCompressor)  # the one allreduce compressor
            return PowerSGDExchange(model, comm, built, overlap=self.overlap)
        on_device = self.encoder == "device" or (
            self.encoder == "auto"
            and variables_on_gpu(variables)
            and isinstance(self.compressor, ThresholdCompressorConfig)
        )
        device = (variable_device(variables[0]) if variables else "") if on_device else None
        compressor = build_compressor(
            self.compressor,
            FlatVariables(variables).size,
            job_id=job_id,
            rank=comm.rank,
            device=device,
        )
        return GradientSharingExchange(model, comm, compressor, overlap=self.overlap)


class ParameterAveragingTrainingMaster(TrainingMaster):
    """Local steps, then parameter (and optimizer-state) averaging every
    ``averaging_frequency`` minibatches, as in DL4J's ParameterAveragingTrainingMaster.

    Args:
        batch_size_per_worker: Minibatch size of each worker.
        num_workers: Number of workers.
        averaging_frequency: Local steps between two averages.
        save_updater: Average the optimizer state too (DL4J's ``saveUpdater``).
        report_score_after_averaging: On steps that averaged, also report the loss of the
            averaged model on that step's batch (``loss_after_averaging``; one extra forward
            pass per average; DL4J's ``reportScoreAfterAveraging``).
        seed: Seed of the workers' random state.
    """

    mode = "averaging"

    def __init__(
        self,
        batch_size_per_worker: int = 32,
        num_workers: int = 2,
        *,
        averaging_frequency: int = 5,
        save_updater: bool = True,
        report_score_after_averaging: bool = False,
        overlap: bool = False,
        seed: int = 42,
    ) -> None:
        super().__init__(batch_size_per_worker, num_workers, seed=seed)
        if overlap:
            raise ConfigurationError(
                "overlap applies to gradient sharing and dense allreduce, not to parameter "
                "averaging (its averages are already only every averaging_frequency steps)"
            )
        _check_positive("averaging_frequency", averaging_frequency)
        self.averaging_frequency = int(averaging_frequency)
        self.save_updater = bool(save_updater)
        self.report_score_after_averaging = bool(report_score_after_averaging)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "averaging_frequency": self.averaging_frequency,
            "save_updater": self.save_updater,
            "report_score_after_averaging": self.report_score_after_averaging,
        }

    def create_exchange(
        self, model: Any, comm: Communicator, *, job_id: int
    ) -> UpdateExchange:
        from sparkdl.training.exchanges.averaging import ParameterAveragingExchange

        return ParameterAveragingExchange(
            model,
            comm,
            averaging_frequency=self.averaging_frequency,
            save_updater=self.save_updater,
            report_score_after_averaging=self.report_score_after_averaging,
        )


class DenseTrainingMaster(TrainingMaster):
    """Synchronous dense allreduce-mean of gradients every step (the baseline).

    Args:
        batch_size_per_worker: Minibatch size of each worker.
        num_workers: Number of workers.
        overlap: Allreduce step t's gradient while step t+1's is computed, and apply it
            before step t+1's (one step stale, the same on every rank).
        seed: Seed of the workers' random state.
        wire_dtype: ``"float32"`` or ``"bfloat16"`` (half the bytes on the wire, summed in
            bfloat16 by the ring; applied as float32) (``training.wire_dtype``).
    """

    mode = "dense"

    def __init__(
        self,
        batch_size_per_worker: int = 32,
        num_workers: int = 2,
        *,
        overlap: bool = False,
        seed: int = 42,
        wire_dtype: str = "float32",
    ) -> None:
        super().__init__(batch_size_per_worker, num_workers, seed=seed)
        self.overlap = _check_bool("overlap", overlap)
        if wire_dtype not in ("float32", "bfloat16"):
            raise ConfigurationError(
                f"wire_dtype must be 'float32' or 'bfloat16', got {wire_dtype!r}")
        self.wire_dtype = wire_dtype

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "overlap": self.overlap, "wire_dtype": self.wire_dtype}

    def create_exchange(
        self, model: Any, comm: Communicator, *, job_id: int
    ) -> UpdateExchange:
        from sparkdl.training.exchanges.dense import DenseAllreduceExchange

        return DenseAllreduceExchange(model, comm, overlap=self.overlap,
                                      wire_dtype=self.wire_dtype)


MASTERS: dict[str, type[TrainingMaster]] = {
    m.mode: m for m in (SharedTrainingMaster, ParameterAveragingTrainingMaster, DenseTrainingMaster)
}


def master_from_config(config: dict[str, Any]) -> TrainingMaster:
    """Rebuild a master from :meth:`TrainingMaster.get_config` output."""
    mode = config.get("mode")
    if mode not in MASTERS:
        raise ConfigurationError(f"training mode must be one of {sorted(MASTERS)}, got {mode!r}")
    return MASTERS[mode].from_config(config)


def num_trainable_parameters(model: Any) -> int:
    """Elements of ``model``'s trainable variables: the size of one update."""
    total = 0
    for variable in model.trainable_variables:
        count = 1
        for dim in variable.shape:
            count *= int(dim)
        total += count
    return total


def resolve_mode(mode: str, num_parameters: int) -> str:
    """The mode ``training.mode`` names: ``"auto"`` is ``"dense"`` for at most
    :data:`AUTO_DENSE_MAX_PARAMETERS` parameters and ``"sharing"`` above; others are kept."""
    if mode != "auto":
        return mode
    return "dense" if num_parameters <= AUTO_DENSE_MAX_PARAMETERS else "sharing"


class _Common(TypedDict):
    """The settings every master takes."""

    batch_size_per_worker: int
    num_workers: int
    seed: int


def master_from_training_config(training: TrainingConfig, model: Any = None) -> TrainingMaster:
    """Build the master a job configuration's ``training`` section describes; ``model`` (a
    Keras model) resolves ``mode: auto`` from its trainable parameter count."""
    mode: str = training.mode
    if mode == "auto":
        if model is None:
            raise ConfigurationError(
                "training.mode 'auto' is chosen from the model's parameter count: pass model= "
                "or name a mode (sharing, averaging, dense)"
            )
        count = num_trainable_parameters(model)
        mode = resolve_mode(mode, count)
        log.info("training.mode auto: %s (%d trainable parameters; dense up to %d)",
                 mode, count, AUTO_DENSE_MAX_PARAMETERS)
        if mode == "dense" and training.compression != "threshold":
            log.warning("training.compression %r is not used: mode 'auto' chose 'dense' for "
                        "%d trainable parameters (up to %d)", training.compression, count,
                        AUTO_DENSE_MAX_PARAMETERS)
    common = _Common(
        batch_size_per_worker=training.batch_size_per_worker,
        num_workers=training.num_workers,
        seed=training.seed,
    )
    if mode == "averaging":
        return ParameterAveragingTrainingMaster(
            **common,
            overlap=training.overlap,
            averaging_frequency=training.averaging_frequency,
            save_updater=training.save_updater,
            report_score_after_averaging=training.report_score_after_averaging,
        )
    if mode == "dense":
        return DenseTrainingMaster(**common, overlap=training.overlap,
                                   wire_dtype=training.wire_dtype)
    t = training.threshold
    threshold: ThresholdAlgorithm
    if t.algorithm == "fixed":
        threshold = FixedThreshold(t.initial)
    elif t.algorithm == "target_sparsity":
        threshold = TargetSparsityThreshold(
            sparsity=t.sparsity, initial=t.initial, min_elements=t.min_elements
        )
    else:
        threshold = AdaptiveThreshold(
            initial=t.initial,
            min_sparsity=t.min_sparsity,
            max_sparsity=t.max_sparsity,
            decay=t.decay,
            min_elements=t.min_elements,
        )
    if training.compression == "powersgd":
        from sparkdl.compression.powersgd import PowerSGDCompressorConfig

        p = training.powersgd
        return SharedTrainingMaster(
            **common,
            compressor=PowerSGDCompressorConfig(
                rank=p.rank, min_compression=p.min_compression, warm_start=p.warm_start,
                start_step=p.start_step, seed=training.seed),
            encoder=training.encoder,
            overlap=training.overlap,
        )
    return SharedTrainingMaster(
        **common,
        threshold=threshold,
        shake_up=ShakeUp(training.shake_up.frequency, training.shake_up.factor),
        residual_clipping=ResidualClipping(
            training.residual_clipping.factor, training.residual_clipping.frequency
        ),
        encoder=training.encoder,
        overlap=training.overlap,
    )


def _check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name} must be true or false, got {value!r}")
    return value


def _check_positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{name} must be a positive integer, got {value!r}")
