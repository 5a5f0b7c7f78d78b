"""Driver-side Keras callbacks fed by the workers, and their decisions sent back.

Rank 0 reports over an authenticated :mod:`sparkdl.comm.channel` to the driver:

=============  ======================================================  ====================
kind           when, and what it carries                               the driver answers
=============  ======================================================  ====================
train_begin    before the first step (again after a resumed attempt):  ``learning_rate``
               the position and the history so far
batch          every ``log_every_steps`` steps (one-way): rank 0's     —
               running loss and metrics
epoch_end      after every epoch: the epoch's figures combined over    ``stop``,
               all ranks (and, when a callback needs the weights, the  ``learning_rate``
               reference of a model file rank 0 wrote to the fit's
               model directory: the driver loads it, then deletes it)
=============  ======================================================  ====================

The driver runs the user's ``keras.callbacks`` on its own copy of the model, then reads
``model.stop_training`` and the optimizer's learning rate. Rank 0 broadcasts the answer to
every rank before the next step, so every replica stops, or changes its learning rate, at the
same step (replicas stay bit-identical).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import keras
import numpy as np

from sparkdl.comm.channel import ChannelClient, Message
from sparkdl.training.model_files import ModelRef, delete_model, load_weights, write_model
from sparkdl.training.worker.loop import TrainingLoop, WorkerCallback

if TYPE_CHECKING:
    from sparkdl.training.exchanges.exchange import StepResult

log = logging.getLogger("sparkdl.training")

#: Callbacks that read only the logs (never the weights): the driver needs no weights for
#: them. Anything else (ModelCheckpoint, EarlyStopping(restore_best_weights=True), user
#: callbacks) gets rank 0's weights and optimizer state after every epoch, through a model
#: file (never through the channel: a model's bytes would cost the driver and rank 0 two
#: copies of the weights each).
_LOGS_ONLY = (
    keras.callbacks.History,
    keras.callbacks.CSVLogger,
    keras.callbacks.LearningRateScheduler,
    keras.callbacks.ReduceLROnPlateau,
    keras.callbacks.TerminateOnNaN,
    keras.callbacks.ProgbarLogger,
)


def needs_weights(callbacks: Sequence[keras.callbacks.Callback]) -> bool:
    """Whether any driver callback may read the model's weights during training."""
    from sparkdl.callbacks import TensorBoardScalars
    from sparkdl.training.driver.progress import ProgressLogger

    for callback in callbacks:
        if isinstance(callback, keras.callbacks.EarlyStopping):
            if callback.restore_best_weights:
                return True
        elif not isinstance(callback, (*_LOGS_ONLY, ProgressLogger, TensorBoardScalars)):
            return True
    return False


# Worker side ----------------------------------------------------------------------------------


class DriverLink(WorkerCallback):
    """Every rank runs it; rank 0 holds the channel to the driver.

    Args:
        client: rank 0's channel to the driver (``None`` on the other ranks).
        log_every_steps: send a ``batch`` event every this many steps (0: never).
        send_weights: with every ``epoch_end``, rank 0 writes the model (weights and optimizer
            state) into ``model_dir`` and sends the file's reference (the replicas are made
            identical first, so the driver sees the model the workers hold).
        model_dir: the fit's model directory (needed with ``send_weights``).
    """

    timeline_name = "event channel"

    def __init__(
        self, client: ChannelClient | None, *, log_every_steps: int = 0,
        send_weights: bool = False, model_dir: str | None = None,
    ) -> None:
        if send_weights and model_dir is None:
            raise ValueError("send_weights needs the fit's model directory (model_dir)")
        self.client = client
        self.log_every_steps = int(log_every_steps)
        self.send_weights = bool(send_weights)
        self.model_dir = model_dir

    def on_train_begin(self, loop: TrainingLoop) -> None:
        answer = None
        if self.client is not None:
            answer = self.client.request({
                "kind": "train_begin", "epoch": loop.start_epoch, "step": loop.start_step,
                "history": loop.history,
            })
        self._decide(loop, answer)

    def on_step_end(
        self, loop: TrainingLoop, epoch: int, step: int, outcome: StepResult
    ) -> None:
        every = self.log_every_steps
        if self.client is None or not every or loop.global_step % every:
            return
        logs = {"loss": loop.running_loss, **loop.exchange.metrics.local_results()}
        self.client.send({"kind": "batch", "epoch": epoch, "step": step,
                          "global_step": loop.global_step, "logs": logs})

    def on_epoch_end(self, loop: TrainingLoop, epoch: int, logs: dict[str, float]) -> None:
        if self.send_weights:
            loop.exchange.finish()
        answer = None
        if self.client is not None:
            data: dict[str, Any] = {"kind": "epoch_end", "epoch": epoch, "logs": logs}
            if self.send_weights:
                assert self.model_dir is not None
                data["model"] = dataclasses.asdict(write_model(loop.exchange.model,
                                                               self.model_dir))
            answer = self.client.request(data)
        self._decide(loop, answer)

    def on_train_end(self, loop: TrainingLoop) -> None:
        self.close()

    def close(self) -> None:
        if self.client is not None:
            self.client.close()

    def _decide(self, loop: TrainingLoop, answer: dict[str, Any] | None) -> None:
        """Rank 0's answer from the driver, the same on every rank."""
        decision = np.zeros(2, np.float64)
        if answer is not None:
            rate = answer.get("learning_rate")
            decision[:] = (float(bool(answer.get("stop"))),
                           float(rate) if rate is not None else math.nan)
        if loop.comm.world_size > 1:
            decision = loop.comm.broadcast_array(decision, root=0)
        if decision[0]:
            loop.stop_training = True
        if math.isfinite(decision[1]):
            set_learning_rate(loop.exchange.model.optimizer, float(decision[1]))


def get_learning_rate(optimizer: Any) -> float | None:
    """The optimizer's learning rate, or ``None`` when it follows a schedule."""
    if isinstance(getattr(optimizer, "_learning_rate", None),
                  keras.optimizers.schedules.LearningRateSchedule):
        return None
    try:
        return float(np.asarray(keras.ops.convert_to_numpy(optimizer.learning_rate)))
    except (TypeError, ValueError, AttributeError):
        return None


def set_learning_rate(optimizer: Any, rate: float) -> None:
    current = get_learning_rate(optimizer)
    if current is not None and np.float32(current) != np.float32(rate):
        optimizer.learning_rate = rate


# Driver side ----------------------------------------------------------------------------------


class DriverCallbacks:
    """Runs the fit's Keras callbacks on the driver from the workers' events.

    Args:
        model: the driver's copy of the model (callbacks see it; rank 0's weights and
            optimizer state are loaded into it at every epoch's end when ``send_weights``).
        callbacks: the user's callbacks plus sparkdl's own (progress, TensorBoard).
        history: the :class:`keras.callbacks.History` the fit returns (filled here).
        params: Keras's ``callback.params`` (``epochs``, ``steps``, ``verbose``).
    """

    def __init__(
        self,
        model: keras.Model,
        callbacks: Sequence[keras.callbacks.Callback],
        history: keras.callbacks.History,
        params: dict[str, Any],
    ) -> None:
        self.model = model
        self.history = history
        # History last, as in Keras: it records what the other callbacks added to the logs
        self.callbacks = keras.callbacks.CallbackList(
            [*callbacks, history], add_history=False, add_progbar=False, model=model
        )
        self.callbacks.set_params(params)
        self._begun: set[int] = set()
        self._created = time.monotonic()
        self._answers: dict[int, dict[str, Any]] = {}
        self.epochs_seen: list[int] = []

    def train_begin(self) -> None:
        self.model.stop_training = False
        self.callbacks.on_train_begin()

    def handle(self, message: Message) -> None:
        """Act on one worker message, answering it when it asks."""
        data = message.data
        kind = data.get("kind")
        if kind == "train_begin":
            log.info("fit: the workers are ready %.1f s after the fit began; training from "
                     "epoch %d", time.monotonic() - self._created, int(data.get("epoch", 0)))
            self._restore_history(data.get("history") or [], int(data.get("epoch", 0)))
            self._begin_epoch(int(data.get("epoch", 0)))
            answer: dict[str, Any] = {"learning_rate": get_learning_rate(self.model.optimizer)}
        elif kind == "batch":
            self.callbacks.on_train_batch_end(int(data["step"]), _logs(data))
            return
        elif kind == "epoch_end":
            answer = self._end_epoch(int(data["epoch"]), _logs(data), data.get("model"))
        else:
            log.warning("ignoring an event of unknown kind %r", kind)
            answer = {}
        if message.wants_reply:
            message.reply(answer)

    def train_end(self, final_model: keras.Model) -> None:
        """The fit is over: callbacks see the trained model."""
        self.callbacks.set_model(final_model)
        final_model.stop_training = getattr(self.model, "stop_training", False)
        self.callbacks.on_train_end()

    def _begin_epoch(self, epoch: int) -> None:
        if epoch not in self._begun and epoch < self.callbacks.params.get("epochs", epoch + 1):
            self._begun.add(epoch)
            self.callbacks.on_epoch_begin(epoch)

    def _end_epoch(self, epoch: int, logs: dict[str, float],
                   model: dict[str, Any] | None) -> dict[str, Any]:
        ref = ModelRef(**model) if model else None
        try:
            if epoch in self._answers:  # a retried stage repeats an epoch: same answer, once
                return self._answers[epoch]
            if ref is not None:
                load_weights(self.model, ref)
        finally:
            if ref is not None:
                delete_model(ref)  # read, or not needed: rank 0 writes a new one each epoch
        self.epochs_seen.append(epoch)
        validation = {k[4:]: v for k, v in logs.items() if k.startswith("val_")}
        if validation:  # the workers validated: Keras's evaluation hooks, as in Model.fit
            self.callbacks.on_test_begin()
            self.callbacks.on_test_end(validation)
        self.callbacks.on_epoch_end(epoch, logs)
        stop = bool(getattr(self.model, "stop_training", False))
        if not stop:
            self._begin_epoch(epoch + 1)
        answer = {"stop": stop, "learning_rate": get_learning_rate(self.model.optimizer)}
        self._answers[epoch] = answer
        return answer

    def _restore_history(self, entries: list[dict[str, Any]], next_epoch: int) -> None:
        """Epochs a resumed run finished before this fit began go into the history as they
        were (their callbacks ran then)."""
        first = next_epoch - len(entries)
        for offset, logs in enumerate(entries):
            epoch = first + offset
            if epoch in self._answers or epoch in self.history.epoch:
                continue
            self.history.epoch.append(epoch)
            for key, value in logs.items():
                if key != "epoch":
                    self.history.history.setdefault(key, []).append(value)
            self._answers[epoch] = {"stop": False, "learning_rate": None}


def _logs(data: dict[str, Any]) -> dict[str, float]:
    return {str(k): float(v) for k, v in (data.get("logs") or {}).items()
            if isinstance(v, (int, float))}
