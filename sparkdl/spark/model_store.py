"""Where a model travels through on Spark (:mod:`sparkdl.training.model_files`): the directory
every executor reads the model to train, evaluate or predict with from, and rank 0 writes the
trained model to; and, for evaluation and inference on a cluster without shared storage,
Spark's own file distribution (``spark.addArtifacts(..., file=True)``: the executors fetch
the file from the driver's file server in a stream, not through a Spark message)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sparkdl import session
from sparkdl.errors import ConfigurationError
from sparkdl.storage import as_uri, child
from sparkdl.training.model_files import (
    MODELS_DIR,
    ModelRef,
    staged_model,
    temporary_model_dir,
)

if TYPE_CHECKING:
    import keras
    from pyspark.sql import SparkSession

#: The scheme of a model file distributed with Spark's files (``SparkFiles.get(name)``).
SPARK_FILES = "sparkfiles://"
_distributed: set[tuple[int, str]] = set()  # (session, file name) added already


def model_dir(
    spark: SparkSession,
    *,
    store: str | None = None,
    checkpoint_dir: str | None = None,
    data_uri: str | None = None,
    what: str = "fit()",
) -> str:
    """The model directory, the first of: ``store``'s ``_sparkdl_models/``; on a local master
    (executors on this machine) a temporary directory of this process; the checkpoint
    directory's, then the shard directory's ``_sparkdl_models/`` (storage every executor
    reads already). Without any of them, one :class:`ConfigurationError` naming ``store``."""
    if store:
        return child(as_uri(store), MODELS_DIR)
    if session.is_local(spark):
        return temporary_model_dir()
    for shared in (checkpoint_dir, data_uri):
        if shared:
            return child(as_uri(shared), MODELS_DIR)
    raise ConfigurationError(
        f"{what} on master {session.master(spark)!r} needs storage every executor reads for "
        "the model: pass store='hdfs://...' (or s3://, or a file:// path every executor "
        "mounts) to SparkModel, or set training.store"
    )


def inference_model_file(spark: SparkSession, model: keras.Model, store: str | None,
                         data_uri: str | None) -> ModelRef:
    """The file evaluate and predict load ``model`` from: in :func:`model_dir`'s directory, or
    where there is none (a cluster, no store, a DataFrame) distributed by Spark itself."""
    try:  # the directory is asked for only when no file holds the model yet
        return staged_model(model, lambda: model_dir(spark, store=store, data_uri=data_uri))
    except ConfigurationError:  # no storage every executor reads
        return distribute_model_file(spark, model)


def distribute_model_file(spark: SparkSession, model: keras.Model) -> ModelRef:
    """``model``'s file added to the session's files (``spark.addArtifacts(file=True)``),
    once per session; its reference reads ``sparkfiles://<sha256>.keras``."""
    local = staged_model(model, temporary_model_dir)
    if not local.uri.startswith(temporary_model_dir()):
        return local  # a file on shared storage (a fit's) holds the model already
    name = local.uri.rsplit("/", 1)[1]
    if (id(spark), name) not in _distributed:
        spark.addArtifacts(local.uri.removeprefix("file://"), file=True)
        _distributed.add((id(spark), name))
    return ModelRef(SPARK_FILES + name, local.sha256, local.size)


def local_model_file(ref: ModelRef) -> ModelRef:
    """``ref`` as an executor reads it: a distributed file at its local path there."""
    if not ref.uri.startswith(SPARK_FILES):
        return ref
    from pyspark import SparkFiles

    path = Path(SparkFiles.get(ref.uri.removeprefix(SPARK_FILES)))
    return ModelRef(path.as_uri(), ref.sha256, ref.size)


__all__ = ["distribute_model_file", "inference_model_file", "local_model_file", "model_dir"]
