"""SparkModel: fit, evaluate and predict a Keras model on Spark (DL4J's SparkDl4jMultiLayer).

A facade: ``fit`` writes a DataFrame as shards and runs the shared driver
(:mod:`sparkdl.training.driver.run_fit`) with a :class:`~sparkdl.spark.launcher.SparkLauncher`, one
barrier-mode task per worker (:mod:`sparkdl.spark.task`). Rank 0's trained model comes back
to the driver.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from sparkdl.config import ClusterConfig
from sparkdl.data.files import read_metadata
from sparkdl.data.frames import is_dataframe
from sparkdl.errors import ConfigurationError
from sparkdl.evaluation.plan import EvaluationRequest
from sparkdl.training.driver.keras_fit import KerasFit
from sparkdl.training.driver.launcher import ChannelSettings
from sparkdl.training.elastic import ElasticPolicy
from sparkdl.training.masters import TrainingMaster

if TYPE_CHECKING:
    from collections.abc import Mapping

    import keras
    from pyspark.sql import DataFrame, SparkSession

    from sparkdl.data.frames import FeaturesCol, LabelSpec
    from sparkdl.etl.normalizers import Normalizer
    from sparkdl.fit_options import FitOptions
    from sparkdl.spark.launcher import SparkLauncher
    from sparkdl.training.driver.run_fit import FitResult
    from sparkdl.training.model_files import ModelRef

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
        store: str | None = None,
    ) -> None:
        """``task_cpus`` / ``task_gpus`` (default: ``cluster.task_cpus`` / ``task_gpus``) put
        a ResourceProfile on the training stage only (stage-level scheduling).

        ``store`` (a filesystem URI every executor reads: ``hdfs://``, ``s3://``, a shared
        ``file://`` path) is the run store: the shards written from DataFrames, and the
        model files the executors load to train, evaluate and predict (the model never rides
        in a Spark message). Default: a temporary directory on local masters; on a cluster
        the checkpoint directory or the shard directory for a fit, and for the shards of a
        DataFrame a store is required. ``fit``'s and ``evaluate``'s ``store`` override it for
        that call's shards (and a fit's model)."""
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
        self.store = store
        self._fit_store: str | None = None  # the store of the fit running now
        self.last_fit: FitResult | None = None
        self.label_spec: LabelSpec | None = None  # what fit() learned about the labels

    # Training --------------------------------------------------------------------------

    def fit(
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
        self._check_elastic(kwargs.get("checkpoint_dir"))  # before any shards are written
        store = store or self.store
        if is_dataframe(data):
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
        if is_dataframe(validation_data):
            validation_data = self._shards_of(
                validation_data, features_col, label_col, label_kind, store, keep_shards,
                what="fit(validation_data)", weight_col=sample_weight_col,
            )
        self._fit_store = store
        try:
            return super().fit(data, epochs, validation_data=validation_data, **kwargs)
        finally:
            self._fit_store = None

    def fit_with(self, data: str, options: FitOptions) -> FitResult:
        self._check_elastic(options.checkpoint_dir)
        return super().fit_with(data, options)

    def _check_elastic(self, checkpoint_dir: str | None) -> None:
        if self.elastic is not None and not checkpoint_dir:
            raise ConfigurationError(
                "an elastic fit resumes from checkpoints: set checkpoint_dir "
                "(training.checkpoint_dir)"
            )

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
        from sparkdl.data.frames import (
            check_schema_width,
            label_spec,
            model_feature_shape,
            training_frame,
        )
        from sparkdl.data.store import fingerprint
        from sparkdl.data.writer import write_shards
        from sparkdl.run_layout import RunLayout
        from sparkdl.session import master

        run_store = RunLayout(store_dir=store).run_store(keep=keep_shards)
        run_store.check_reachable(master(self.spark))
        fitted = self.label_spec
        kind = label_kind or (fitted.kind if fitted else None)
        spec = label_spec(df, label_col, self.model, kind,
                          fitted.classes if fitted and fitted.kind == "class" else None)
        frame = training_frame(df, features_col, label_col, spec, weight_col)
        feature_shape = model_feature_shape(self.model)
        check_schema_width(df, features_col, feature_shape)  # the rows: write_shards checks
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
                             task_gpus=self.task_gpus, store=self._fit_store or self.store)

    def _channel_settings(self) -> ChannelSettings:
        from sparkdl.comm.network import parse_port_range

        return ChannelSettings(self.cluster.timeout_s, parse_port_range(self.cluster.port_range))

    # Evaluation and inference (sparkdl.spark.inference) -------------------------------

    def model_file(self, data_uri: str | None = None) -> ModelRef:
        """The file every executor loads the model from (:mod:`sparkdl.training.model_files`):
        rank 0's after a fit while the model is unchanged, else the model written now into
        the store (:func:`sparkdl.spark.model_store.inference_model_file`; ``data_uri``: the
        shards at hand, whose directory serves on a cluster without a store; with none,
        Spark distributes the file)."""
        from sparkdl.spark.model_store import inference_model_file

        return inference_model_file(self.spark, self.model, self.store, data_uri)

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
        verbose: int | str = "auto",
    ) -> Any:
        """Evaluate on a shard directory or a DataFrame, on the executors, in one pass.

        Args:
            data: the shard directory, or a DataFrame whose labels are read as in ``fit``
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
            features_col: the DataFrame's feature column(s) (as in ``fit``).
            label_col: the DataFrame's label column (as in ``fit``).
            verbose: as Keras's ``evaluate``: 1 draws a bar of the rows evaluated so far (the
                tasks report them to the driver), 0 and 2 draw none; ``"auto"`` is 1 in a
                terminal or notebook.
        """
        from sparkdl.spark import inference
        from sparkdl.training.driver.progress import resolve_verbose

        show_bar = resolve_verbose(verbose) == 1
        if is_dataframe(data):
            data = self._shards_of(data, features_col, label_col, None, store or self.store,
                                   keep_shards, what="evaluate()")
        return inference.evaluate(self, data, batch_size, evaluations=evaluations,
                                  show_progress=show_bar, cluster=self.cluster)

    def predict(
        self,
        data: str | DataFrame,
        batch_size: int = 256,
        *,
        normalizer: Normalizer | dict[str, Any] | str | None = None,
        features_col: FeaturesCol | Mapping[str, FeaturesCol] = "features",
        label_kind: str | Mapping[str, str] | None = None,
        prediction_col: str = "prediction",
        probability_col: str = "probability",
    ) -> DataFrame:
        """Predict on a shard directory or a DataFrame; its rows with Spark ML columns, one
        ``<prediction_col>_<output>`` per output of a multi-output model
        (:func:`sparkdl.spark.inference.predict`)."""
        from sparkdl.spark import inference

        return inference.predict(
            self, data, batch_size, normalizer=normalizer, features_col=features_col,
            label_kind=label_kind, prediction_col=prediction_col,
            probability_col=probability_col,
        )


# Driver-side helpers ------------------------------------------------------------------------


__all__ = ["SparkModel"]
