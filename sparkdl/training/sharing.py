"""Gradient sharing (Strom 2015): threshold-encoded optimizer updates with residuals."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from sparkdl.comm.communicator import Communicator
from sparkdl.compression.compressor import ThresholdCompressor
from sparkdl.training.exchange import StepResult, Stopwatch, UpdateExchange


class GradientSharingExchange(UpdateExchange):
    """Each worker computes the update its optimizer would apply, adds it to its residual,
    sends the elements that reach τ as ±τ, and applies the decoded sum of every worker's
    message — never its own unencoded update — so replicas stay bit-identical."""

    def __init__(
        self,
        model: tf.keras.Model,
        comm: Communicator,
        compressor: ThresholdCompressor,
        *,
        classification: bool,
    ) -> None:
        super().__init__(model, comm, classification=classification)
        self.compressor = compressor
        variables = model.trainable_variables
        self._shadow = [
            tf.Variable(tf.zeros_like(v), trainable=False, name=f"shadow_{i}")
            for i, v in enumerate(variables)
        ]
        self._sum = np.zeros(self.trainable.size, dtype=np.float32)
        self._local_update = tf.function(self._local_update_fn, reduce_retracing=True)
        self._apply_sum = tf.function(self._apply_sum_fn, reduce_retracing=True)
        self.last_stats = None

    def _local_update_fn(self, x: tf.Tensor, y: tf.Tensor):
        """Run the optimizer locally, return its update as one flat vector, and restore
        the weights exactly, so that only the shared sum is ever applied."""
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            loss, accuracy = self._loss_and_accuracy(x, y)
        grads = tape.gradient(loss, variables)
        for shadow, variable in zip(self._shadow, variables):
            shadow.assign(variable)
        self.model.optimizer.apply(grads, variables)
        update = tf.concat(
            [tf.reshape(v - s, [-1]) for v, s in zip(variables, self._shadow)], axis=0
        )
        for shadow, variable in zip(self._shadow, variables):
            variable.assign(shadow)
        return loss, accuracy, update

    def _apply_sum_fn(self, total: tf.Tensor) -> None:
        for variable, piece in zip(self.model.trainable_variables, self.trainable.split(total)):
            variable.assign_add(piece)

    def step(self, x: np.ndarray, y: np.ndarray, step: int) -> StepResult:
        watch = Stopwatch()
        loss, accuracy, update = self._local_update(x, y)
        update_np = update.numpy()
        watch.lap("compute_s")
        frame, stats = self.compressor.compress(update_np, step)
        watch.lap("encode_s")
        frames = self.comm.allgather(frame)
        watch.lap("communicate_s")
        total = self.compressor.decompress_sum(frames, step, out=self._sum)
        watch.lap("decode_s")
        self._apply_sum(total)
        watch.lap("apply_s")
        self.last_stats = stats
        return StepResult(
            loss=float(loss),
            accuracy=float(accuracy),
            timings=watch.timings,
            extra={
                "tau": float(stats.tau),
                "sparsity": float(stats.sparsity),
                "bitmap": float(stats.encoding == "bitmap"),
                "frame_bytes": float(len(frame)),
                "received_bytes": float(sum(len(f) for f in frames) - len(frame)),
            },
        )
