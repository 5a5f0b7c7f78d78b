"""Driver-side Keras callbacks of sparkdl.

:class:`TensorBoardScalars` writes every number a fit logs — loss, compiled metrics,
``val_*`` and sparkdl's own figures (samples/s, bytes per step, τ, sparsity, phase times) —
as TensorBoard scalars, to any filesystem URI (``training.tensorboard_dir``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

import keras
import numpy as np

from sparkdl.errors import ConfigurationError, DataError

TRAIN_DIR = "train"
VALIDATION_DIR = "validation"


class TensorBoardScalars(keras.callbacks.Callback):
    """Write the logs of every epoch (and, with ``update_freq``, of batches) as scalars.

    The layout is Keras's :class:`keras.callbacks.TensorBoard`'s, so both can be compared in
    one TensorBoard: ``LOG_DIR/train`` holds ``epoch_<key>`` for every numeric key of the
    epoch's logs that does not start with ``val_`` (and ``batch_<key>`` for batch events),
    ``LOG_DIR/validation`` holds ``epoch_<key>`` for each ``val_<key>``. The step of epoch
    scalars is the epoch; the step of batch scalars is ``logs["global_step"]`` when the event
    carries it (sparkdl's driver does), else the number of batch events seen in this fit.

    Scalars are written with ``tf.summary`` and the ``scalars`` plugin's metadata, so no
    ``tensorboard`` package is needed to write them.

    Args:
        log_dir: a local path, ``file://`` URI, or any URI :func:`sparkdl.data.metadata.resolve`
            opens (``s3://``, ``hdfs://``, ``gs://``, fsspec schemes). Remote event files are
            written to a local temporary directory and copied to ``log_dir`` at
            ``on_train_end`` (then the temporary directory is removed).
        update_freq: write batch events too, at most one per ``update_freq`` steps; ``None``
            writes epoch scalars only.
    """

    def __init__(self, log_dir: str, update_freq: int | None = None) -> None:
        super().__init__()
        if update_freq is not None and (isinstance(update_freq, bool) or update_freq < 1):
            raise ConfigurationError(
                f"TensorBoardScalars update_freq must be a positive integer or None, "
                f"got {update_freq!r}"
            )
        self.log_dir = str(log_dir)
        self.update_freq = update_freq
        self._local = _local_path(self.log_dir)
        self._staging: str | None = None
        self._writers: dict[str, Any] = {}
        self._batch_events = 0
        self._last_batch_step: int | None = None

    # --- Keras hooks ------------------------------------------------------------------------

    def on_train_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        self._batch_events = 0
        self._last_batch_step = None

    def on_train_batch_end(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        self._batch_events += 1
        if self.update_freq is None or not logs:
            return
        step = int(logs["global_step"]) if "global_step" in logs else self._batch_events
        if self._last_batch_step is not None and step - self._last_batch_step < self.update_freq:
            return
        self._last_batch_step = step
        scalars = {f"batch_{k}": v for k, v in _numbers(logs).items() if k != "global_step"}
        self._write(TRAIN_DIR, scalars, step)

    def on_epoch_end(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        values = _numbers(logs or {})
        train = {f"epoch_{k}": v for k, v in values.items() if not k.startswith("val_")}
        validation = {f"epoch_{k[4:]}": v for k, v in values.items() if k.startswith("val_")}
        self._write(TRAIN_DIR, train, epoch)
        self._write(VALIDATION_DIR, validation, epoch)
        for writer in self._writers.values():
            writer.flush()

    def on_train_end(self, logs: Mapping[str, Any] | None = None) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
        if self._staging is not None:
            staging, self._staging = self._staging, None
            _copy_tree(staging, self.log_dir)
            shutil.rmtree(staging, ignore_errors=True)

    # --- writing ----------------------------------------------------------------------------

    def _write(self, subdir: str, scalars: Mapping[str, float], step: int) -> None:
        if not scalars:
            return
        import tensorflow as tf

        writer = self._writers.get(subdir)
        if writer is None:
            root = self._local
            if root is None:
                if self._staging is None:
                    self._staging = tempfile.mkdtemp(prefix="sparkdl-tensorboard-")
                root = self._staging
            writer = self._writers[subdir] = tf.summary.create_file_writer(
                os.path.join(root, subdir)
            )
        with writer.as_default():
            for tag, value in scalars.items():
                tf.summary.write(tag, tf.constant(value, tf.float32), step=step,
                                 metadata=_scalar_metadata())


def _scalar_metadata() -> Any:
    """The ``scalars`` plugin's metadata, as ``tensorboard.summary.scalar`` writes it."""
    from tensorflow.core.framework import summary_pb2

    return summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
        data_class=summary_pb2.DATA_CLASS_SCALAR,
    )


def _numbers(logs: Mapping[str, Any]) -> dict[str, float]:
    """The logs' scalar numbers (Python, numpy or 0-d tensors) as floats; the rest skipped."""
    values = {}
    for key, value in logs.items():
        if isinstance(value, (str, bytes, bool, np.bool_)) or value is None:
            continue
        try:
            array = np.asarray(value)
        except (TypeError, ValueError):
            continue
        if array.ndim == 0 and np.issubdtype(array.dtype, np.number):
            values[str(key)] = float(array)
    return values


def _local_path(uri: str) -> str | None:
    """The local directory of a path or ``file:`` URI; ``None`` for remote URIs."""
    from sparkdl.storage import local_path

    local = local_path(uri)
    return None if local is None else str(local)


def _copy_tree(local_dir: str, uri: str) -> None:
    """Copy ``local_dir``'s files under ``uri`` (pyarrow filesystems)."""
    import pyarrow.fs as pafs

    from sparkdl.data.metadata import resolve

    filesystem, path = resolve(uri)
    try:
        filesystem.create_dir(path, recursive=True)
        pafs.copy_files(local_dir, path, source_filesystem=pafs.LocalFileSystem(),
                        destination_filesystem=filesystem)
    except (OSError, ValueError) as exc:
        kept = tempfile.mkdtemp(prefix="sparkdl-tensorboard-kept-")
        shutil.copytree(local_dir, kept, dirs_exist_ok=True)
        raise DataError(
            f"cannot copy the TensorBoard event files to {uri}: {exc}; they are kept in {kept}"
        ) from None
