"""The model on an executor: what evaluation and inference read of a fitted model, and its
loading from its file (:mod:`sparkdl.training.model_files`), once per Python worker."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import keras
    from pyspark.sql import SparkSession

    from sparkdl.data.frames import LabelSpec
    from sparkdl.training.model_files import ModelRef

_TASK_MODELS: dict[str, Any] = {}


class FittedModel(Protocol):
    """What :mod:`sparkdl.spark.inference` reads of a model to evaluate or predict with
    (:class:`sparkdl.SparkModel` is one)."""

    @property
    def model(self) -> keras.Model: ...

    @property
    def spark(self) -> SparkSession: ...

    @property
    def custom_objects(self) -> dict[str, Any] | None: ...

    @property
    def label_spec(self) -> LabelSpec | None: ...

    def model_file(self, data_uri: str | None = None) -> ModelRef:
        """The model's file, every executor reads it (:mod:`sparkdl.training.model_files`);
        ``data_uri``: the shards evaluated, whose directory may hold it."""


def load_task_model(ref: ModelRef, custom_objects: Any, threads: int) -> Any:
    """Load the model of ``ref``'s file once per Python worker process (the last one stays
    loaded: a worker that serves another model's tasks loads that one instead)."""
    from sparkdl.gpu import pin_gpus, task_gpu_addresses

    pin_gpus(task_gpu_addresses(), role="model")  # before anything imports TensorFlow
    from sparkdl.spark.model_store import local_model_file
    from sparkdl.training.model_files import load_model
    from sparkdl.training.worker.run_worker import configure_tensorflow

    if ref.sha256 not in _TASK_MODELS:
        configure_tensorflow(threads)
        _TASK_MODELS.clear()
        _TASK_MODELS[ref.sha256] = load_model(local_model_file(ref), custom_objects)
    return _TASK_MODELS[ref.sha256]
