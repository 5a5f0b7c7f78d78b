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
        # The shared weights W, identical on every worker. The model's variables hold
        # W + (this worker's local update) between steps; the next step resets them to
        # W + (decoded sum), so a worker never keeps its own unencoded update.
        self._shared = [
            tf.Variable(v, trainable=False, name=f"shared_{i}")
            for i, v in enumerate(model.trainable_variables)
        ]
        self._pending = np.zeros(self.trainable.size, dtype=np.float32)
        self._sum = np.zeros(self.trainable.size, dtype=np.float32)
        self._step_fn = tf.function(self._step_graph, reduce_retracing=True)
        self._flush_fn = tf.function(self._flush_graph, reduce_retracing=True)
        self.last_stats = None

    def _apply_shared_sum(self, total: tf.Tensor) -> None:
        """W ← W + total; the model's variables ← W (one pass, same bits on every worker)."""
        for variable, shared, piece in zip(
            self.model.trainable_variables, self._shared, self.trainable.split(total)
        ):
            shared.assign_add(piece)
            variable.assign(shared)

    def _step_graph(self, x: tf.Tensor, y: tf.Tensor, previous_sum: tf.Tensor):
        """Apply the previous step's decoded sum, then run the optimizer locally and return
        its update as one flat vector."""
        self._apply_shared_sum(previous_sum)
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            loss, accuracy = self._loss_and_accuracy(x, y)
        grads = tape.gradient(loss, variables)
        self.model.optimizer.apply(grads, variables)
        update = tf.concat(
            [tf.reshape(v - w, [-1]) for v, w in zip(variables, self._shared)], axis=0
        )
        return loss, accuracy, update

    def _flush_graph(self, previous_sum: tf.Tensor) -> None:
        self._apply_shared_sum(previous_sum)

    def flush(self) -> None:
        """Apply the pending decoded sum now (before anything reads the weights)."""
        self._flush_fn(self._pending)
        self._pending[:] = 0.0

    def end_epoch(self, epoch: int) -> None:
        self.flush()
        super().end_epoch(epoch)

    def finish(self) -> None:
        self.flush()

    def step(self, x: np.ndarray, y: np.ndarray, step: int) -> StepResult:
        watch = Stopwatch()
        loss, accuracy, update = self._step_fn(x, y, self._pending)
        update_np = update.numpy()
        watch.lap("compute_s")
        frame, stats = self.compressor.compress(update_np, step)
        watch.lap("encode_s")
        frames = self.comm.allgather(frame)
        watch.lap("communicate_s")
        total = self.compressor.decompress_sum(frames, step, out=self._sum)
        # double buffer: the step function has finished with the previous pending sum
        self._pending, self._sum = total, self._pending
        watch.lap("decode_s")
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
