"""Accuracy and step time of every exchange at N workers: ``jobs/benchmark.py workers``.

Issue 22 asks whether mesh sharing and PowerSGD keep dense's accuracy at 8 workers, for the
digits MLP and for LeNet. Each model is fitted by ``N`` local worker processes
(:class:`~sparkdl.parallel.ParallelWrapper`: the Spark barrier task's worker loop without
Spark, one TensorFlow thread each, loopback TCP) from shards the real ETL pipelines write
(``sparkdl/pipelines/digits.py``; ``sparkdl/pipelines/mnist.py`` on the shipped MNIST-format
sample, digits upscaled to 28x28), with the same seed, batch and epochs in every mode: dense
allreduce, threshold sharing on the ring (``cluster.mesh: plain``) and on the log-depth collectives
(``mesh``), and PowerSGD (rank 4), from the first step and after one epoch of dense
steps (``start_step``, the warm-up PyTorch's ``powerSGD_hook`` recommends). Printed per
fit: the test accuracy and its difference to dense in percentage points, the steady step
time, the bytes each worker sends per step and the load average. On a machine with fewer
cores than workers the step times include the workers' sharing of the cores; the accuracies
do not depend on it (each fit is deterministic).

``--harness``: the same fits through Spark on the network-namespace harness instead
(:mod:`benchmarks.netcluster`, root needed): ``N // 2`` hosts x 2 workers, each host its
own address, ``/dev/shm`` and share of the cores, 1 Gbit/s links; the shards written by the
pipelines on that cluster; one flat ring (``cluster.topology: flat``).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.report import print_table

MODES = ("dense", "sharing", "sharing_mesh", "powersgd", "powersgd_warmup")
#: model -> (batch per worker, epochs, Adam's learning rate: the default and mnist confs')
MODELS = {"mlp": (16, 10, 0.002), "lenet": (16, 10, 0.002)}
HARNESS_RATE = "1gbit"


def _shards(spark: Any, root: str, model: str) -> dict[str, Any]:
    if model == "mlp":
        from sparkdl.pipelines import digits

        return digits.run(spark, f"file://{root}/digits")
    from sparkdl.etl.samples import write_mnist_sample
    from sparkdl.pipelines import mnist

    idx = write_mnist_sample(f"{root}/idx")
    return mnist.run(spark, f"file://{root}/mnist", path=idx, num_files=4, rows_per_group=64)


def _model(name: str, feature_shape: Any, classes: int, learning_rate: float, seed: int) -> Any:
    import keras

    from sparkdl.models import lenet, mlp

    keras.utils.set_random_seed(seed)
    model = (mlp(feature_shape, classes, hidden=(128, 64)) if name == "mlp"
             else lenet(feature_shape, classes))
    model.compile(optimizer=keras.optimizers.Adam(learning_rate),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _master(mode: str, batch: int, workers: int, seed: int, steps_per_epoch: int) -> Any:
    from sparkdl.compression.powersgd import PowerSGDCompressorConfig
    from sparkdl.training.masters import DenseTrainingMaster, SharedTrainingMaster

    if mode == "dense":
        return DenseTrainingMaster(batch, workers, seed=seed)
    if mode.startswith("powersgd"):
        start = steps_per_epoch if mode == "powersgd_warmup" else 0
        return SharedTrainingMaster(batch, workers, seed=seed, compressor=PowerSGDCompressorConfig(
            rank=4, start_step=start))
    return SharedTrainingMaster(batch, workers, seed=seed)


def fit_cell(name: str, mode: str, shards: dict[str, Any], workers: int, seed: int,
             epochs: int | None = None, spark: Any = None) -> dict[str, Any]:
    """One fit: test accuracy, steady ms per step, bytes per worker per step, load. With
    ``spark``, a ``SparkModel`` fit on that session's executors, else local processes."""
    from sparkdl.config import ClusterConfig
    from sparkdl.data.files import read_metadata
    from sparkdl.parallel import ParallelWrapper
    from sparkdl.spark_model import SparkModel

    batch, default_epochs, learning_rate = MODELS[name]
    epochs = epochs or default_epochs
    meta = read_metadata(shards["train"])
    model = _model(name, meta.feature_shape, meta.num_classes, learning_rate, seed)
    load = os.getloadavg()[0]
    master = _master(mode, batch, workers, seed, meta.num_rows // (batch * workers))
    mesh = "mesh" if mode == "sharing_mesh" else "plain"
    trainer = (ParallelWrapper(model, master, timeout_s=600, mesh=mesh) if spark is None else
               SparkModel(spark, model, master, cluster=ClusterConfig(topology="flat",
                                                                      mesh=mesh)))
    fit = trainer.fit(shards["train"], epochs=epochs, validation_data=shards["test"],
                      validation_freq=epochs, verbose=0)
    metrics = fit.metrics
    steady = metrics.get("steady_samples_per_second") or metrics["samples_per_second"]
    return {
        "model": name, "mode": mode, "workers": workers, "epochs": epochs,
        "batch_per_worker": batch, "seed": seed,
        "test_accuracy": float(fit.history["val_accuracy"][-1]),
        "step_ms": batch * workers / steady * 1e3,
        "bytes_per_step": float(metrics.get("steady_bytes_per_step")
                                or metrics["bytes_per_step"]),
        "replicas_identical": bool(metrics["replicas_identical"]),
        "load1_before": load, "load1_after": os.getloadavg()[0],
    }


def run(options: dict[str, Any]) -> dict[str, Any]:
    """Every model x mode at ``--ranks`` workers (default 8); ``--quick``: the MLP only, 2
    epochs (a smoke test: its accuracies are not the comparison)."""
    from sparkdl.session import get_spark

    workers = int(options.get("ranks") or 8)
    quick = bool(options.get("quick"))
    harness = bool(options.get("harness"))
    models = ("mlp",) if quick else tuple(MODELS)
    seed = 1
    cells: list[dict[str, Any]] = []
    started = time.monotonic()

    def fit_all(shards: dict[str, Any], spark: Any = None) -> None:
        for name in models:
            for mode in MODES:
                cells.append(fit_cell(name, mode, shards[name], workers, seed,
                                      epochs=2 if quick else None, spark=spark))
                print(f"  {name} {mode}: {cells[-1]['test_accuracy']:.4f} "
                      f"({time.monotonic() - started:.0f} s)", flush=True)

    with tempfile.TemporaryDirectory(prefix="sparkdl-workers-") as root:
        if harness:
            with _harness_session(root, workers) as spark:
                fit_all({name: _shards(spark, root, name) for name in models}, spark)
        else:
            spark = get_spark()
            try:
                shards = {name: _shards(spark, root, name) for name in models}
            finally:
                spark.stop()
            fit_all(shards)
    dense = {c["model"]: c["test_accuracy"] for c in cells if c["mode"] == "dense"}
    for cell in cells:
        cell["vs_dense_pp"] = (cell["test_accuracy"] - dense[cell["model"]]) * 100
    where = (f"{workers // 2} harness hosts x 2, {HARNESS_RATE} links" if harness
             else "local processes")
    print_table(
        f"{workers} workers ({where}, {os.cpu_count()} cores), the same seed, batch "
        f"and epochs per model; step ms include the workers' sharing of the cores",
        ["model", "mode", "test acc", "vs dense pp", "ms/step", "B/worker/step", "load1"],
        [(c["model"], c["mode"], c["test_accuracy"], c["vs_dense_pp"], c["step_ms"],
          int(c["bytes_per_step"]), f"{c['load1_before']:.1f}-{c['load1_after']:.1f}")
         for c in cells])
    worst = {name: min(c["vs_dense_pp"] for c in cells if c["model"] == name)
             for name in models}
    return {"workers": workers, "harness": harness, "cells": cells, "worst_vs_dense_pp": worst}


@contextlib.contextmanager
def _harness_session(root: str, workers: int) -> Iterator[Any]:
    """A SparkSession on a network-namespace cluster of ``workers // 2`` hosts x 2 workers
    (brought up here, taken down after)."""
    from benchmarks.netcluster import NetCluster, check_privileges
    from benchmarks.scaling import _session

    if workers < 2 or workers % 2:
        raise ValueError(f"--harness needs an even number of workers, got --ranks {workers}")
    check_privileges()
    cluster = NetCluster(workers // 2, 2, rate=HARNESS_RATE, state_dir=Path(root) / "cluster",
                         name="sdlw", subnet="10.77.7")
    cluster.up()
    try:
        with _session(cluster, 2) as spark:
            yield spark
    finally:
        cluster.down()
