"""Typed, validated job configuration: cluster/system, data, model, training, output.

A configuration is YAML on disk (``conf/*.yaml``) plus ``--set key=value`` overrides. Every
key is checked: an unknown key, a value of the wrong type or out of range raises one
:class:`ConfigurationError` that names the file, the dotted key, what was expected and what
came.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from sparkdl.errors import ConfigurationError
from sparkdl.fit_options import YAML_KEYS, FitOptions
from sparkdl.session import DEFAULT_APP_NAME, DEFAULT_MASTER

if TYPE_CHECKING:
    import keras

#: The longest ``cluster.timeout_s`` (about 11.6 days): the waits it bounds double it, and
#: Python's own waits refuse timeouts above ``threading.TIMEOUT_MAX`` (about 9.2e9 s).
MAX_TIMEOUT_S = 1e6


class _KeysError(ValueError):
    """A section's check of keys that mean something only together: its message starts with
    the key inside the section (``overlap: true applies ...``), so the error names
    ``training.overlap`` and the values, never the whole section's mapping."""


#: The largest ``training.powersgd.rank``: a matrix is compressed only where its factors are
#: ``min_compression`` times smaller, i.e. both its dimensions at least about 4x the rank, so
#: a rank above this compresses nothing short of a 4096 x 4096 matrix (PowerSGD's paper uses
#: 1 to 4); the fit says when the rank exceeds every matrix of the model.
MAX_POWERSGD_RANK = 1024


class _Section(BaseModel):
    # strict: no bool for an int or float (``num_workers: true`` is not 1), no number for a
    # string, no "1" for a bool; allow_inf_nan: ``.inf`` and ``.nan`` are refused everywhere.
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, strict=True, allow_inf_nan=False
    )


class S3Config(_Section):
    """Where ``s3://`` URIs point (credentials come from the AWS chain: environment,
    ``~/.aws``, instance roles). Unset keys leave ``AWS_ENDPOINT_URL`` and
    ``AWS_DEFAULT_REGION`` as the environment has them."""

    endpoint_override: str | None = Field(
        default=None,
        description="an S3-compatible server, e.g. 'http://minio:9000' (MinIO, moto, Ceph)",
    )
    region: str | None = None


class ClusterConfig(_Section):
    """Where and how workers run and talk (DL4J's VoidConfiguration)."""

    master: str | None = Field(
        default=DEFAULT_MASTER,
        description="Spark master when the job creates its own session; ignored when a "
        "session already exists or spark-submit set one.",
    )
    app_name: str = DEFAULT_APP_NAME
    transport: Literal["tcp", "spark"] = "tcp"
    timeout_s: float = Field(
        default=120.0, gt=0, le=MAX_TIMEOUT_S,
        description="the longest any wait between workers and the driver blocks",
    )
    network_mask: str | None = None
    port_range: str | None = None
    wire_integrity: Literal["none", "mac"] = Field(
        default="none",
        description="'mac': every frame between workers carries a keyed MAC (HMAC-SHA256, from "
        "the per-job secret) that is verified before use; 'none': frames are authenticated "
        "only by each connection's handshake.",
    )
    topology: Literal["auto", "flat", "hierarchical"] = Field(
        default="auto",
        description="'hierarchical': ranks on one host combine their messages and one leader "
        "per host talks to the other hosts (one message per host per step); 'flat': one ring "
        "of all ranks; 'auto': hierarchical when there are several hosts and one of them runs "
        "two ranks or more (tcp transport only; 'spark' is always flat)",
    )
    mesh: Literal["plain", "mesh", "auto"] = Field(
        default="plain",
        description="DL4J's meshBuildMode: 'plain' one ring of direct connections (N-1 hops "
        "per small collective); 'mesh' log-depth collectives over extra links (Bruck "
        "allgather, tree broadcast, halving-doubling allreduce: log2 N steps) up to 64 MiB, "
        "the ring above; 'auto' the "
        "log-depth ones for small messages at 4 ranks or more (tcp transport only)",
    )
    cpu_affinity: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="pin each training task's threads to cores of its own among those its "
        "host's training tasks share: 'auto' when they fill those cores exactly (tasks x "
        "task_cpus = cores, one task per core), 'on' whenever they fit, 'off' never "
        "(sparkdl.cpus; restored after the task)",
    )
    task_cpus: int | None = Field(
        default=None, ge=1,
        description="CPU cores each training task asks for: with task_gpus, a ResourceProfile "
        "on the training stage only (stage-level scheduling; not on a local[N] master); "
        "unset: spark.task.cpus",
    )
    task_gpus: float | None = Field(
        default=None, gt=0,
        description="GPUs each training task asks for, on the training stage only (its "
        "ResourceProfile), so that the ETL runs on CPU slots and the training on GPU slots; "
        "unset: spark.task.resource.gpu.amount",
    )
    spark_conf: dict[str, str] = Field(default_factory=dict)
    s3: S3Config = Field(default_factory=S3Config)

    @field_validator("spark_conf", mode="before")
    @classmethod
    def _stringify(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            return {str(k): str(v).lower() if isinstance(v, bool) else str(v)
                    for k, v in value.items()}
        return value


class DataConfig(_Section):
    """The ETL pipeline and where its shards live."""

    pipeline: str = "digits"
    dir: str = "runs/digits/data"
    options: dict[str, Any] = Field(default_factory=dict)
    overwrite: bool = True
    sample_weight_column: str | None = Field(
        default=None, min_length=1,
        description="csv pipeline: the column written as the shards' per-row sample weights "
        "(Keras's sample_weight); the loss and compiled metrics are weighted by it",
    )


class OptimizerConfig(_Section):
    name: str = "adam"
    learning_rate: float = Field(default=1e-3, gt=0)


class ModelConfig(_Section):
    """Which Keras model to build: a built-in name or ``module:function``."""

    name: str = "mlp"
    params: dict[str, Any] = Field(default_factory=dict)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    loss: str = "sparse_categorical_crossentropy"


class PowerSGDConfig(_Section):
    """PowerSGD (``sparkdl.compression.powersgd``; ``training.compression: powersgd``)."""

    rank: int = Field(default=4, ge=1, le=MAX_POWERSGD_RANK,
                      description="the approximation rank r")
    min_compression: float = Field(
        default=2.0, ge=1,
        description="compress a tensor only where its factors are this many times smaller",
    )
    warm_start: bool = Field(default=True, description="reuse the previous step's Q")
    start_step: int = Field(
        default=0, ge=0, description="allreduce the whole gradient before this step")


class ThresholdConfig(_Section):
    """The threshold algorithm (``sparkdl.compression.threshold``)."""

    algorithm: Literal["adaptive", "fixed", "target_sparsity"] = "adaptive"
    initial: float = Field(default=1e-3, gt=0, description="initial tau (all algorithms)")
    min_sparsity: float = Field(default=1e-4, gt=0, le=1)
    max_sparsity: float = Field(default=1e-2, gt=0, le=1)
    decay: float = Field(
        default=0.5 ** (1 / 20),
        gt=0,
        lt=1,
        description="adaptive: tau is multiplied (divided) by this when the sparsity is "
        "below (above) the band; default halves tau in 20 steps (DL4J)",
    )
    sparsity: float = Field(default=1e-3, gt=0, le=1)
    min_elements: int = Field(
        default=32,
        ge=0,
        description="adaptive and target_sparsity: a floor on elements sent per step (at most "
        "half the update), so a small model is not starved by a fixed fraction; 0: none",
    )

    @model_validator(mode="after")
    def _band(self) -> ThresholdConfig:
        if self.min_sparsity > self.max_sparsity:
            raise _KeysError(
                f"min_sparsity ({self.min_sparsity!r}) must be <= max_sparsity "
                f"({self.max_sparsity!r})"
            )
        return self


class ShakeUpConfig(_Section):
    """Every ``frequency`` steps (0: never) encode at ``tau * factor`` (DL4J: tau / 3)."""

    frequency: int = Field(default=0, ge=0)
    factor: float = Field(default=0.1, gt=0, le=1)


class ClippingConfig(_Section):
    factor: float = Field(default=5.0, ge=0)
    frequency: int = Field(default=5, ge=0)


class ElasticConfig(_Section):
    """``training.elastic``: relaunch a failed training stage with the task slots left."""

    min_workers: int = Field(
        default=1, ge=1,
        description="the fewest workers a relaunch may use; fewer slots left fail the fit",
    )
    max_failures: int = Field(
        default=3, ge=0, description="failed training stages the fit survives",
    )


class TrainingConfig(_Section):
    """The training master and its schedule. The keys that are fit options
    (:data:`sparkdl.fit_options.YAML_KEYS`) take their defaults from
    :class:`~sparkdl.fit_options.FitOptions`, but ``epochs`` (a job trains 10 unless told,
    Keras's ``fit`` 1)."""

    mode: Literal["auto", "sharing", "averaging", "dense"] = Field(
        default="auto",
        description="'auto': 'dense' for a model of at most "
        "sparkdl.training.masters.AUTO_DENSE_MAX_PARAMETERS trainable parameters (its whole "
        "update is a few hundred KiB a step: compression saves little and costs accuracy), "
        "'sharing' above; resolved on the driver from the model, reported as metrics 'mode'",
    )
    num_workers: int = Field(default=2, ge=1)
    batch_size_per_worker: int = Field(default=32, ge=1)
    epochs: int = Field(default=10, ge=1)
    seed: int = Field(default=42, ge=0, lt=2**32, description="NumPy's seed range")
    threshold: ThresholdConfig = Field(default_factory=ThresholdConfig)
    shake_up: ShakeUpConfig = Field(default_factory=ShakeUpConfig)
    residual_clipping: ClippingConfig = Field(default_factory=ClippingConfig)
    encoder: Literal["auto", "host", "device"] = "auto"
    compression: Literal["threshold", "powersgd"] = Field(
        default="threshold",
        description="mode sharing: 'threshold' (Strom 2015: the threshold, shake_up and "
        "residual_clipping keys) or 'powersgd' (Vogels et al. 2019: rank-r factors summed by "
        "allreduce; the powersgd keys)",
    )
    powersgd: PowerSGDConfig = Field(default_factory=lambda: PowerSGDConfig())
    overlap: bool = Field(
        default=False,
        description="sharing and dense: exchange step t's message while step t+1 computes; "
        "it is applied before step t+1's update (staleness one step, the same on every rank)",
    )
    wire_dtype: Literal["float32", "bfloat16"] = Field(
        default="float32",
        description="mode dense: the allreduce's wire format; bfloat16 halves the bytes",
    )
    averaging_frequency: int = Field(default=5, ge=1)
    save_updater: bool = True
    report_score_after_averaging: bool = False
    checkpoint_dir: str | None = FitOptions.checkpoint_dir
    store: str | None = Field(
        default=None,
        description="run store for shards written from DataFrames (fit/evaluate on a "
        "DataFrame, KerasEstimator): a filesystem URI on shared storage; None: a temporary "
        "directory, local masters only",
    )
    checkpoint_every: int = Field(default=FitOptions.checkpoint_every, ge=1)
    checkpoint_unit: Literal["epochs", "steps"] = Field(default=FitOptions.checkpoint_unit)
    elastic: ElasticConfig | None = Field(
        default=None,
        description="when a host is lost for good, continue with the workers left "
        "(resuming from the latest checkpoint; needs checkpoint_dir)",
    )
    validation: str = Field(
        default="test",
        description="'test' (the ETL's test shards), 'none', or the URI of shards to validate "
        "on at the end of every validation_freq-th epoch",
    )
    validation_freq: int = Field(default=FitOptions.validation_freq, ge=1)
    verbose: Literal["auto", 0, 1, 2] = Field(default=FitOptions.verbose)
    log_every_steps: int | None = Field(
        default=FitOptions.log_every_steps, ge=0,
        description="step events to the driver's callbacks every N steps (None: automatic)",
    )
    tensorboard_dir: str | None = None
    shuffle: Literal["global", "window", "none"] = Field(
        default=FitOptions.shuffle,
        description="'global': a new seeded assignment of row groups to workers every epoch "
        "plus the in-worker window; 'window': the in-worker window only; 'none': file order",
    )
    accumulate_steps: int = Field(
        default=FitOptions.accumulate_steps, ge=1,
        description="mode dense: exchange once every k steps (micro-batches), the mean of "
        "their gradients (Horovod's backward_passes_per_step)",
    )
    class_weight: dict[int, float] | None = Field(
        default=FitOptions.class_weight,
        description="Keras's class_weight: {class index: weight}, each training row's loss "
        "and metrics weighted by its class's weight (classes not named: 1)",
    )
    timeline: str | None = Field(
        default=FitOptions.timeline, min_length=1,
        description="a directory URI: every worker writes a Chrome trace (chrome://tracing, "
        "ui.perfetto.dev) of its steps there, rank-<N>.json",
    )

    def fit_options(
        self,
        *,
        validation_data: str | None = None,
        callbacks: Sequence[keras.callbacks.Callback] | None = None,
        resume: bool = False,
    ) -> FitOptions:
        """This section as ``fit``'s options: every key that names one
        (:data:`sparkdl.fit_options.YAML_KEYS`; its URIs made absolute), plus what a section
        does not hold."""
        from sparkdl.storage import as_uri

        values = {name: getattr(self, name) for name in YAML_KEYS}
        for name in ("checkpoint_dir", "timeline"):
            if values[name]:
                values[name] = as_uri(values[name])
        return FitOptions(**values, validation_data=validation_data, callbacks=callbacks,
                          resume=resume)

    @model_validator(mode="after")
    def _overlap_mode(self) -> TrainingConfig:
        if self.overlap and self.mode == "averaging":
            raise _KeysError(
                "overlap: true applies to mode 'sharing' or 'dense', not 'averaging'"
            )
        return self

    @model_validator(mode="after")
    def _wire_mode(self) -> TrainingConfig:
        if self.wire_dtype != "float32" and self.mode in ("sharing", "averaging"):
            raise _KeysError(f"wire_dtype: {self.wire_dtype!r} applies to mode 'dense', not "
                             f"{self.mode!r}")
        return self

    @model_validator(mode="after")
    def _accumulate_mode(self) -> TrainingConfig:
        if self.accumulate_steps > 1 and self.mode in ("sharing", "averaging"):
            raise _KeysError(f"accumulate_steps: {self.accumulate_steps} applies to mode "
                             f"'dense', not {self.mode!r}")
        return self

    @model_validator(mode="after")
    def _compression_mode(self) -> TrainingConfig:
        # averaging and dense exchange no compressed message: the key would be ignored
        if self.compression != "threshold" and self.mode in ("averaging", "dense"):
            raise _KeysError(f"compression: {self.compression!r} applies to mode 'sharing' or "
                             f"'auto', not {self.mode!r}")
        return self

    @model_validator(mode="after")
    def _elastic_fits(self) -> TrainingConfig:
        if self.elastic is not None:
            if self.elastic.min_workers > self.num_workers:
                raise _KeysError(
                    f"elastic.min_workers={self.elastic.min_workers} is more than "
                    f"num_workers={self.num_workers}"
                )
            if not self.checkpoint_dir:
                raise _KeysError("elastic needs checkpoint_dir: a relaunch resumes from it")
        return self

    @field_validator("class_weight")
    @classmethod
    def _class_weight_makes_sense(cls, value: dict[int, float] | None
                                  ) -> dict[int, float] | None:
        # what needs no data; the classes the shards hold are checked against it by fit
        if value is None:
            return value
        if not value:
            raise ValueError("name at least one class, {class index: weight}")
        for key, weight in value.items():
            if key < 0:
                raise ValueError(f"class index {key} is negative")
            if not math.isfinite(weight) or weight < 0:
                raise ValueError(f"class {key}'s weight must be a finite number >= 0, "
                                 f"got {weight:g}")
        return value

    @field_validator("verbose", mode="before")
    @classmethod
    def _verbose_not_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):  # True == 1 would pass the Literal
            raise ValueError("expected 'auto', 0, 1 or 2")
        return value

    prefetch: int = Field(
        default=FitOptions.prefetch, ge=1,
        description="row groups each worker decodes ahead (DL4J's workerPrefetchNumBatches)",
    )
    decode_threads: int = Field(default=FitOptions.decode_threads, ge=1)


class EvaluationConfig(_Section):
    """What the evaluate stage computes over the test shards, in one pass.

    ``metrics`` names registered evaluations (``classification``, ``top_n:5``, ``roc``,
    ``roc:200`` for binned ROC, ``roc_binary``, ``roc_multiclass``, ``binary``,
    ``regression``); empty means ``classification`` for class labels and ``regression`` for
    regression targets.
    """

    metrics: list[str] = Field(default_factory=list)
    batch_size: int = Field(default=256, ge=1)

    @field_validator("metrics")
    @classmethod
    def _known(cls, value: list[str]) -> list[str]:
        from sparkdl.evaluation import check_spec

        for spec in value:
            try:
                check_spec(spec)
            except ConfigurationError as exc:
                raise ValueError(str(exc).removeprefix("evaluation.metrics: ")) from None
        if len(set(value)) != len(value):
            raise ValueError(f"names an evaluation twice: {value}")
        return value


class OutputConfig(_Section):
    """Where a run's results go: a local path or any filesystem URI (``s3://bucket/run``)."""

    dir: str = "runs/digits"
    export: Literal["none", "savedmodel"] = Field(
        default="none",
        description="'savedmodel': also write output.dir/savedmodel/, a TensorFlow SavedModel "
        "with a serving signature, for TF Serving",
    )


class TrackingConfig(_Section):
    """Experiment tracking: ``mlflow`` is an MLflow tracking URI (``file:///path/mlruns``,
    ``http://host:5000``); ``None`` tracks nothing. Needs ``pip install 'sparkdl[mlflow]'``."""

    mlflow: str | None = None
    experiment: str = "sparkdl"


class JobConfig(_Section):
    """A whole job: every section is optional and has defaults."""

    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


# Mappings whose own keys contain dots (Spark properties): the rest of an override's dotted
# key after one of these prefixes is a single key.
_DOTTED_KEY_SECTIONS = (("cluster", "spark_conf"),)


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse ``a.b.c=value``; the value is read as a YAML scalar (``5`` → int, ``true`` →
    bool, ``[1, 2]`` → list, ``null`` → None)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigurationError(f"--set expects key=value with a dotted key, got {text!r}")
    try:
        value = yaml.load(raw, Loader=_ConfigLoader) if raw.strip() else ""
    except ConfigurationError as exc:
        raise ConfigurationError(f"--set {key}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigurationError(f"--set {key}: cannot parse value {raw!r}: {exc}") from None
    path = key.split(".")
    for prefix in _DOTTED_KEY_SECTIONS:
        if tuple(path[: len(prefix)]) == prefix and len(path) > len(prefix) + 1:
            path = [*prefix, ".".join(path[len(prefix) :])]
    return path, value


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with every ``key=value`` override applied."""
    result: dict[str, Any] = _deep_copy(data)
    for text in overrides:
        path, value = parse_override(text)
        node = result
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                raise ConfigurationError(
                    f"--set {'.'.join(path)}: {part!r} holds a value, not a section"
                )
            node = child
        node[path[-1]] = value
    return result


def load_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Iterable[str] = (),
    *,
    data: Mapping[str, Any] | None = None,
) -> JobConfig:
    """Load and validate a job configuration from a YAML file (or a mapping) plus overrides."""
    source = str(path) if path is not None else "<config>"
    raw: Any = dict(data or {})
    if path is not None:
        raw = _load_yaml(_read_config_bytes(source), source)
        if raw is None:
            raise ConfigurationError(
                f"the config {source} is empty; write the sections to change, or {{}} for "
                f"every default"
            )
        if not isinstance(raw, dict):
            raise ConfigurationError(
                f"{source}: expected a mapping of sections, got {type(raw).__name__}"
            )
    raw = apply_overrides(raw, overrides)
    try:
        return JobConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigurationError(describe_validation_error(exc, source)) from None


MAX_DEPTH = 64  # nesting levels a configuration may have
MAX_BYTES = 1 << 20  # a configuration file is small


class _ConfigLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` without aliases (a 570-byte alias bomb expands to gigabytes) and
    with bounded nesting (thousands of levels would overflow the recursive composer)."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise ConfigurationError(
                f"line {mark.line + 1}: YAML aliases (*name) are not allowed in a configuration"
            )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise ConfigurationError(
                    f"line {mark.line + 1}: nested more than {MAX_DEPTH} levels deep"
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        """PyYAML keeps the last of two equal keys; a configuration refuses them."""
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in first:
                    raise ConfigurationError(
                        f"line {line}: duplicate key {key!r} (first on line {first[key]})"
                    )
                first[key] = line
            except TypeError:  # an unhashable key: PyYAML's own error names it
                continue
        return super().construct_mapping(node, deep)


# YAML 1.1 (PyYAML) reads ``1e-3`` and ``1e12`` as strings (its floats need a dot); users write
# them as numbers, so the loader reads every decimal float spelling YAML 1.2 allows.
_ConfigLoader.yaml_implicit_resolvers = {
    key: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:float"]
    for key, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def _read_config_bytes(source: str) -> bytes:
    """The bytes of a configuration file: a local path or any filesystem URI."""
    from sparkdl.storage import local_path

    file = local_path(source)
    if file is None:
        from sparkdl.errors import DataError
        from sparkdl.storage import read_bytes

        try:
            return read_bytes(source, what="configuration file", limit=MAX_BYTES)
        except DataError as exc:
            raise ConfigurationError(str(exc)) from None
    if not file.is_file():
        raise ConfigurationError(f"configuration file {source} does not exist")
    try:
        return file.read_bytes()
    except OSError as exc:
        raise ConfigurationError(f"{source}: cannot read: {exc.strerror or exc}") from None


def _load_yaml(data: bytes, source: str) -> Any:
    """Parse a configuration file's bytes; every failure is one :class:`ConfigurationError`."""
    if len(data) > MAX_BYTES:
        raise ConfigurationError(
            f"{source}: {len(data)} bytes; a configuration file is at most {MAX_BYTES}"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigurationError(
            f"{source}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None
    try:
        return yaml.load(text, Loader=_ConfigLoader)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{source}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigurationError(f"{source}: not valid YAML: {exc}") from None
    except RecursionError:
        raise ConfigurationError(f"{source}: nested too deeply") from None


def describe_validation_error(exc: ValidationError, source: str) -> str:
    """One readable message naming each bad key, what was expected and what came."""
    lines = []
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"])
        cause = error.get("ctx", {}).get("error")
        if error["type"] == "extra_forbidden":
            lines.append(f"{source}: unknown key {key!r}")
        elif isinstance(cause, _KeysError):  # names its keys and values itself
            lines.append(f"{source}: {key}.{cause}" if key else f"{source}: {cause}")
        else:
            got = error.get("input")
            lines.append(f"{source}: {key}: {error['msg'].lower()}, got {got!r}")
    return "; ".join(lines)


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value
