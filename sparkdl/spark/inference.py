"""``SparkModel.evaluate`` and ``SparkModel.predict``: the model on the executors, through
DataFrame operations only (``mapInPandas``, a pandas UDF), so classic Spark and Spark Connect
run them alike.

The model travels through storage (:mod:`sparkdl.training.model_files`): the function Spark
ships to the executors carries its file's URI and checksum, and the driver's S3 settings;
each Python worker loads it once.
"""

from __future__ import annotations

import contextlib
import pickle
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sparkdl.data.files import read_metadata
from sparkdl.data.frames import is_dataframe
from sparkdl.errors import ConfigurationError, DataError
from sparkdl.evaluation import evaluation_from_dict
from sparkdl.evaluation.plan import EvaluationRequest, by_output, evaluation_plan
from sparkdl.spark.predict_multi import (
    dataframe_inputs,
    is_multi_model,
    output_kinds,
    predict_multi,
)
from sparkdl.spark.row_progress import RowReporter, row_progress
from sparkdl.spark.task_model import load_task_model
from sparkdl.spark.task_size import check_task_size
from sparkdl.storage import apply_environment, s3_environment, spark_uri
from sparkdl.training.model_check import check_model_fits_shards

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame

    from sparkdl.config import ClusterConfig
    from sparkdl.data.frames import FeaturesCol
    from sparkdl.etl.normalizers import Normalizer
    from sparkdl.spark.task_model import FittedModel
    from sparkdl.training.model_files import ModelRef


def evaluate(
    spark_model: FittedModel,
    data: str,
    batch_size: int = 256,
    *,
    evaluations: EvaluationRequest | None = None,
    show_progress: bool = False,
    cluster: ClusterConfig | None = None,
) -> Any:
    """Evaluate ``spark_model``'s model on the shard directory ``data``, on the executors, in
    one pass (:meth:`sparkdl.SparkModel.evaluate` says what ``evaluations`` may be).

    ``show_progress``: draw a bar of the rows evaluated, the tasks reporting them over a
    channel to the driver on the network, ports and timeout of ``cluster``
    (:mod:`sparkdl.spark.row_progress`)."""
    from sparkdl.session import default_parallelism, task_cpus

    if not isinstance(data, str):
        raise ConfigurationError(
            "evaluate() takes a Spark DataFrame or the URI of a shard directory (str), "
            f"got {type(data).__name__}"
        )
    data_uri = data
    metadata = read_metadata(data_uri)
    check_model_fits_shards(spark_model.model, metadata, data_uri, training=False)
    plan = evaluation_plan(metadata, evaluations)
    templates = {key: [e.to_dict() for e in values] for key, values in plan.items()}
    model_file = spark_model.model_file(data_uri)
    spark = spark_model.spark
    files = [f.path for f in metadata.files]
    partitions = max(1, min(len(files), default_parallelism(spark)))
    paths = spark.createDataFrame([(path,) for path in files], "path string")
    with row_progress(spark, metadata.num_rows, cluster, show=show_progress) as progress:
        evaluate_partition = _evaluation_task(
            data_uri, templates, model_file, spark_model.custom_objects, task_cpus(spark),
            batch_size, progress.reporter if progress else None)
        check_task_size(spark, "evaluate()", evaluate_partition, spark_model.custom_objects)
        rows = paths.repartition(partitions).mapInPandas(evaluate_partition,
                                                         "result binary").collect()
    for row in rows:
        result = pickle.loads(row["result"])
        for key, values in plan.items():
            for total, part in zip(values, result[key], strict=True):
                total.merge(evaluation_from_dict(part))
    if evaluations is None and not metadata.multi:
        return plan[None][0]
    if not metadata.multi:
        return plan[None]
    return plan if evaluations is not None else {k: v[0] for k, v in plan.items()}


def _evaluation_task(
    data_uri: str, templates: dict[str | None, list[dict[str, Any]]], model_file: ModelRef,
    custom_objects: dict[str, Any] | None, threads: int, batch_size: int,
    reporter: RowReporter | None,
) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """The ``mapInPandas`` function of evaluation: its partition's files evaluated into one
    row of mergeable evaluations (``templates``, by output), the rows done reported to
    ``reporter`` when there is one. It carries the driver's S3 settings."""
    environment = s3_environment()

    def evaluate_partition(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        import pandas as pd

        from sparkdl.data.reader import batch_rows, iter_batches
        from sparkdl.evaluation import evaluation_from_dict

        apply_environment(environment)
        paths = [str(path) for frame in frames for path in frame["path"]]
        parts = {key: [evaluation_from_dict(d) for d in values]
                 for key, values in templates.items()}
        if paths:
            model = load_task_model(model_file, custom_objects, threads)
            with reporter.task() if reporter else contextlib.nullcontext() as done:
                for x, y, *_ in iter_batches(data_uri, paths, batch_size):  # rows unweighted
                    outputs = by_output(model, model.predict_on_batch(x), y)
                    for key, values in parts.items():
                        for evaluation in values:
                            evaluation.eval(*outputs[key])
                    if done is not None:
                        done.add(batch_rows(x))
        result = {key: [e.to_dict() for e in values] for key, values in parts.items()}
        yield pd.DataFrame({"result": [pickle.dumps(result)]})

    return evaluate_partition


def predict(
    spark_model: FittedModel,
    data: str | DataFrame,
    batch_size: int = 256,
    *,
    normalizer: Normalizer | dict[str, Any] | str | None = None,
    features_col: FeaturesCol | Mapping[str, FeaturesCol] = "features",
    label_kind: str | Mapping[str, str] | None = None,
    prediction_col: str = "prediction",
    probability_col: str = "probability",
) -> DataFrame:
    """Predict on a shard directory or a DataFrame; returns its rows with Spark ML columns.

    A model with several inputs or outputs (multi-input/output shards, or a DataFrame with
    ``features_col={input name: column}``, by default the columns named after the inputs)
    gets one ``<prediction_col>_<output>`` column per output and, for a class output,
    ``<probability_col>_<output>`` (:mod:`sparkdl.spark.predict_multi`); ``label_kind`` may
    then be a dict by output name.

    Classification: ``prediction`` (double, the class index) and ``probability`` (a Spark
    ML vector of the class probabilities). Regression: ``prediction`` is the model's
    output, a double for one output and a Spark ML vector for several. The kind is
    ``label_kind``, else the shards' or the last ``fit``'s, else inferred from the model
    (softmax or one-unit sigmoid output: classification). ``features_col`` is as in ``fit``.

    ``normalizer`` normalizes raw features on the executors before the model sees them,
    with the same math as the ETL (``Normalizer.apply_numpy``): a fitted normalizer, its
    ``to_config()`` dict, or a shard directory whose ``_sparkdl.json`` holds one, such as
    the shards the model was trained on. Shards written with a normalizer are already
    normalized: predict on them without one.
    """
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F

    from sparkdl.data.frames import (
        checked_features_column,
        features_column,
        infer_model_kind,
        model_feature_shape,
        model_output_width,
    )

    model = spark_model.model
    norm_config = normalizer_config(normalizer)
    model_file = spark_model.model_file(data if isinstance(data, str) else None)
    if isinstance(data, str):
        metadata = read_metadata(data)
        check_model_fits_shards(model, metadata, data, training=False)
        df = spark_model.spark.read.parquet(*[_join(data, f.path) for f in metadata.files])
        if metadata.multi:
            _no_normalizer(norm_config)
            return predict_multi(
                spark_model, df, [(t.name, F.col(t.name), t.shape) for t in metadata.inputs],
                output_kinds(model, label_kind, metadata), batch_size, prediction_col,
                probability_col, model_file=model_file)
        feature_shape = metadata.feature_shape
        kind = label_kind or metadata.label_kind
        features = features_column(df, "features")  # the shards' rows were checked when written
    elif is_dataframe(data) and is_multi_model(model):
        _no_normalizer(norm_config)
        return predict_multi(spark_model, data, dataframe_inputs(data, model, features_col),
                             output_kinds(model, label_kind, None), batch_size, prediction_col,
                             probability_col, model_file=model_file)
    elif is_dataframe(data):
        if isinstance(features_col, Mapping):
            raise ConfigurationError("predict(): features_col as a dict by input name is for "
                                     "models with several inputs")
        df, feature_shape = data, model_feature_shape(model)
        features = checked_features_column(df, features_col, feature_shape)
        fitted = spark_model.label_spec.kind if spark_model.label_spec else None
        kind = label_kind or fitted or infer_model_kind(model)
    else:
        raise ConfigurationError(
            "predict() takes a Spark DataFrame or the URI of a shard directory (str), "
            f"got {type(data).__name__}"
        )
    if isinstance(kind, Mapping):
        raise ConfigurationError("predict(): label_kind as a dict by output name is for "
                                 "models with several outputs")
    if kind not in ("class", "regression"):
        raise ConfigurationError(f"label_kind must be 'class' or 'regression', got {kind!r}")
    for name in (prediction_col, probability_col):
        if name in df.columns:
            raise DataError(f"predict(): the DataFrame already has a column {name!r}; "
                            "choose another output column name")
    udf = scores_udf(spark_model, feature_shape, batch_size, norm_config, model_file)
    inputs, scores = "__sparkdl_inputs", F.col("__sparkdl_scores")
    out = (df.withColumn(inputs, features)
           .withColumn("__sparkdl_scores", udf(F.col(inputs))))
    width = model_output_width(model)
    if kind == "regression":
        value = scores[0].cast("double") if width == 1 else array_to_vector(scores)
        out = out.withColumn(prediction_col, value)
    elif width == 1:  # a one-unit sigmoid: P(class 1)
        out = (out.withColumn(probability_col,
                              array_to_vector(F.array(1 - scores[0], scores[0])))
               .withColumn(prediction_col, (scores[0] >= 0.5).cast("double")))
    else:
        argmax = F.array_position(scores, F.array_max(scores)) - 1
        out = (out.withColumn(prediction_col, argmax.cast("double"))
               .withColumn(probability_col, array_to_vector(scores)))
    return out.drop(inputs, "__sparkdl_scores")


def _no_normalizer(norm_config: dict[str, Any] | None) -> None:
    if norm_config is not None:
        raise ConfigurationError(
            "predict(normalizer=...) normalizes one features tensor; a model with several "
            "inputs or outputs takes shards or columns already normalized"
        )


def scores_udf(
    spark_model: FittedModel, feature_shape: Sequence[int], batch_size: int,
    norm_config: dict[str, Any] | None, model_file: ModelRef | None = None,
) -> Any:
    """A pandas UDF: ``array<float>`` features → the model's output vector, on executors
    (``model_file``: the model's file, by default :meth:`FittedModel.model_file`)."""
    import numpy as np
    import pandas as pd
    from pyspark.sql.pandas.functions import PandasUDFType, pandas_udf

    from sparkdl.etl.normalizers import normalizer_from_config
    from sparkdl.session import task_cpus

    model_file = model_file or spark_model.model_file()
    threads, custom_objects = task_cpus(spark_model.spark), spark_model.custom_objects
    environment = s3_environment()
    shape = [int(d) for d in feature_shape]

    def predict_scores(batches: Iterator[pd.Series]) -> Iterator[pd.Series]:
        apply_environment(environment)
        model = load_task_model(model_file, custom_objects, threads)
        norm = normalizer_from_config(norm_config) if norm_config else None
        for features in batches:
            if len(features) == 0:
                yield pd.Series([], dtype=object)
                continue
            outputs: list[np.ndarray] = []
            for start in range(0, len(features), batch_size):
                part = features.iloc[start : start + batch_size]
                x = np.stack(part.to_numpy()).astype(np.float32)
                if norm is not None:
                    x = norm.apply_numpy(x)
                y = np.asarray(model.predict_on_batch(x.reshape(-1, *shape)))
                outputs.extend(y.reshape(len(part), -1).astype(np.float32))
            yield pd.Series(outputs, index=features.index)

    check_task_size(spark_model.spark, "predict()", predict_scores, custom_objects)
    with warnings.catch_warnings():  # the hints would be strings here (future annotations)
        warnings.simplefilter("ignore", UserWarning)
        udf = pandas_udf(predict_scores, "array<float>", PandasUDFType.SCALAR_ITER)
    # not deterministic for the optimizer: the model runs once per row, never twice
    return udf.asNondeterministic()


def normalizer_config(
    normalizer: Normalizer | dict[str, Any] | str | None,
) -> dict[str, Any] | None:
    """The ``to_config()`` dict of ``predict``'s ``normalizer`` argument, checked on the driver."""
    from sparkdl.etl.normalizers import Normalizer, normalizer_from_config

    if normalizer is None:
        return None
    if isinstance(normalizer, str):
        config = read_metadata(normalizer, verify=False).normalizer
        if not config:
            raise ConfigurationError(
                f"predict(normalizer={normalizer!r}): the shards' metadata holds no normalizer"
            )
    elif isinstance(normalizer, Normalizer):
        config = normalizer.to_config()
    elif isinstance(normalizer, dict):
        config = normalizer
    else:
        raise ConfigurationError(
            f"predict(normalizer=...) takes a Normalizer, its config dict or a shard directory, "
            f"got {type(normalizer).__name__}"
        )
    if not normalizer_from_config(config).fitted:
        raise ConfigurationError(
            f"predict(normalizer=...): the {config.get('class_name')} is not fitted"
        )
    return config


# Runs inside Spark tasks ------------------------------------------------------------------



def _join(uri: str, relative: str) -> str:
    """``uri/relative`` as Spark reads it."""
    return spark_uri(uri.rstrip("/") + "/" + relative)


__all__ = ["evaluate", "normalizer_config", "predict", "scores_udf"]
