"""Time per iteration: one process, ``ParallelWrapper`` and ``SparkModel``, for the README's
decision guide.

Two models on the same data (scikit-learn's digits upscaled to 28×28, as the ``training``
suite): the digits MLP (``sparkdl.models.mlp``, hidden 128, 64) and DL4J's LeNet. Each is
trained three ways at the same global batch (2 × ``batch`` rows per step):

* ``one process``: ``model.fit`` from memory at batch 2 × ``batch`` on all cores;
* ``ParallelWrapper``: 2 local worker processes, gradient sharing, batch ``batch`` each;
* ``SparkModel``: 2 barrier tasks on ``local[2]``, gradient sharing, batch ``batch`` each.

``ms/step`` is the steady-state time of one iteration (epochs after the first, which include
tracing); ``fixed s`` is what a fit costs beyond its steps (wall time of the ``fit`` call minus
steps × steady step time: process or task start-up, TensorFlow import and tracing, rendezvous,
returning the model). Distributed training pays off when the one-process step is long
against the step overhead of communication (the difference of the ``ms/step`` columns).
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from typing import Any

import numpy as np

from benchmarks.report import print_table
from benchmarks.training import _write, make_data


def _model(name: str) -> Any:
    import keras

    from sparkdl.models import lenet, mlp

    keras.utils.set_random_seed(1)
    model = lenet((28, 28, 1), 10) if name == "lenet" else mlp((28, 28, 1), 10)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    return model


def _one_process(name: str, x: np.ndarray, y: np.ndarray, batch: int, epochs: int
                 ) -> tuple[float, float]:
    import keras

    times: list[float] = []

    class EpochTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            times.append(time.perf_counter() - self.start)

    steps = len(x) // batch
    started = time.perf_counter()
    model = _model(name)
    model.fit(x[: steps * batch], y[: steps * batch], batch_size=batch, epochs=epochs,
              verbose=0, shuffle=True, callbacks=[EpochTimer()])
    wall = time.perf_counter() - started
    step_s = sum(times[1:]) / (steps * (epochs - 1))
    return step_s, wall - step_s * steps * epochs


def _distributed(launcher: str, name: str, spark: Any, uri: str, batch: int, epochs: int
                 ) -> tuple[float, float]:
    from sparkdl.parallel import ParallelWrapper
    from sparkdl.spark_model import SparkModel
    from sparkdl.training.masters import SharedTrainingMaster

    tm = SharedTrainingMaster(batch_size_per_worker=batch, num_workers=2)
    started = time.perf_counter()
    model = _model(name)
    trainer = SparkModel(spark, model, tm) if launcher == "spark" else ParallelWrapper(model, tm)
    metrics = trainer.fit(uri, epochs=epochs, verbose=0).metrics
    wall = time.perf_counter() - started
    step_s = 2 * batch / (metrics.steady_samples_per_second or math.nan)
    return step_s, wall - step_s * metrics.steps


def run(options: dict[str, Any]) -> dict[str, Any]:
    """Measure ms per step and fixed seconds per fit; print a table and return the figures."""
    from sparkdl.session import get_spark

    quick = bool(options.get("quick"))
    rows = 2048 if quick else 6144
    epochs = 2 if quick else 3
    batch = 32  # per worker; the one process fits at 2 x batch
    spark = get_spark()
    x, y = make_data(rows)
    figures: dict[str, Any] = {"rows": rows, "epochs": epochs, "batch_per_worker": batch,
                               "cpus": len(os.sched_getaffinity(0))}
    table = []
    with tempfile.TemporaryDirectory(prefix="sparkdl-bench-iter-") as workdir:
        uri = _write(spark, x, y, workdir)
        for name in ("mlp", "lenet"):
            one = _one_process(name, x, y, 2 * batch, epochs)
            pw = _distributed("parallel", name, spark, uri, batch, epochs)
            sm = _distributed("spark", name, spark, uri, batch, epochs)
            for launcher, (step_s, fixed_s) in (("one_process", one), ("parallel_wrapper", pw),
                                                ("spark_model", sm)):
                figures[f"{name}_{launcher}_ms_per_step"] = step_s * 1e3
                figures[f"{name}_{launcher}_fixed_s"] = fixed_s
            table.append([name, one[0] * 1e3, pw[0] * 1e3, sm[0] * 1e3, one[1], pw[1], sm[1]])
            print(f"{name}: ms/step {one[0] * 1e3:.1f} (one process), {pw[0] * 1e3:.1f} "
                  f"(ParallelWrapper), {sm[0] * 1e3:.1f} (SparkModel); fixed s {one[1]:.1f}, "
                  f"{pw[1]:.1f}, {sm[1]:.1f}", flush=True)
    print_table(
        f"time per iteration at global batch {2 * batch} ({rows} rows, {epochs} epochs, "
        f"{figures['cpus']} cores; distributed: 2 workers, gradient sharing)",
        ["model", "1 proc ms/step", "ParallelWrapper ms/step", "SparkModel ms/step",
         "1 proc fixed s", "ParallelWrapper fixed s", "SparkModel fixed s"],
        table,
    )
    return figures
