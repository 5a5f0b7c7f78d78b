"""The worker loop with a one-rank communicator: non-finite steps are caught by name."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from sparkdl.comm import create_communicator
from sparkdl.errors import TrainingError
from sparkdl.training.masters import DenseTrainingMaster, SharedTrainingMaster
from sparkdl.training.worker.loop import TrainingLoop, WorkerCallback, run_loop


def _model_with_nan_gradients() -> keras.Model:
    """Loss is finite (sqrt(|0|) = 0) but its gradient is inf × 0 = NaN."""
    model = keras.Sequential([
        keras.Input(shape=(3,)),
        keras.layers.Dense(2, kernel_initializer="zeros", bias_initializer="zeros"),
        keras.layers.Lambda(lambda t: keras.ops.sqrt(keras.ops.abs(t))),
    ])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


@pytest.mark.parametrize("master", [SharedTrainingMaster(num_workers=1),
                                    DenseTrainingMaster(num_workers=1)])
def test_non_finite_update_is_named_with_epoch_and_step(master):
    comm = create_communicator("tcp", 0, 1, lambda s: [s], secret=b"k" * 32, timeout_s=10)
    model = _model_with_nan_gradients()
    exchange = master.create_exchange(model, comm, job_id=1)
    x, y = np.zeros((4, 3), np.float32), np.ones((4, 2), np.float32)
    with pytest.raises(TrainingError, match=r"non-finite update .* at epoch 0, step 0"):
        run_loop(exchange, comm, lambda epoch: iter([(x, y)] * 3), epochs=1,
                 steps_per_epoch=3, batch_size=4)
    comm.close()


def test_loop_resumes_mid_epoch_and_checkpoints_on_schedule():
    comm = create_communicator("tcp", 0, 1, lambda s: [s], secret=b"k" * 32, timeout_s=10)
    model = keras.Sequential([keras.Input(shape=(3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    exchange = DenseTrainingMaster(num_workers=1).create_exchange(
        model, comm, job_id=1)
    batches = [(np.full((2, 3), i, np.float32), np.zeros((2, 2), np.float32)) for i in range(4)]
    fed: list[float] = []

    def source(epoch):
        for x, y in batches:
            fed.append(float(x[0, 0]))
            yield x, y

    events: list[tuple] = []

    class Record(WorkerCallback):
        def on_train_begin(self, loop):
            events.append(("begin", loop.global_step))

        def on_step_end(self, loop, epoch, step, outcome):
            if loop.global_step % 3 == 0:
                events.append(("step", loop.global_step, epoch, step))

        def on_epoch_end(self, loop, epoch, logs):
            events.append(("epoch", epoch, round(logs["loss"], 6) == round(logs["loss"], 6)))
            logs["seen"] = 1.0

    result = run_loop(
        exchange, comm, source, epochs=3, steps_per_epoch=4, batch_size=2,
        start_epoch=1, start_step=2, history=[{"loss": 1.0}], callbacks=[Record()],
    )
    assert result.steps == 12 and len(result.history) == 3 and result.epochs_run == 2
    assert fed[:2] == [0.0, 1.0]  # skipped batches are read (deterministic order), not trained
    assert events == [("begin", 6), ("epoch", 1, True), ("step", 9, 2, 0), ("step", 12, 2, 3),
                      ("epoch", 2, True)]
    assert result.history[-1]["seen"] == 1.0  # callbacks add to the epoch's history entry
    comm.close()


def test_a_callback_stops_every_rank_after_the_epoch():
    comm = create_communicator("tcp", 0, 1, lambda s: [s], secret=b"k" * 32, timeout_s=10)
    model = keras.Sequential([keras.Input(shape=(3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", metrics=["mae"])
    exchange = DenseTrainingMaster(num_workers=1).create_exchange(
        model, comm, job_id=1)
    x, y = np.ones((2, 3), np.float32), np.zeros((2, 2), np.float32)

    class StopAfterTwo(WorkerCallback):
        def on_epoch_end(self, loop, epoch, logs):
            loop.stop_training = epoch == 1

    loop = TrainingLoop(exchange, comm, lambda epoch: iter([(x, y)] * 2), epochs=5,
                        steps_per_epoch=2, batch_size=2, callbacks=[StopAfterTwo()])
    result = loop.run()
    assert result.stopped_early and result.epochs_run == 2 and result.steps == 4
    assert set(result.history[0]) >= {"loss", "mae", "samples_per_second", "epoch_s"}
    comm.close()
