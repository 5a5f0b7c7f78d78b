"""Live progress of a distributed fit on the driver.

``verbose=1`` (a terminal or a notebook) draws Keras's own :class:`keras.utils.Progbar` per
epoch, moved by the workers' step events; ``verbose=2`` (spark-submit, Airflow logs: output
that is not a terminal) prints one line per epoch as soon as the epoch ends::

    epoch 3/12 - loss 0.106 - accuracy 0.975 - val_loss 0.09 - 9.1k samples/s
        - 812B/step (85x less than dense) - tau 1.2e-02 - 40 rows dropped    (one line)
"""

from __future__ import annotations

from typing import Any

import keras

from sparkdl.logs import interactive

#: Figures the line shows in words, not as ``name value`` pairs.
_OWN_FIGURES = frozenset({
    "samples_per_second", "bytes_sent_per_step", "bytes_received_per_step", "tau", "sparsity",
    "loss_after_averaging", "epoch_s", "data_wait_s", "compute_s", "encode_s",
    "communicate_s", "decode_s", "apply_s", "rows_dropped",
})


def resolve_verbose(verbose: int | str) -> int:
    """Keras's ``verbose``: ``"auto"`` is 1 in a terminal or notebook, else 2."""
    if verbose == "auto":
        return 1 if interactive() else 2
    if verbose not in (0, 1, 2):
        from sparkdl.errors import ConfigurationError

        raise ConfigurationError(f"verbose must be 0, 1, 2 or 'auto', got {verbose!r}")
    return int(verbose)


class ProgressLogger(keras.callbacks.Callback):
    """Progress bar (verbose 1) or one line per epoch (verbose 2) on the driver.

    Args:
        verbose: 1 or 2 (0 prints nothing: do not add the callback).
        dense_bytes_per_step: what a dense allreduce would send per step and worker, to say
            how much less the run sends.
    """

    def __init__(self, verbose: int = 2, dense_bytes_per_step: float | None = None) -> None:
        super().__init__()
        self.verbose = verbose
        self.dense_bytes_per_step = dense_bytes_per_step
        self._bar: keras.utils.Progbar | None = None

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self.verbose == 1:
            print(f"Epoch {epoch + 1}/{self.params.get('epochs')}", flush=True)
            # every figure arrives already aggregated: show it as is, never averaged again
            self._bar = keras.utils.Progbar(self.params.get("steps"), verbose=1,
                                            stateless_metrics=[])

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._bar is not None and logs:
            self._bar.update(batch + 1, _pairs(logs))

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        logs = logs or {}
        if self.verbose == 1 and self._bar is not None:
            steps = self.params.get("steps") or 0
            own = [(name, float(logs[key])) for key, name in _BAR_FIGURES if key in logs]
            self._bar.update(steps, [*_pairs(logs), *own], finalize=True)
            self._bar = None
        elif self.verbose == 2:
            print(self.line(epoch, logs), flush=True)

    def line(self, epoch: int, logs: dict[str, Any]) -> str:
        """The one-line summary of an epoch."""
        parts = [f"epoch {epoch + 1}/{self.params.get('epochs')}"]
        parts += [f"{name} {value:.4g}" for name, value in _pairs(logs)]
        if "samples_per_second" in logs:
            parts.append(f"{_si(logs['samples_per_second'])} samples/s")
        sent = logs.get("bytes_sent_per_step")
        if sent is not None:
            text = f"{_si(sent)}B/step"
            saving = self.dense_bytes_per_step / sent if self.dense_bytes_per_step and sent else 0
            if saving >= 1.5:  # a compressed exchange: dense's own bytes need no comparison
                text += f" ({saving:.0f}x less than dense)"
            parts.append(text)
        if "tau" in logs:
            parts.append(f"tau {logs['tau']:.1e}")
        if logs.get("rows_dropped"):
            parts.append(f"{int(logs['rows_dropped'])} rows dropped")
        return " - ".join(parts)


#: sparkdl's figures the progress bar shows at the end of an epoch, with their short names.
_BAR_FIGURES = (("samples_per_second", "samples/s"), ("bytes_sent_per_step", "B/step"),
                ("tau", "tau"), ("rows_dropped", "rows dropped"))


def _pairs(logs: dict[str, Any]) -> list[tuple[str, float]]:
    """Loss first, then the metrics, then their validation figures."""
    pairs = [(k, float(v)) for k, v in logs.items()
             if k not in _OWN_FIGURES and k != "global_step" and isinstance(v, (int, float))]
    return sorted(pairs, key=lambda kv: (kv[0].startswith("val_"), kv[0] != "loss"
                                         and kv[0] != "val_loss", kv[0]))


def _si(value: float) -> str:
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.1f}{suffix}"
    return f"{value:.0f}"
