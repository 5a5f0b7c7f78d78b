"""SparkModel: fit, evaluate and predict a Keras model on Spark (DL4J's SparkDl4jMultiLayer).

A facade: ``fit`` writes a DataFrame as shards and runs the shared driver
(:mod:`sparkdl.training.driver`) with a :class:`~sparkdl.spark.launcher.SparkLauncher`, one
barrier-mode task per worker (:mod:`sparkdl.spark.task`). Rank 0's trained model comes back
to the driver.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sparkdl.config import ClusterConfig
from sparkdl.data.files import read_metadata
from sparkdl.errors import ConfigurationError, DataError
from sparkdl.evaluation import evaluation_from_dict
from sparkdl.evaluation.plan import EvaluationRequest, by_output, evaluation_plan
from sparkdl.storage import spark_uri
from sparkdl.training.elastic import ElasticPolicy
from sparkdl.training.launcher import KerasFit
from sparkdl.training.masters import TrainingMaster
from sparkdl.training.model_check import check_model_fits_shards

if TYPE_CHECKING:
    import keras
    from pyspark.sql import DataFrame, SparkSession

    from sparkdl.data.frames import FeaturesCol, LabelSpec
    from sparkdl.etl.normalizers import Normalizer
    from sparkdl.spark.launcher import SparkLauncher
    from sparkdl.training.driver import FitResult

log = logging.getLogger("sparkdl")


class SparkModel(KerasFit):
    """Train a compiled Keras model on Spark with a training master.

    >>> tm = SharedTrainingMaster(batch_size_per_worker=32, num_workers=2)
    >>> spark_model = SparkModel(spark, keras_model, tm)
    >>> spark_model.fit("file:///data/train", epochs=10)
    >>> print(spark_model.evaluate("file:///data/test").stats())

    ``fit``, ``evaluate`` and ``predict`` also take DataFrames (Spark ML vector, array or
    numeric feature columns): ``spark_model.fit(df, features_col="features",
    label_col="label")`` writes ``df`` as shards into a run store
    (:mod:`sparkdl.data.store`) and trains on them.
    """

    def __init__(
        self,
        spark: SparkSession,
        model: keras.Model,
        training_master: TrainingMaster,
        *,
        cluster: ClusterConfig | None = None,
        custom_objects: dict[str, Any] | None = None,
        elastic: ElasticPolicy | None = None,
        task_cpus: int | None = None,
        task_gpus: float | None = None,
    ) -> None:
        """``task_cpus`` / ``task_gpus`` (default: ``cluster.task_cpus`` / ``task_gpus``) put
        a ResourceProfile on the training stage only (stage-level scheduling)."""
        if getattr(model, "optimizer", None) is None or not getattr(model, "compiled", True):
            raise ConfigurationError("the Keras model must be compiled (model.compile(...))")
        if elastic is not None:
            if not isinstance(elastic, ElasticPolicy):
                raise ConfigurationError(
                    f"elastic must be an ElasticPolicy, got {type(elastic).__name__}"
                )
            elastic.check(training_master.num_workers)
        self.elastic = elastic
        self.spark = spark
        self.model = model
        self.training_master = training_master
        self.cluster = cluster or ClusterConfig()
        self.task_cpus = task_cpus
        self.task_gpus = task_gpus
        self.custom_objects = custom_objects
        self.last_fit: FitResult | None = None
        self.label_spec: LabelSpec | None = None  # what fit() learned about the labels

    # Training --------------------------------------------------------------------------

    def fit(  # type: ignore[override]
        self,
        data: str | DataFrame,
        epochs: int = 1,
        *,
        features_col: FeaturesCol = "features",
        label_col: str = "label",
        label_kind: str | None = None,
        store: str | None = None,
        keep_shards: bool = False,
        validation_data: str | DataFrame | None = None,
        sample_weight_col: str | None = None,
        **kwargs: Any,
    ) -> FitResult:
        """Train on a shard directory URI or a DataFrame, as Keras's ``Model.fit`` does.

        With ``elastic`` (an :class:`~sparkdl.training.elastic.ElasticPolicy`) a failed
        training stage is relaunched with the task slots still available (at least
        ``min_workers``), resuming from the latest checkpoint: ``checkpoint_dir`` is required.

        A DataFrame is written once as shards into the run store ``store`` (a filesystem URI;
        default: a temporary directory, local masters only) and reused when the same
        DataFrame is fitted or evaluated again and provably the same data
        (:mod:`sparkdl.data.fingerprint`); the last process using the shards deletes them when
        it exits unless ``keep_shards=True``. ``features_col`` names a Spark ML
        vector column, an ``array<numeric>`` column or numeric column(s); ``label_kind``
        (``"class"`` / ``"regression"``) overrides the inferred kind (see
        :mod:`sparkdl.data.frames`). ``validation_data`` may be a DataFrame too.
        ``sample_weight_col`` names a numeric column of per-row sample weights (Keras's
        ``sample_weight``, Horovod's ``sample_weight_col``), of the training DataFrame and of a
        validation DataFrame. The other arguments are :meth:`KerasFit.fit`'s.
        """
        if self.elastic is not None and not kwargs.get("checkpoint_dir"):
            raise ConfigurationError(
                "an elastic fit resumes from checkpoints: set checkpoint_dir "
                "(training.checkpoint_dir)"
            )
        if _is_dataframe(data):
            self.label_spec = None
            data = self._shards_of(data, features_col, label_col, label_kind, store, keep_shards,
                                   weight_col=sample_weight_col)
        elif isinstance(data, str):
            meta = read_metadata(data)
            from sparkdl.data.frames import LabelSpec

            self.label_spec = LabelSpec(meta.label_kind, list(meta.classes))
        else:
            raise ConfigurationError(
                "fit() takes a Spark DataFrame or the URI of a shard directory (str), "
                f"got {type(data).__name__}"
            )
        if _is_dataframe(validation_data):
            validation_data = self._shards_of(
                validation_data, features_col, label_col, label_kind, store, keep_shards,
                what="fit(validation_data)", weight_col=sample_weight_col,
            )
        return super().fit(data, epochs, validation_data=validation_data, **kwargs)

    def _shards_of(
        self, df: DataFrame, features_col: FeaturesCol, label_col: str,
        label_kind: str | None, store: str | None, keep_shards: bool, *, what: str = "fit()",
        weight_col: str | None = None,
    ) -> str:
        """Shards of ``df`` in the run store, written if the store has none for it yet; a
        failure while Spark computes ``df`` is one :class:`DataError` naming ``what``."""
        from sparkdl.data.spark_errors import dataframe_errors

        with dataframe_errors(what):
            return self._write_shards_of(df, features_col, label_col, label_kind, store,
                                         keep_shards, weight_col)

    def _write_shards_of(
        self, df: DataFrame, features_col: FeaturesCol, label_col: str,
        label_kind: str | None, store: str | None, keep_shards: bool,
        weight_col: str | None = None,
    ) -> str:
        from sparkdl.data.frames import label_spec, model_feature_shape, training_frame
        from sparkdl.data.store import fingerprint, open_store
        from sparkdl.data.writer import write_shards
        from sparkdl.spark.session import master

        run_store = open_store(store, keep=keep_shards)
        run_store.check_reachable(master(self.spark))
        fitted = self.label_spec
        spec = label_spec(df, label_col, self.model, label_kind or (fitted and fitted.kind),
                          fitted.classes if fitted and fitted.kind == "class" else None)
        frame = training_frame(df, features_col, label_col, spec, weight_col)
        feature_shape = model_feature_shape(self.model)
        num_workers = self.training_master.num_workers
        options = {"label": spec.get_config(), "feature_shape": feature_shape,
                   "num_workers": num_workers, "sample_weight": weight_col is not None}
        uri = run_store.shards(
            fingerprint(frame, options),
            lambda target: write_shards(
                frame, target, feature_shape=feature_shape, label_kind=spec.kind,
                classes=spec.classes, num_workers=num_workers,
                sample_weight=weight_col is not None,
            ),
        )
        self.label_spec = self.label_spec or spec
        return uri

    def _launcher(self) -> SparkLauncher:
        from sparkdl.spark.launcher import SparkLauncher

        return SparkLauncher(self.spark, self.cluster, mode=self.training_master.mode,
                             elastic=self.elastic, task_cpus=self.task_cpus,
                             task_gpus=self.task_gpus)

    def _channel_settings(self) -> dict[str, Any]:
        from sparkdl.comm.network import parse_port_range

        return {"timeout_s": self.cluster.timeout_s,
                "port_range": parse_port_range(self.cluster.port_range)}

    def _task_cpus(self) -> int:
        from sparkdl.spark.session import task_cpus

        return task_cpus(self.spark)

    # Evaluation and inference ----------------------------------------------------------

    def evaluate(
        self,
        data: str | DataFrame,
        batch_size: int = 256,
        *,
        evaluations: EvaluationRequest | None = None,
        features_col: FeaturesCol = "features",
        label_col: str = "label",
        store: str | None = None,
        keep_shards: bool = False,
    ) -> Any:
        """Evaluate the current model on a shard directory or a DataFrame, on the executors,
        in one pass.

        Args:
            data: the shard directory, or a DataFrame whose labels are read as in :meth:`fit`
                (string labels map to the classes ``fit`` saw); its shards go to the run
                store ``store`` (kept with ``keep_shards``).
            batch_size: rows per prediction batch.
            evaluations: ``None`` for the default evaluation of the labels (an
                :class:`~sparkdl.evaluation.Evaluation` for classes, a
                :class:`~sparkdl.evaluation.RegressionEvaluation` for regression targets),
                returned alone. Or a list of evaluations and/or registered names
                (``["classification", "roc", "top_n:5"]``): all are computed in the same pass
                and returned merged, as a list in the same order. For shards with several
                outputs, a dict of such lists by output name (a missing output gets its
                default); the result is then a dict by output name.
            features_col, label_col: the DataFrame's columns (as in :meth:`fit`).

        Every row counts once: the DL4J-style evaluations take no sample weights (a weighted
        loss and weighted compiled metrics come from ``fit(validation_data=...)``).
        """
        from sparkdl.training.serialization import model_to_bytes

        if _is_dataframe(data):
            data = self._shards_of(data, features_col, label_col, None, store, keep_shards,
                                   what="evaluate()")
        elif not isinstance(data, str):
            raise ConfigurationError(
                "evaluate() takes a Spark DataFrame or the URI of a shard directory (str), "
                f"got {type(data).__name__}"
            )
        data_uri = data
        metadata = read_metadata(data_uri)
        check_model_fits_shards(self.model, metadata, data_uri, training=False)
        plan = evaluation_plan(metadata, evaluations)
        templates = {key: [e.to_dict() for e in values] for key, values in plan.items()}
        sc = self.spark.sparkContext
        model_broadcast = sc.broadcast(model_to_bytes(self.model))
        files = [f.path for f in metadata.files]
        threads = self._task_cpus()
        custom_objects = self.custom_objects

        def evaluate_partition(paths):
            from sparkdl.data.reader import iter_batches
            from sparkdl.evaluation import evaluation_from_dict

            paths = list(paths)
            parts = {key: [evaluation_from_dict(d) for d in values]
                     for key, values in templates.items()}
            if paths:
                model = _load_task_model(model_broadcast.value, custom_objects, threads)
                for x, y, *_ in iter_batches(data_uri, paths, batch_size):  # rows unweighted
                    outputs = by_output(model, model.predict_on_batch(x), y)
                    for key, values in parts.items():
                        for evaluation in values:
                            evaluation.eval(*outputs[key])
            yield {key: [e.to_dict() for e in values] for key, values in parts.items()}

        try:
            results = (
                sc.parallelize(files, max(1, min(len(files), sc.defaultParallelism)))
                .mapPartitions(evaluate_partition)
                .collect()
            )
        finally:
            model_broadcast.unpersist()
        for result in results:
            for key, values in plan.items():
                for total, part in zip(values, result[key], strict=True):
                    total.merge(evaluation_from_dict(part))
        if evaluations is None and not metadata.multi:
            return plan[None][0]
        if not metadata.multi:
            return plan[None]
        return plan if evaluations is not None else {k: v[0] for k, v in plan.items()}

    def predict(
        self,
        data: str | DataFrame,
        batch_size: int = 256,
        *,
        normalizer: Normalizer | dict[str, Any] | str | None = None,
        features_col: FeaturesCol = "features",
        label_kind: str | None = None,
        prediction_col: str = "prediction",
        probability_col: str = "probability",
    ) -> DataFrame:
        """Predict on a shard directory or a DataFrame; returns its rows with Spark ML columns.

        Classification: ``prediction`` (double, the class index) and ``probability`` (a Spark
        ML vector of the class probabilities). Regression: ``prediction`` is the model's
        output, a double for one output and a Spark ML vector for several. The kind is
        ``label_kind``, else the shards' or the last ``fit``'s, else inferred from the model
        (softmax or one-unit sigmoid output: classification). ``features_col`` is as in
        :meth:`fit`.

        ``normalizer`` normalizes raw features on the executors before the model sees them,
        with the same math as the ETL (``Normalizer.apply_numpy``): a fitted normalizer, its
        ``to_config()`` dict, or a shard directory whose ``_sparkdl.json`` holds one, such as
        the shards the model was trained on. Shards written with a normalizer are already
        normalized: predict on them without one.
        """
        from pyspark.ml.functions import array_to_vector
        from pyspark.sql import functions as F

        from sparkdl.data.frames import features_column, infer_model_kind, model_output_width

        norm_config = _normalizer_config(normalizer)
        if isinstance(data, str):
            metadata = read_metadata(data)
            if metadata.multi:
                raise ConfigurationError(
                    f"predict() on {data}: shards with several inputs and outputs are not "
                    "supported yet; evaluate() them, or predict with the Keras model on "
                    "sparkdl.data.reader.read_all(...)"
                )
            check_model_fits_shards(self.model, metadata, data, training=False)
            df = self.spark.read.parquet(*[_join(data, f.path) for f in metadata.files])
            feature_shape = metadata.feature_shape
            kind = label_kind or metadata.label_kind
        elif _is_dataframe(data):
            df = data
            feature_shape = [int(d) for d in self.model.input_shape[1:]]
            fitted = self.label_spec.kind if self.label_spec else None
            kind = label_kind or fitted or infer_model_kind(self.model)
        else:
            raise ConfigurationError(
                "predict() takes a Spark DataFrame or the URI of a shard directory (str), "
                f"got {type(data).__name__}"
            )
        if kind not in ("class", "regression"):
            raise ConfigurationError(f"label_kind must be 'class' or 'regression', got {kind!r}")
        for name in (prediction_col, probability_col):
            if name in df.columns:
                raise DataError(f"predict(): the DataFrame already has a column {name!r}; "
                                "choose another output column name")
        scores_udf = self._scores_udf(feature_shape, batch_size, norm_config)
        inputs, scores = "__sparkdl_inputs", F.col("__sparkdl_scores")
        out = (df.withColumn(inputs, features_column(df, features_col))
               .withColumn("__sparkdl_scores", scores_udf(F.col(inputs))))
        width = model_output_width(self.model)
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

    def _scores_udf(
        self, feature_shape: Sequence[int], batch_size: int, norm_config: dict[str, Any] | None
    ) -> Any:
        """A pandas UDF: ``array<float>`` features → the model's output vector, on executors."""
        import warnings

        import numpy as np
        import pandas as pd
        from pyspark.sql.functions import PandasUDFType, pandas_udf

        from sparkdl.etl.normalizers import normalizer_from_config
        from sparkdl.training.serialization import model_to_bytes

        model_broadcast = self.spark.sparkContext.broadcast(model_to_bytes(self.model))
        threads, custom_objects = self._task_cpus(), self.custom_objects
        shape = [int(d) for d in feature_shape]

        def predict_scores(batches):  # Iterator[pd.Series] -> Iterator[pd.Series]
            model = _load_task_model(model_broadcast.value, custom_objects, threads)
            norm = normalizer_from_config(norm_config) if norm_config else None
            for features in batches:
                if len(features) == 0:
                    yield pd.Series([], dtype=object)
                    continue
                outputs = []
                for start in range(0, len(features), batch_size):
                    part = features.iloc[start : start + batch_size]
                    x = np.stack(part.to_numpy()).astype(np.float32)
                    if norm is not None:
                        x = norm.apply_numpy(x)
                    y = np.asarray(model.predict_on_batch(x.reshape(-1, *shape)))
                    outputs.extend(y.reshape(len(part), -1).astype(np.float32))
                yield pd.Series(outputs, index=features.index)

        with warnings.catch_warnings():  # the hints would be strings here (future annotations)
            warnings.simplefilter("ignore", UserWarning)
            udf = pandas_udf(predict_scores, "array<float>", PandasUDFType.SCALAR_ITER)
        # not deterministic for the optimizer: the model runs once per row, never twice
        return udf.asNondeterministic()


def _normalizer_config(
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

_TASK_MODELS: dict[int, Any] = {}


def _load_task_model(model_bytes: bytes, custom_objects: Any, threads: int) -> Any:
    """Load a broadcast model once per Python worker process."""
    from sparkdl.gpu import pin_gpus, task_gpu_addresses

    pin_gpus(task_gpu_addresses(), role="model")  # before anything imports TensorFlow
    from sparkdl.training.serialization import model_from_bytes
    from sparkdl.training.worker import configure_tensorflow

    key = hash(model_bytes)
    if key not in _TASK_MODELS:
        configure_tensorflow(threads)
        _TASK_MODELS.clear()
        _TASK_MODELS[key] = model_from_bytes(model_bytes, custom_objects)
    return _TASK_MODELS[key]


# Driver-side helpers ------------------------------------------------------------------------


def _is_dataframe(data: Any) -> bool:
    from pyspark.sql import DataFrame

    return isinstance(data, DataFrame)


def _join(uri: str, relative: str) -> str:
    """``uri/relative`` as Spark reads it."""
    return spark_uri(uri.rstrip("/") + "/" + relative)


__all__ = ["SparkModel"]
