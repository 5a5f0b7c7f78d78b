"""The metrics compiled into a Keras model, computed on every worker and combined exactly.

Each worker updates the model's own metric objects (``model.compile(metrics=[...])``) on its
batches. At the end of an epoch the metrics' *state variables* (totals, counts, confusion
counts, ...) are summed across workers and the summed state gives the result — the same
figure one process would compute over all the data, never an average of per-worker ratios.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from sparkdl.comm.communicator import Communicator


class CompiledMetrics:
    """The compiled metrics of ``model`` (the loss tracker excluded: the loop tracks loss)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self._built = False

    def build(self, x: Any, y: Any) -> None:
        """Create the metrics' state on the first batch (eagerly, outside any tf.function)."""
        if self._built:
            return
        self._built = True
        if getattr(self.model, "_compile_metrics", None) is not None:
            from sparkdl.training.weights import split_target

            y, sample_weight = split_target(y)
            y_pred = self.model(x, training=False)
            self.model.compute_metrics(x, y, y_pred, sample_weight)
        self.reset()

    @property
    def metrics(self) -> list[Any]:
        tracker = getattr(self.model, "_loss_tracker", None)
        return [m for m in self.model.metrics if m is not tracker]

    @property
    def variables(self) -> list[tf.Variable]:
        return [v for m in self.metrics for v in m.variables]

    def update(self, x: Any, y: Any, y_pred: Any, sample_weight: Any = None) -> None:
        """Add a batch (callable inside a tf.function)."""
        self.model.compute_metrics(x, y, y_pred, sample_weight)

    def reset(self) -> None:
        for metric in self.metrics:
            metric.reset_state()

    def local_results(self) -> dict[str, float]:
        """This worker's figures so far (for progress events; not combined)."""
        return _results(self.metrics)

    def state(self) -> np.ndarray:
        """Every state variable, flattened, as float64 (exact for counts up to 2**53)."""
        parts = [np.asarray(v.numpy(), dtype=np.float64).ravel() for v in self.variables]
        return np.concatenate(parts) if parts else np.zeros(0, np.float64)

    def results_from_state(self, state: np.ndarray) -> dict[str, float]:
        """The metrics' results for a (summed) state; leaves the summed state assigned."""
        offset = 0
        for variable in self.variables:
            size = int(np.prod(variable.shape, dtype=np.int64))
            value = state[offset : offset + size].reshape(tuple(variable.shape))
            variable.assign(value.astype(keras.backend.standardize_dtype(variable.dtype)))
            offset += size
        return _results(self.metrics)

    def combine(self, comm: Communicator) -> dict[str, float]:
        """Sum the state over all workers and return the combined results."""
        state = self.state()
        if comm.world_size > 1 and state.size:
            state = comm.allreduce(state, "sum")
        return self.results_from_state(state)


def _results(metrics: list[Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for metric in metrics:
        result = metric.result()
        items = result.items() if isinstance(result, dict) else [(metric.name, result)]
        for name, value in items:
            array = np.asarray(value)
            if array.size == 1:
                out[name] = float(array.reshape(()))
    return out
