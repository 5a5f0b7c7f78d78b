"""The job stages — ETL, train, evaluate, predict — as functions of a :class:`JobConfig`.

``jobs/*.py``, the ``sparkdl`` command, notebooks and Airflow tasks all run these, so a
stage behaves the same wherever it is started from. Each stage reads what the previous one
published and publishes its own outputs atomically.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkdl.config import JobConfig
from sparkdl.errors import DataError
from sparkdl.report import write_history_csv, write_report
from sparkdl.run_layout import RunLayout
from sparkdl.run_output import (
    EVALUATION_FILE,
    HISTORY_FILE,
    METRICS_FILE,
    MODEL_FILE,
    PREDICTIONS_DIR,
    PREDICTIONS_MARKER,
    REPORT_FILE,
    SAVEDMODEL_DIR,
    SAVEDMODEL_MARKER,
    RunOutput,
)
from sparkdl.storage import (
    as_uri,
    atomic_path,
    configure_s3,
    spark_uri,
    write_text_atomically,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("sparkdl")

#: The file that marks each output directory as sparkdl's (what TF Serving looks for).
MARKERS = {SAVEDMODEL_DIR: SAVEDMODEL_MARKER, PREDICTIONS_DIR: PREDICTIONS_MARKER}
#: What the train stage removes when it publishes a new model: the old one's figures (and
#: its SavedModel, when the new one is not exported).
STALE_AFTER_TRAIN = (EVALUATION_FILE, PREDICTIONS_DIR)


def output_dir(config: JobConfig) -> RunOutput:
    """``output.dir`` (any filesystem) as a :class:`RunOutput`, created if needed; one clear
    error naming the key and the location if it cannot be."""
    return RunLayout.from_config(config).output()


def configure_storage(config: JobConfig, spark: SparkSession) -> None:
    """Apply ``cluster.s3`` to this process (sparkdl's Spark tasks take it along)."""
    s3 = config.cluster.s3
    configure_s3(s3.endpoint_override, s3.region)


def shard_uris(config: JobConfig) -> tuple[str, str]:
    """The ETL's train and test shards (:class:`RunLayout`)."""
    layout = RunLayout.from_config(config)
    return layout.train_shards, layout.test_shards


def validation_uri(config: JobConfig) -> str | None:
    """The shards ``training.validation`` names: the ETL's test split, none, or a URI."""
    choice = config.training.validation.strip()
    if choice.lower() == "none":
        return None
    if choice.lower() == "test":
        return shard_uris(config)[1]
    return as_uri(choice)


def run_etl(config: JobConfig, spark: SparkSession) -> dict[str, Any]:
    """Run the configured pipeline: raw data → train/test DataSet shards."""
    from sparkdl.pipelines import get_pipeline

    pipeline = get_pipeline(config.data.pipeline)
    options = dict(config.data.options)
    if config.data.sample_weight_column is not None:
        import inspect

        from sparkdl.errors import ConfigurationError

        if "sample_weight_column" not in inspect.signature(pipeline).parameters:
            raise ConfigurationError(
                f"data.sample_weight_column: the {config.data.pipeline} pipeline writes no "
                "sample weights (the csv pipeline does)"
            )
        options["sample_weight_column"] = config.data.sample_weight_column
    target = as_uri(config.data.dir)
    log.info("etl: the %s pipeline, writing shards to %s", config.data.pipeline, target)
    started = time.monotonic()
    result = pipeline(spark, target, overwrite=config.data.overwrite, **options)
    rows = ", ".join(f"{result[key]} {key.removesuffix('_rows')}" for key in result
                     if key.endswith("_rows"))
    log.info("etl: %s rows written in %.1f s", rows or "the", time.monotonic() - started)
    return result


def run_train(config: JobConfig, spark: SparkSession, *, resume: bool = False) -> dict[str, Any]:
    """Train on the train shards; publish the model and the training metrics.

    ``resume=True`` continues from the latest checkpoint in ``training.checkpoint_dir``.
    """
    configure_storage(config, spark)
    train_uri, _ = shard_uris(config)
    with output_dir(config) as out:  # before training: a model is never lost for want of a place
        out.check_targets(_train_unit(config), [SAVEDMODEL_DIR], MARKERS)
        return _train(config, spark, out, train_uri, resume=resume)


def _train_unit(config: JobConfig) -> list[str]:
    """What the train stage publishes, its completion file last."""
    export = [SAVEDMODEL_DIR] if config.output.export == "savedmodel" else []
    return [MODEL_FILE, *export, HISTORY_FILE, REPORT_FILE, METRICS_FILE]


def _train(
    config: JobConfig, spark: SparkSession, out: RunOutput, train_uri: str, *, resume: bool
) -> dict[str, Any]:
    from sparkdl.data.files import read_metadata
    from sparkdl.models import build_model
    from sparkdl.spark_model import SparkModel
    from sparkdl.training.masters import master_from_training_config

    metadata = read_metadata(train_uri)
    num_outputs = metadata.num_classes if metadata.label_kind == "class" else int(
        max(1, _prod(metadata.label_shape))
    )
    import keras

    keras.utils.set_random_seed(config.training.seed)  # same seed, same initial weights
    model = build_model(config.model, metadata.feature_shape, num_outputs,
                        inputs=metadata.inputs, outputs=metadata.outputs)
    training = config.training
    elastic = None
    if training.elastic is not None:
        from sparkdl.training.elastic import ElasticPolicy

        elastic = ElasticPolicy(training.elastic.min_workers, training.elastic.max_failures)
    spark_model = SparkModel(
        spark, model, master_from_training_config(training, model), cluster=config.cluster,
        elastic=elastic, store=training.store,
    )
    callbacks = []
    if training.tensorboard_dir:
        from sparkdl.callbacks import TensorBoardScalars

        callbacks.append(TensorBoardScalars(as_uri(training.tensorboard_dir),
                                            update_freq=training.log_every_steps or None))
    fit = spark_model.fit_with(train_uri, training.fit_options(
        validation_data=validation_uri(config), callbacks=callbacks, resume=resume,
    ))
    new = out.staging  # nothing in output.dir changes until the whole unit is ready
    spark_model.model.save(new / MODEL_FILE)
    metrics = {**fit.metrics.to_json(), "history": fit.history, "model": out.location(MODEL_FILE),
               "train_data": train_uri, "validation_freq": training.validation_freq,
               "history_csv": out.location(HISTORY_FILE)}
    if config.output.export == "savedmodel":
        export_savedmodel(spark_model.model, new / SAVEDMODEL_DIR)
        metrics["savedmodel"] = out.location(SAVEDMODEL_DIR)
    write_history_csv(fit.history, new / HISTORY_FILE, epochs=fit.epoch,
                      validation_freq=training.validation_freq)
    _write_json_atomically(new / METRICS_FILE, metrics)
    write_report(new)  # no evaluation.json beside it: the new model is not evaluated yet
    # the evaluation and predictions of the model being replaced go with it
    unit = _train_unit(config)
    stale = [*STALE_AFTER_TRAIN, *([] if SAVEDMODEL_DIR in unit else [SAVEDMODEL_DIR])]
    out.publish_unit(unit, stale=stale, markers=MARKERS)
    log.info("train: the model and its metrics written to %s", out.location(MODEL_FILE))
    return metrics


def run_evaluate(config: JobConfig, spark: SparkSession) -> dict[str, Any]:
    """Evaluate the published model on the test shards; add the results to the metrics."""
    import keras

    from sparkdl.spark_model import SparkModel
    from sparkdl.training.masters import master_from_training_config

    configure_storage(config, spark)
    _, test_uri = shard_uris(config)
    log.info("evaluate: the trained model on %s", test_uri)
    with output_dir(config) as out:
        model = keras.models.load_model(_trained_model(out))
        spark_model = SparkModel(
            spark, model, master_from_training_config(config.training, model),
            cluster=config.cluster, store=config.training.store,
        )
        per_output = evaluate_configured(spark_model, test_uri, config)
        for name, evaluations in per_output.items():
            for evaluation in evaluations:  # stdout carries the result JSON
                print((f"[output {name}]\n" if name else "") + evaluation.stats(),
                      file=sys.stderr, flush=True)
        new = out.staging
        _write_json_atomically(new / EVALUATION_FILE,
                               {**evaluation_document(per_output), "test_data": test_uri})
        metrics_path = out.fetch(METRICS_FILE)
        metrics = json.loads(metrics_path.read_text()) if metrics_path is not None else {}
        metrics.update(headline_figures(per_output))
        _write_json_atomically(new / METRICS_FILE, metrics)
        write_report(new)
        out.publish_unit([EVALUATION_FILE, REPORT_FILE, METRICS_FILE], markers=MARKERS)
        log.info("evaluate: the evaluation and report written to %s",
                 out.location(REPORT_FILE))
    return metrics


def evaluate_configured(spark_model: Any, test_uri: str, config: JobConfig
                        ) -> dict[str | None, list[Any]]:
    """Run ``evaluation.metrics`` (or the labels' default) over ``test_uri`` in one pass:
    the merged evaluations by output name (``None`` for single-output shards)."""
    from sparkdl.data.files import read_metadata
    from sparkdl.evaluation.plan import default_metrics

    metadata = read_metadata(test_uri)
    metrics = list(config.evaluation.metrics)
    batch_size = config.evaluation.batch_size
    if metadata.multi:
        return spark_model.evaluate(test_uri, batch_size, evaluations=metrics or {})
    request = metrics or default_metrics(metadata.label_kind)
    return {None: spark_model.evaluate(test_uri, batch_size, evaluations=request)}


def evaluation_document(per_output: dict[str | None, list[Any]]) -> dict[str, Any]:
    """``evaluation.json``: every evaluation's dict (``evaluations``, or ``outputs`` by name
    for several outputs); a classification's fields also at the top, as before."""
    if None not in per_output:
        return {"outputs": {name: [e.to_dict() for e in values]
                            for name, values in per_output.items()}}
    values = per_output[None]
    first = next((e for e in values if e.kind == "classification"), None)
    return {**(first.to_dict() if first else {}), "evaluations": [e.to_dict() for e in values]}


def headline_figures(per_output: dict[str | None, list[Any]]) -> dict[str, float]:
    """The headline figures for ``metrics.json``: ``test_<figure>`` (``test_<output>_<figure>``
    for several outputs), and ``test_examples``."""
    figures: dict[str, float] = {}
    for name, values in per_output.items():
        prefix = f"test_{name}_" if name else "test_"
        for evaluation in values:
            for key, value in evaluation.summary().items():
                figures[f"{prefix}{key}"] = value
    count = next((e.count for values in per_output.values() for e in values
                  if isinstance(getattr(e, "count", None), int)), None)
    if count is not None:
        figures["test_examples"] = count
    return figures


def run_predict(config: JobConfig, spark: SparkSession) -> dict[str, Any]:
    """Predict on the test shards with the published model; write predictions as Parquet."""
    import keras

    from sparkdl.data.writer import check_replaceable
    from sparkdl.spark_model import SparkModel
    from sparkdl.training.masters import master_from_training_config

    configure_storage(config, spark)
    _, test_uri = shard_uris(config)
    with output_dir(config) as out:
        target = (out.location(PREDICTIONS_DIR) if out.remote
                  else (out.dir / PREDICTIONS_DIR).as_uri())
        check_replaceable(target, marker=PREDICTIONS_MARKER)  # only what sparkdl wrote
        model = keras.models.load_model(_trained_model(out))
        spark_model = SparkModel(
            spark, model, master_from_training_config(config.training, model),
            cluster=config.cluster, store=config.training.store,
        )
        predictions = spark_model.predict(test_uri).drop("features")
        marker = json.dumps({"test_data": test_uri}) + "\n"
        if out.remote:  # Spark may have no writer for the URI (s3a): through the driver
            import pyarrow.parquet as pq

            local = out.dir / PREDICTIONS_DIR
            local.mkdir()
            pq.write_table(predictions.toArrow(), local / "part-00000.parquet")
            (local / PREDICTIONS_MARKER).write_text(marker)
            check_replaceable(target, marker=PREDICTIONS_MARKER)
            out.publish_dir(PREDICTIONS_DIR, PREDICTIONS_MARKER)
        else:
            _write_local_predictions(predictions, out.dir, marker, target)
    return {"predictions": target}


def _write_local_predictions(predictions: Any, out: Path, marker: str, target: str) -> None:
    from sparkdl.data.writer import check_replaceable

    with atomic_path(out / PREDICTIONS_DIR) as tmp:
        predictions.write.mode("error").parquet(spark_uri(str(tmp)))
        (tmp / PREDICTIONS_MARKER).write_text(marker)
        check_replaceable(target, marker=PREDICTIONS_MARKER)


def run_pipeline(
    config: JobConfig, spark: SparkSession, *, resume: bool = False
) -> dict[str, Any]:
    """ETL, train and evaluate in one go; returns where everything went."""
    shards = run_etl(config, spark)
    run_train(config, spark, resume=resume)
    metrics = run_evaluate(config, spark)
    with output_dir(config) as out:
        result = {
            "shards": shards,
            "model": out.location(MODEL_FILE),
            "metrics": out.location(METRICS_FILE),
            "history": out.location(HISTORY_FILE),
            "report": out.location(REPORT_FILE),
            "test_accuracy": metrics.get("test_accuracy"),
            "samples_per_second": metrics["samples_per_second"],
        }
        if config.output.export == "savedmodel":
            result["savedmodel"] = out.location(SAVEDMODEL_DIR)
        if config.tracking.mlflow:
            from sparkdl.tracking import RUN_FILES, log_run

            for name in RUN_FILES:
                out.fetch(name)
            result["mlflow_run_id"] = log_run(
                config.tracking.mlflow, config.tracking.experiment, config,
                metrics.get("history", {}), out.dir, _trained_model(out),
            )
    return result


def _trained_model(out: RunOutput) -> Path:
    """The local path of the published model; one error naming where it was looked for."""
    model_path = out.fetch(MODEL_FILE)
    if model_path is None:
        raise DataError(
            f"no trained model at {out.location(MODEL_FILE)}: run the train stage first"
        )
    return model_path


def export_savedmodel(model: Any, path: Path) -> None:
    """Export ``model`` for TF Serving: a SavedModel at ``path`` whose ``serving_default``
    signature maps the model's inputs to its outputs (Keras 3 ``model.export``)."""
    with atomic_path(path) as tmp:
        model.export(str(tmp), format="tf_saved_model", verbose=False)


def _write_json_atomically(path: Path, data: dict[str, Any]) -> None:
    write_text_atomically(
        path, json.dumps(data, indent=2, sort_keys=True, default=_json_default) + "\n"
    )


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


def _prod(values: list[int]) -> int:
    result = 1
    for v in values:
        result *= int(v)
    return result
