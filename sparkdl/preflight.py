"""Check a job configuration before any work starts (no Spark): names, options, addresses,
and that every directory the stage writes can be written.

:func:`preflight` runs before the CLI starts Spark, and is ``sparkdl validate --conf FILE``.
It raises one :class:`ConfigurationError` (or :class:`DataError` for a directory sparkdl may
not replace) naming the key and what is wrong, so that a mistake found at the end of training
(an ``output.dir`` that is a file) or inside the executors (a bad port range) is found first.
"""

from __future__ import annotations

import inspect
import ipaddress
import os
from pathlib import Path
from typing import Any

from sparkdl.config import JobConfig
from sparkdl.errors import ConfigurationError

STAGES = ("etl", "train", "evaluate", "predict", "pipeline")
#: The stages whose model :func:`check_model` checks (they build one).
MODEL_CHECKED = ("train", "pipeline")

# Pipelines whose ``run(**options)`` passes unknown options on to another pipeline's ``run``.
_FORWARDS = {"iris": "csv"}
# Arguments of a pipeline's ``run`` that are not ``data.options``.
_NOT_OPTIONS = {"spark", "output_dir", "overwrite", "pipeline"}
_COMMON = ("test_fraction", "seed", "normalizer", "nan_policy", "num_files", "num_workers",
           "rows_per_group")  # the options check_common takes


def preflight(config: JobConfig, stage: str, *, model: bool = True) -> None:
    """Check everything ``stage`` of ``config`` needs that can be checked without Spark;
    without ``model``, all but :func:`check_model` (which needs Keras: the CLI checks the
    model just after Spark has started, TensorFlow having imported meanwhile).

    Raises:
        ConfigurationError: naming the key (``data.options.seed``, ``output.dir``, ...).
        DataError: an output directory exists and holds files sparkdl did not write.
    """
    if stage not in STAGES:
        raise ConfigurationError(f"unknown stage {stage!r}; expected one of {STAGES}")
    check_cluster(config)
    if stage in ("etl", "pipeline"):
        check_pipeline(config)
        _check_writable("data.dir", config.data.dir)
        if config.data.overwrite:
            from sparkdl.data.writer import check_replaceable
            from sparkdl.stages import shard_uris

            for uri in shard_uris(config):
                if _local(uri) is not None:
                    check_replaceable(uri)
    if stage in MODEL_CHECKED:
        if model:
            check_model(config)
        if stage == "train":  # the pipeline writes its shards first: fit checks them then
            check_class_weight(config)
        training = config.training
        for key, value in (("training.checkpoint_dir", training.checkpoint_dir),
                           ("training.tensorboard_dir", training.tensorboard_dir),
                           ("training.timeline", training.timeline)):
            if value:
                _check_writable(key, value)
    if stage in ("train", "evaluate", "predict", "pipeline"):
        _check_writable("output.dir", config.output.dir)
    out = _local(config.output.dir)
    if stage == "predict" and out is not None:  # another filesystem: checked by the stage
        from sparkdl.data.writer import check_replaceable
        from sparkdl.stages import PREDICTIONS_DIR, PREDICTIONS_MARKER

        check_replaceable((out.resolve() / PREDICTIONS_DIR).as_uri(), marker=PREDICTIONS_MARKER)


def check_cluster(config: JobConfig) -> None:
    """``cluster.port_range`` and ``cluster.network_mask`` parse."""
    from sparkdl.comm.network import parse_port_range

    cluster = config.cluster
    try:
        parse_port_range(cluster.port_range)
    except ConfigurationError as exc:
        raise ConfigurationError(f"cluster.port_range: {exc}") from None
    if cluster.network_mask is not None:
        try:
            ipaddress.ip_network(cluster.network_mask, strict=False)
        except ValueError:
            raise ConfigurationError(
                f"cluster.network_mask: expected CIDR like '10.0.0.0/8', got "
                f"{cluster.network_mask!r}"
            ) from None
        if str(cluster.master or "").startswith("local"):  # the workers run here
            from sparkdl.comm.network import select_bind_address

            try:
                select_bind_address(cluster.network_mask)
            except ConfigurationError as exc:
                raise ConfigurationError(f"cluster.{exc}") from None


    cores = cluster.spark_conf.get("spark.executor.cores")
    if (cluster.task_cpus and cores and cores.isdigit() and cluster.task_cpus > int(cores)
            and not os.environ.get("SPARK_REMOTE")):  # the configuration's settings win
        raise ConfigurationError(
            f"cluster.task_cpus={cluster.task_cpus} is more than spark.executor.cores={cores} "
            "(cluster.spark_conf): no executor could run a training task"
        )


def check_class_weight(config: JobConfig) -> None:
    """``training.class_weight`` against the classes of train shards already written (the
    ETL's ``_sparkdl.json``, on a local filesystem); absent shards are the ETL's to write."""
    class_weight = config.training.class_weight
    if not class_weight:
        return
    from sparkdl.data.metadata import METADATA_FILE, load_metadata
    from sparkdl.stages import shard_uris
    from sparkdl.training.weights import check_class_weight as check

    uri = shard_uris(config)[0]
    local = _local(uri)
    if local is None or not (local / METADATA_FILE).is_file():
        return
    try:
        check(class_weight, load_metadata(uri), uri)
    except ConfigurationError as exc:
        raise ConfigurationError(f"training.{exc}") from None


def check_pipeline(config: JobConfig) -> None:
    """The pipeline exists and takes every ``data.options`` key; common values are valid."""
    from sparkdl.pipelines import PIPELINES, get_pipeline
    from sparkdl.pipelines.common import check_common, option

    name = config.data.pipeline
    known = _option_names(get_pipeline(name))
    if name in _FORWARDS:
        known |= _option_names(get_pipeline(_FORWARDS[name]))
    options = config.data.options
    for key in sorted(options):
        if key not in known:
            raise ConfigurationError(
                f"data.options.{key}: unknown option for the {name} pipeline; it takes "
                f"{', '.join(sorted(known))}"
            )
    defaults = _defaults(get_pipeline(_FORWARDS.get(name, name)))
    defaults.update(_defaults(get_pipeline(name)))
    neutral = {"test_fraction": 0.5, "seed": 0, "normalizer": None, "nan_policy": "fail",
               "num_files": None, "num_workers": None, "rows_per_group": 1}
    values = {**neutral, **defaults, **options}
    check_common(**{k: values[k] for k in _COMMON})
    for key in ("header", "analysis"):
        if key in options:
            option(key, options[key], bool)
    path = options.get("path")
    if isinstance(path, str) and name in PIPELINES and _local(path) is not None:
        local = _local(path)
        if not any(ch in path for ch in "*?[") and not local.exists():
            raise ConfigurationError(f"data.options.path: {path} does not exist")
    if name in ("csv",) or (name in _FORWARDS and "columns" in options):
        from sparkdl.etl.readers.schema import parse_columns

        if "columns" in options:
            parse_columns(options["columns"], key="data.options.columns")
    if "transform" in options and options["transform"] is not None:
        from sparkdl.etl.transform import TransformProcess

        TransformProcess.from_config(options["transform"], key="data.options.transform")


def check_model(config: JobConfig) -> None:
    """The model builder, its parameters, the optimizer and the loss resolve (imports Keras)."""
    import keras

    from sparkdl.models import check_mlp_params, mlp, resolve_builder

    model = config.model
    builder = resolve_builder(model.name)
    if builder is mlp:
        check_mlp_params(model.params)
    try:
        sig = inspect.signature(builder)
    except (TypeError, ValueError):
        sig = None
    if sig is not None:
        try:
            sig.bind(input_shape=(1,), num_classes=2, **model.params)
        except TypeError as exc:
            raise ConfigurationError(f"model.params: {model.name}: {exc}") from None
    try:
        keras.optimizers.get({"class_name": model.optimizer.name,
                              "config": {"learning_rate": model.optimizer.learning_rate}})
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(
            f"model.optimizer.name: unknown optimizer {model.optimizer.name!r} ({exc})"
        ) from None
    try:
        keras.losses.get(model.loss)
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(f"model.loss: unknown loss {model.loss!r} ({exc})") from None


def _option_names(run: Any) -> set[str]:
    params = inspect.signature(run).parameters.values()
    return {p.name for p in params
            if p.kind == p.KEYWORD_ONLY and p.name not in _NOT_OPTIONS}


def _defaults(run: Any) -> dict[str, Any]:
    params = inspect.signature(run).parameters.values()
    return {p.name: p.default for p in params
            if p.kind == p.KEYWORD_ONLY and p.default is not p.empty}


def _local(location: str) -> Path | None:
    """The local path of a path or ``file:`` URI; None for another filesystem."""
    from sparkdl.storage import local_path

    return local_path(location)


def _check_writable(key: str, location: str) -> None:
    """``location`` is a directory that can be written, or can be created."""
    path = _local(location)
    if path is None:
        return  # another filesystem: the stage finds out, with an error naming the key
    path = path.resolve()
    probe = path
    while not probe.exists():
        if probe.is_symlink():
            raise ConfigurationError(f"{key}: {probe} is a dangling symbolic link")
        probe = probe.parent
    if not probe.is_dir():
        where = "" if probe == path else f" (its parent {probe} is not a directory)"
        raise ConfigurationError(
            f"{key}: {location} cannot be a directory: {probe} is a file{where}"
        )
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigurationError(f"{key}: {probe} is not writable (for {location})")
