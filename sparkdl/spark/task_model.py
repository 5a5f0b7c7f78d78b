"""The model on an executor: what evaluation and inference read of a fitted model, and its
loading, once per Python worker."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import keras
    from pyspark.sql import SparkSession

    from sparkdl.data.frames import LabelSpec

_TASK_MODELS: dict[int, Any] = {}


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


def load_task_model(model_bytes: bytes, custom_objects: Any, threads: int) -> Any:
    """Load the shipped model once per Python worker process."""
    from sparkdl.gpu import pin_gpus, task_gpu_addresses

    pin_gpus(task_gpu_addresses(), role="model")  # before anything imports TensorFlow
    from sparkdl.training.serialization import model_from_bytes
    from sparkdl.training.worker.run_worker import configure_tensorflow

    key = hash(model_bytes)
    if key not in _TASK_MODELS:
        configure_tensorflow(threads)
        _TASK_MODELS.clear()
        _TASK_MODELS[key] = model_from_bytes(model_bytes, custom_objects)
    return _TASK_MODELS[key]
