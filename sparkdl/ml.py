"""Spark ML: :class:`KerasEstimator` fits a Keras model on Spark and returns a
:class:`KerasModel` Transformer; both work inside ``pyspark.ml.Pipeline`` and round-trip
through ``save`` / ``load``.

>>> pipeline = Pipeline(stages=[
...     StringIndexer(inputCol="species", outputCol="label"),
...     VectorAssembler(inputCols=["a", "b", "c", "d"], outputCol="features"),
...     KerasEstimator(model=keras_model, epochs=5, trainingConfig={"mode": "dense"}),
... ])
>>> fitted = pipeline.fit(train_df); fitted.transform(test_df)  # prediction, probability

A saved stage is a directory: Spark ML's ``metadata/`` (class and Params, JSON) plus
``model.keras`` (the Keras model: the untrained one for an estimator, the trained one for a
model) and, when ``customObjects`` is set, ``custom_objects.pkl``: the custom layers and
losses by value (cloudpickle), so that a class defined in a notebook loads in a new process.
The metadata names those objects (``sparkdlCustomObjects``): ``load`` unpickles
``custom_objects.pkl`` only when the metadata declares it, and refuses a stage holding one it
does not declare. Unpickling runs code: load only stages you trust.
"""

from __future__ import annotations

import logging
import pickle
import threading
import uuid
import zipfile
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs
from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (
    HasFeaturesCol,
    HasLabelCol,
    HasPredictionCol,
    HasProbabilityCol,
)
from pyspark.ml.util import (
    DefaultParamsReader,
    DefaultParamsWriter,
    MLReadable,
    MLReader,
    MLWritable,
    MLWriter,
)

from sparkdl.config import TrainingConfig, describe_validation_error
from sparkdl.data.metadata import join, resolve
from sparkdl.errors import ConfigurationError, DataError
from sparkdl.run_output import MODEL_FILE
from sparkdl.storage import move_dir

if TYPE_CHECKING:
    import keras
    from pyspark.sql import DataFrame

    from sparkdl.training.driver.run_fit import FitResult

_NOT_SAVED = ("customObjects", "callbacks")  # by value beside the metadata, or not at all
CUSTOM_OBJECTS_FILE = "custom_objects.pkl"
#: The stage metadata's key naming the custom objects its save pickled: ``load`` unpickles
#: ``custom_objects.pkl`` only when it is there.
CUSTOM_OBJECTS_KEY = "sparkdlCustomObjects"

log = logging.getLogger("sparkdl")


class _SharedShards:
    """The shards one ``fitMultiple`` wrote, by write options; thread-safe (Spark ML's
    ``parallelism`` fits several param maps at once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._shards: dict[Hashable, Any] = {}

    def get(self, key: Hashable, write: Callable[[], Any]) -> Any:
        with self._lock:
            if key not in self._shards:
                self._shards[key] = write()
            return self._shards[key]


def _to_validation(value: Any) -> float | str:
    """``validation``: a fraction in [0, 1) or a column name."""
    if isinstance(value, str):
        return value
    fraction = TypeConverters.toFloat(value)
    if not 0 <= fraction < 1:
        raise TypeError(f"validation must be a fraction in [0, 1) or a column name, got {value!r}")
    return fraction


def _to_class_weight(value: Any) -> dict[int, float]:
    """``classWeight``: ``{class index: weight}`` (keys may arrive as strings from JSON)."""
    if not isinstance(value, dict):
        raise TypeError(f"classWeight must be a dict {{class index: weight}}, got {value!r}")
    try:
        return {int(k): float(v) for k, v in value.items()}
    except (TypeError, ValueError):
        raise TypeError(f"classWeight must map class indices to numbers, got {value!r}") from None


def _to_training_config(value: Any) -> dict[str, Any]:
    """``trainingConfig``: the ``training`` section of a job configuration, as a dict."""
    if not isinstance(value, dict):
        raise TypeError("trainingConfig must be a dict (the training section of a job "
                        f"configuration), got {value!r}")
    return value


def _to_callbacks(value: Any) -> list[Any]:
    """``callbacks``: Keras callbacks, in a list or tuple."""
    import keras

    if not isinstance(value, (list, tuple)):
        raise TypeError(f"callbacks must be a list of keras.callbacks.Callback, got {value!r}")
    for callback in value:
        if not isinstance(callback, keras.callbacks.Callback):
            raise TypeError("callbacks must be a list of keras.callbacks.Callback, got a "
                            f"{type(callback).__name__} in it")
    return list(value)


def _to_custom_objects(value: Any) -> dict[str, Any]:
    """``customObjects``: ``{name: class or function}``, as ``keras.models.load_model``
    takes them."""
    if not isinstance(value, dict):
        raise TypeError(f"customObjects must be a dict {{name: class or function}}, got "
                        f"{value!r}")
    for name in value:
        if not isinstance(name, str):
            raise TypeError(f"customObjects names must be strings, got {name!r}")
    return value


class _HasLabelKind(Params):
    labelKind = Param(
        Params._dummy(), "labelKind",
        "'class', 'regression', or 'auto' (inferred from the label column and the model)",
        typeConverter=TypeConverters.toString,
    )

    def getLabelKind(self) -> str:
        return self.getOrDefault(self.labelKind)


class _KerasParams(HasFeaturesCol, HasPredictionCol, HasProbabilityCol, _HasLabelKind):
    """Params both stages share; ``model`` is the Keras model they hold (not a Param)."""

    model: keras.Model
    customObjects = Param(
        Params._dummy(), "customObjects",
        "custom Keras objects by name (layers, losses, ...), as keras.models.load_model takes "
        "them; shipped to the workers and saved by value (cloudpickle)",
        typeConverter=_to_custom_objects,
    )

    def getCustomObjects(self) -> dict[str, Any]:
        return dict(self.getOrDefault(self.customObjects) or {})

    def _check_model(self, model: Any) -> None:
        if model is None or not hasattr(model, "predict_on_batch"):
            raise ConfigurationError(
                f"{type(self).__name__} needs a compiled keras.Model as model=, "
                f"got {type(model).__name__}"
            )

    def write(self) -> MLWriter:
        return _KerasStageWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        return _KerasStageReader(cls)


class KerasEstimator(_KerasParams, HasLabelCol, Estimator, MLWritable, MLReadable):
    """Fits a compiled Keras model on Spark with sparkdl's training masters.

    Params: ``featuresCol`` (a vector or array column; default ``features``), ``labelCol``
    (``label``), ``predictionCol``, ``probabilityCol``, ``epochs``, ``batchSize`` (per
    worker), ``trainingConfig`` (the ``training`` section of a job configuration as a dict:
    ``mode``, ``num_workers``, ``threshold``, ..., ``store``; ``epochs`` and ``batchSize``
    override its values when set; its default ``mode`` is ``auto``: dense for a model of at
    most 65,536 trainable parameters, gradient sharing above), ``labelKind``, ``store`` (the
    run store URI; default ``trainingConfig["store"]``, else a temporary directory),
    ``keepShards``, ``verbose``, ``customObjects`` (the model's custom layers, losses, ... by
    name; the fitted :class:`KerasModel` keeps them).
    ``learningRate`` (the optimizer's learning rate for this fit; default: the model's),
    ``callbacks`` (Keras callbacks run on the driver, as in ``SparkModel.fit``; not saved),
    ``validation`` (a fraction of the rows held out by a seeded random split, or the name
    of a boolean column whose true rows are held out; the fit reports ``val_*``),
    ``sampleWeightCol`` (a numeric column of per-row sample weights), ``classWeight``
    (``{class index: weight}``, Keras's ``class_weight``).
    The model passed in is never changed: each ``fit`` trains a copy. Tuning: the stage works
    in ``CrossValidator`` / ``TrainValidationSplit`` with a ``ParamGridBuilder`` over any of
    these Params; fits of the same rows reuse one written copy of them in the run store.
    """

    epochs = Param(Params._dummy(), "epochs", "number of epochs",
                   typeConverter=TypeConverters.toInt)
    batchSize = Param(Params._dummy(), "batchSize", "minibatch size per worker",
                      typeConverter=TypeConverters.toInt)
    trainingConfig = Param(Params._dummy(), "trainingConfig",
                           "the training section of a sparkdl job configuration (dict)",
                           typeConverter=_to_training_config)
    store = Param(Params._dummy(), "store", "run store URI for the shards ('' = default)",
                  typeConverter=TypeConverters.toString)
    keepShards = Param(Params._dummy(), "keepShards", "keep the shards after the process",
                       typeConverter=TypeConverters.toBoolean)
    verbose = Param(Params._dummy(), "verbose", "0 silent, 1 progress bar, 2 line per epoch",
                    typeConverter=TypeConverters.toInt)
    learningRate = Param(Params._dummy(), "learningRate",
                         "the optimizer's learning rate (0 = the model's own)",
                         typeConverter=TypeConverters.toFloat)
    callbacks = Param(Params._dummy(), "callbacks",
                      "Keras callbacks run on the driver during the fit (not saved)",
                      typeConverter=_to_callbacks)
    validation = Param(Params._dummy(), "validation",
                       "held-out rows: a fraction in (0, 1), or a boolean column's name "
                       "(true rows held out); 0 or '' = none", typeConverter=_to_validation)
    sampleWeightCol = Param(Params._dummy(), "sampleWeightCol",
                            "numeric column of per-row sample weights ('' = none)",
                            typeConverter=TypeConverters.toString)
    classWeight = Param(Params._dummy(), "classWeight",
                        "{class index: weight}, Keras's class_weight",
                        typeConverter=_to_class_weight)
    seed = Param(Params._dummy(), "seed", "seed of the validation split",
                 typeConverter=TypeConverters.toInt)

    def __init__(self, model: keras.Model | None = None, **params: Any) -> None:
        super().__init__()
        self._check_model(model)
        self.model = model
        self._setDefault(featuresCol="features", labelCol="label", predictionCol="prediction",
                         probabilityCol="probability", labelKind="auto", epochs=10,
                         batchSize=32, trainingConfig={}, store="", keepShards=False,
                         verbose=0, customObjects={}, learningRate=0.0, callbacks=[],
                         validation=0.0, sampleWeightCol="", classWeight={}, seed=0)
        self._set(**params)

    def training_config(self) -> TrainingConfig:
        """``trainingConfig`` validated, with ``epochs`` / ``batchSize`` applied when set."""
        from pydantic import ValidationError

        data = dict(self.getOrDefault(self.trainingConfig) or {})
        if self.isSet(self.epochs):
            data["epochs"] = self.getOrDefault(self.epochs)
        if self.isSet(self.batchSize):
            data["batch_size_per_worker"] = self.getOrDefault(self.batchSize)
        try:
            return TrainingConfig.model_validate(data)
        except ValidationError as exc:
            raise ConfigurationError(
                describe_validation_error(exc, "KerasEstimator.trainingConfig")
            ) from None

    def fit_options(self, training: TrainingConfig) -> dict[str, Any]:
        """``fit``'s options: every one ``trainingConfig`` holds (its ``epochs``, ``shuffle``,
        ``prefetch``, ``checkpoint_dir``, ``accumulate_steps``, ...), with the ``verbose``,
        ``classWeight`` and ``callbacks`` Params; ``verbose`` is the Param's (default 0: an
        estimator is quiet) unless only ``trainingConfig`` names it."""
        from sparkdl.fit_options import YAML_KEYS

        options = training.fit_options(
            callbacks=list(self.getOrDefault(self.callbacks) or []) or None)
        keywords = {name: getattr(options, name) for name in YAML_KEYS}
        keywords["callbacks"] = options.callbacks
        if self.isSet(self.verbose) or "verbose" not in self.getOrDefault(self.trainingConfig):
            keywords["verbose"] = self.getOrDefault(self.verbose)
        if self.getOrDefault(self.classWeight):
            keywords["class_weight"] = self.getOrDefault(self.classWeight)
        return keywords

    def fitMultiple(
        self, dataset: DataFrame, paramMaps: Sequence[dict[Param, Any]],
    ) -> Iterator[tuple[int, KerasModel]]:
        """Spark ML's ``fitMultiple`` (what ``CrossValidator`` / ``TrainValidationSplit`` call
        per fold): the fits of the grid write ``dataset``'s shards once per set of write
        options (columns, label kind, weights, validation split, store, worker count) and share
        them. Spark ML caches a fold's rows, and the run store's fingerprint never reuses a
        cached DataFrame, so without this every fit of the grid would write its own copy."""
        from pyspark.ml.base import _FitMultipleIterator

        estimator = self.copy()
        shared = _SharedShards()

        def fit_one(index: int) -> KerasModel:
            return estimator.copy(paramMaps[index])._fit(dataset, shared)

        return _FitMultipleIterator(fit_one, len(paramMaps))

    def _fit(self, dataset: DataFrame, shared: _SharedShards | None = None) -> KerasModel:
        from sparkdl.spark_model import SparkModel
        from sparkdl.training.masters import master_from_training_config
        from sparkdl.training.serialization import model_from_bytes, model_to_bytes

        training = self.training_config()
        label_kind = self.getLabelKind()
        custom_objects = self.getCustomObjects() or None
        # a copy: fit twice, same start
        model = model_from_bytes(model_to_bytes(self.model), custom_objects)
        if self.getOrDefault(self.learningRate) > 0:
            from sparkdl.training.driver.events import set_learning_rate

            set_learning_rate(model.optimizer, self.getOrDefault(self.learningRate))
        spark_model = SparkModel(dataset.sparkSession, model,
                                 master_from_training_config(training, model),
                                 custom_objects=custom_objects,
                                 store=self.getOrDefault(self.store) or training.store)
        write = {"features_col": self.getFeaturesCol(), "label_col": self.getLabelCol(),
                 "label_kind": None if label_kind == "auto" else label_kind,
                 "store": self.getOrDefault(self.store) or training.store,
                 "keep_shards": self.getOrDefault(self.keepShards)}
        weight_col = self.getOrDefault(self.sampleWeightCol) or None

        def split() -> tuple[str | DataFrame, str | DataFrame | None]:
            train, held_out = self._validation_split(dataset)
            if shared is None:
                return train, held_out
            return (
                spark_model._shards_of(train, **write, weight_col=weight_col),
                None if held_out is None else spark_model._shards_of(
                    held_out, **write, weight_col=weight_col, what="fit(validation_data)"),
            )

        key = (tuple(sorted(write.items())), weight_col, self.getOrDefault(self.validation),
               self.getOrDefault(self.seed), training.num_workers)
        train, held_out = split() if shared is None else shared.get(key, split)
        history = spark_model.fit(train, **write, validation_data=held_out,
                                  sample_weight_col=weight_col, **self.fit_options(training))
        spec = spark_model.label_spec
        fitted = KerasModel(
            spark_model.model, featuresCol=self.getFeaturesCol(),
            predictionCol=self.getPredictionCol(), probabilityCol=self.getProbabilityCol(),
            labelKind=spec.kind if spec else "auto", classes=list(spec.classes) if spec else [],
            customObjects=self.getCustomObjects(),
        )
        fitted.history = history
        return fitted


    def _validation_split(self, dataset: DataFrame) -> tuple[DataFrame, DataFrame | None]:
        """``(training rows, held-out rows or None)`` as ``validation`` says."""
        from pyspark.sql import functions as F

        validation = self.getOrDefault(self.validation)
        if isinstance(validation, str):
            if not validation:
                return dataset, None
            fields = {f.name: f.dataType.typeName() for f in dataset.schema.fields}
            if fields.get(validation) != "boolean":
                raise ConfigurationError(
                    f"KerasEstimator.validation: {validation!r} must name a boolean column "
                    f"(columns: {', '.join(f'{k} {v}' for k, v in fields.items())})"
                )
            held = F.col(validation)
            return dataset.filter(~held), dataset.filter(held)
        if validation == 0:
            return dataset, None
        train, held_out = dataset.randomSplit([1 - validation, validation],
                                              seed=self.getOrDefault(self.seed))
        return train, held_out


class KerasModel(_KerasParams, Model, MLWritable, MLReadable):
    """A trained Keras model as a Spark ML Transformer.

    ``transform(df)`` adds ``predictionCol`` (double: the class index, or the regression
    output; a vector for several outputs) and, for classification, ``probabilityCol`` (a
    Spark ML vector). ``classes`` holds the class names in index order (a ``StringIndexer``'s
    labels when the estimator saw them). ``history`` is the fit's Keras ``History`` (not saved).
    """

    classes = Param(Params._dummy(), "classes", "class names in index order",
                    typeConverter=TypeConverters.toListString)

    def __init__(self, model: keras.Model | None = None, **params: Any) -> None:
        super().__init__()
        self._check_model(model)
        self.model = model
        self.history: FitResult | None = None
        self._setDefault(featuresCol="features", predictionCol="prediction",
                         probabilityCol="probability", labelKind="auto", classes=[],
                         customObjects={})
        self._set(**params)

    def getClasses(self) -> list[str]:
        return self.getOrDefault(self.classes)

    def _transform(self, dataset: DataFrame) -> DataFrame:
        from sparkdl.spark_model import SparkModel
        from sparkdl.training.masters import DenseTrainingMaster

        label_kind = self.getLabelKind()
        spark_model = SparkModel(dataset.sparkSession, self.model, DenseTrainingMaster(),
                                 custom_objects=self.getCustomObjects() or None)
        return spark_model.predict(
            dataset, features_col=self.getFeaturesCol(),
            label_kind=None if label_kind == "auto" else label_kind,
            prediction_col=self.getPredictionCol(), probability_col=self.getProbabilityCol(),
        )


class _KerasStageWriter(MLWriter):
    """Spark ML's params metadata plus ``model.keras`` beside it."""

    def __init__(self, instance: _KerasParams) -> None:
        super().__init__()
        self.instance = instance

    def save(self, path: str) -> None:
        """Spark ML's save. With ``overwrite()`` the stage is written to a hidden sibling of
        ``path`` first and then swapped in (renames where the filesystem has them), so a save
        that fails leaves the old stage whole and no partial directory behind."""
        if not self.shouldOverwrite:
            super().save(path)  # refuses an existing path, as Spark ML does
            return
        fs, root = resolve(path)
        if fs.get_file_info(root).type == pafs.FileType.NotFound:
            self._save_staged(path, fs, root)
            return
        staged = _sibling(path, "saving")
        self._save_staged(staged, fs, resolve(staged)[1])
        replaced = resolve(_sibling(path, "replaced"))[1]
        move_dir(fs, root, replaced)
        try:
            move_dir(fs, resolve(staged)[1], root)
        except BaseException:
            move_dir(fs, replaced, root)
            raise
        try:
            fs.delete_dir(replaced)
        except OSError as exc:
            log.warning("could not delete the replaced stage %s: %s", replaced, exc)

    def _save_staged(self, path: str, fs: pafs.FileSystem, root: str) -> None:
        """``saveImpl(path)``; what a failure wrote at ``path`` is deleted."""
        try:
            self.saveImpl(path)
        except BaseException:
            if fs.get_file_info(root).type != pafs.FileType.NotFound:
                fs.delete_dir(root)
            raise

    def saveImpl(self, path: str) -> None:
        from sparkdl.training.serialization import model_to_bytes

        instance = self.instance
        params = {p.name: v for p, v in instance._paramMap.items()
                  if p.name not in _NOT_SAVED}
        custom_objects = instance.getCustomObjects()
        declared = {CUSTOM_OBJECTS_KEY: sorted(custom_objects)} if custom_objects else None
        DefaultParamsWriter.saveMetadata(instance, path, self.sparkSession,
                                         extraMetadata=declared, paramMap=params)
        fs, root = resolve(path)
        fs.create_dir(root, recursive=True)
        if custom_objects:  # classes and functions: by value, as the workers get them
            from pyspark.serializers import CloudPickleSerializer

            with fs.open_output_stream(join(root, CUSTOM_OBJECTS_FILE)) as stream:
                stream.write(CloudPickleSerializer().dumps(custom_objects))
        with fs.open_output_stream(join(root, MODEL_FILE)) as stream:
            stream.write(model_to_bytes(instance.model))


def _sibling(path: str, tag: str) -> str:
    """A hidden sibling of ``path`` (a local path or URI): ``.<name>.<tag>-<random>``."""
    head, sep, name = path.rstrip("/").rpartition("/")
    return f"{head}{sep}.{name}.{tag}-{uuid.uuid4().hex[:12]}"


class _KerasStageReader(MLReader):
    def __init__(self, cls: type[_KerasParams]) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> Any:
        from sparkdl.training.serialization import model_from_bytes

        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        saved = str(metadata.get("class", "")).rpartition(".")[2]
        if saved != self.cls.__name__:
            raise DataError(f"{path}: holds a {saved}, not a {self.cls.__name__}: load it with "
                            f"{saved}.load")
        fs, root = resolve(path)
        custom_objects: dict[str, Any] = {}
        objects_path = join(root, CUSTOM_OBJECTS_FILE)
        declared = metadata.get(CUSTOM_OBJECTS_KEY)
        present = fs.get_file_info(objects_path).type == pafs.FileType.File
        if present and not declared:
            raise DataError(
                f"{objects_path}: the stage's metadata declares no custom objects, so "
                f"{CUSTOM_OBJECTS_FILE} was not written by its save: refusing to unpickle it "
                "(remove the file, or save the stage again)")
        if declared:
            if not present:
                raise DataError(f"{objects_path}: missing; the stage's metadata declares the "
                                f"custom objects {declared}")
            with fs.open_input_stream(objects_path) as stream:
                custom_objects = pickle.loads(stream.read())  # declared: a trusted stage's
            if sorted(custom_objects) != sorted(declared):
                raise DataError(f"{objects_path}: holds {sorted(custom_objects)}, the stage's "
                                f"metadata declares {declared}")
        model_path = join(root, MODEL_FILE)
        with fs.open_input_stream(model_path) as stream:
            data = stream.read()
        try:
            model = model_from_bytes(data, custom_objects or None)
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            raise DataError(f"{model_path}: not a Keras model file the stage's save wrote "
                            f"({type(exc).__name__}: {exc})") from None
        instance = self.cls(model)
        DefaultParamsReader.getAndSetParams(instance, metadata, skipParams=list(_NOT_SAVED))
        instance._set(customObjects=custom_objects)
        instance._resetUid(metadata["uid"])
        return instance


__all__ = ["KerasEstimator", "KerasModel"]
