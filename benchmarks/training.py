"""Training throughput: DL4J's LeNet on 2 Spark barrier workers vs one-process model.fit.

Data: scikit-learn's digits upscaled to 28×28×1 (repeated with noise to a few thousand rows),
written once as real DataSet shards. Each distributed mode trains with 2 workers × batch 64 in
Spark barrier mode (local[2]); the reference fits the same model in one process with
``model.fit`` at batch 128 on the same 2 cores, from memory. Candidates alternate; each figure
is the median over repeats of the steady-state throughput (epochs after the first, which
includes tracing).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from benchmarks.report import print_table

if TYPE_CHECKING:
    from sparkdl.training.summary import FitMetrics

MODES = ("sharing", "dense", "averaging")


def make_data(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Digits upscaled to 28×28 (nearest, padded), repeated with noise to ``rows`` rows."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = digits.images.astype(np.float32) / 16.0
    big = np.kron(images, np.ones((3, 3), dtype=np.float32))  # 24×24
    big = np.pad(big, ((0, 0), (2, 2), (2, 2)))  # 28×28
    rng = np.random.default_rng(seed)
    index = rng.integers(0, len(big), rows)
    x = big[index] + rng.normal(0, 0.05, (rows, 28, 28)).astype(np.float32)
    return x[..., None].astype(np.float32), digits.target[index].astype(np.int64)


def run(options: dict[str, Any]) -> dict[str, Any]:
    quick = bool(options.get("quick"))
    rows = 3072 if quick else 7680
    epochs = 2 if quick else 4
    repeats = 1 if quick else 3

    from sparkdl.session import get_spark

    spark = get_spark()
    workdir = tempfile.mkdtemp(prefix="sparkdl-bench-")
    x, y = make_data(rows)
    uri = _write(spark, x, y, workdir)

    samples: dict[str, list[float]] = {name: [] for name in ("single", *MODES)}
    extras: dict[str, FitMetrics] = {}
    for _ in range(repeats):
        samples["single"].append(_single_process(x, y, epochs))
        for mode in MODES:
            metrics = _distributed(spark, uri, mode, epochs)
            samples[mode].append(metrics.steady_samples_per_second or 0.0)
            extras[mode] = metrics
    medians = {name: statistics.median(values) for name, values in samples.items()}
    figures: dict[str, Any] = {
        "rows": rows,
        "epochs": epochs,
        "repeats": repeats,
        "single_samples_per_second": medians["single"],
    }
    table = [("single (model.fit, batch 128)", medians["single"], 1.0, "-", "-", "-")]
    for mode in MODES:
        m = extras[mode]
        ratio = medians[mode] / medians["single"]
        figures[f"{mode}_samples_per_second"] = medians[mode]
        figures[f"{mode}_vs_single"] = ratio
        figures[f"{mode}_bytes_per_step"] = m.bytes_per_step
        figures[f"{mode}_data_wait_fraction"] = m.data_wait_fraction
        figures[f"{mode}_step_timings_s"] = m.step_timings_s
        table.append((f"{mode} (2 workers x 64)", medians[mode], ratio,
                      f"{m.bytes_per_step:.0f}", f"{m.final_train_accuracy or 0.0:.3f}",
                      f"{m.data_wait_fraction:.3f}"))
    # Steady state (after the first epoch, while the adaptive threshold settles), like the
    # throughput figures; the all-steps figure is reported beside it.
    sharing = extras["sharing"]
    figures["sharing_compression"] = sharing.steady_compression_ratio
    figures["sharing_compression_all_steps"] = sharing.compression_ratio
    figures["num_parameters"] = sharing.num_parameters
    figures["data_wait_fraction"] = sharing.data_wait_fraction
    print_table(
        f"LeNet ({figures['num_parameters']} parameters), {rows} rows, {epochs} epochs, "
        f"medians of {repeats}, steady-state samples/s",
        ["run", "samples/s", "vs single", "bytes/step", "train acc", "data wait"],
        table,
    )
    print(
        "sharing compression (dense bytes / bytes sent): "
        f"{figures['sharing_compression']:.1f} after the first epoch, "
        f"{figures['sharing_compression_all_steps']:.1f} over all steps"
    )
    return figures


def _write(spark: Any, x: np.ndarray, y: np.ndarray, workdir: str) -> str:
    import pandas as pd

    from sparkdl.data.writer import write_shards

    frame = pd.DataFrame({"features": list(x.reshape(len(x), -1)), "label": y})
    df = spark.createDataFrame(frame)
    uri = f"file://{workdir}/lenet"
    write_shards(df, uri, feature_shape=[28, 28, 1], classes=[str(i) for i in range(10)],
                 num_files=8, rows_per_group=128)
    return uri


def _lenet() -> Any:
    import keras

    from sparkdl.models import lenet

    keras.utils.set_random_seed(1)
    model = lenet((28, 28, 1), 10)
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _single_process(x: np.ndarray, y: np.ndarray, epochs: int) -> float:
    """One process, model.fit at batch 128, all the machine's cores."""
    import keras
    import tensorflow as tf

    try:
        threads = len(os.sched_getaffinity(0))
        tf.config.threading.set_intra_op_parallelism_threads(threads)
    except (RuntimeError, AttributeError):
        pass
    model = _lenet()
    times: list[float] = []

    class EpochTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            times.append(time.perf_counter() - self.start)

    steps = len(x) // 128
    model.fit(x[: steps * 128], y[: steps * 128], batch_size=128, epochs=epochs, verbose=0,
              shuffle=True, callbacks=[EpochTimer()])
    later = times[1:]
    return steps * 128 * len(later) / sum(later)


def _distributed(spark: Any, uri: str, mode: str, epochs: int) -> FitMetrics:
    from sparkdl.compression import AdaptiveThreshold
    from sparkdl.spark_model import SparkModel
    from sparkdl.training.masters import (
        DenseTrainingMaster,
        ParameterAveragingTrainingMaster,
        SharedTrainingMaster,
    )

    common = {"batch_size_per_worker": 64, "num_workers": 2}
    master = {
        "sharing": lambda: SharedTrainingMaster(
            **common, threshold=AdaptiveThreshold(initial=1e-3)
        ),
        "dense": lambda: DenseTrainingMaster(**common),
        "averaging": lambda: ParameterAveragingTrainingMaster(**common, averaging_frequency=5),
    }[mode]()
    # Measured as users run it: progress lines, a driver callback and step events every 10
    # steps over the event channel (their cost is part of the figure).
    import keras

    with tempfile.TemporaryDirectory() as tmp:
        fit = SparkModel(spark, _lenet(), master).fit(
            uri, epochs=epochs, verbose=2, log_every_steps=10,
            callbacks=[keras.callbacks.CSVLogger(os.path.join(tmp, "log.csv"))],
        )
    return fit.metrics
