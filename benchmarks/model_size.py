"""Models of real size: step time, bytes per step, time to the first step and the peak memory
of every process, per model size and training mode, 2 workers on ``local[2]``.

Each cell is a fresh job process (``python -m benchmarks.model_size --cell MODEL MODE OUT``)
with ``spark.driver.memory=1g``; this process samples the resident memory (``VmRSS`` in
``/proc/PID/status``, every 0.2 s) of the job's whole process tree: the driver (the job's
Python process), the JVM, and each Python worker the JVM started (the training tasks). With
``--sessions connect`` the job is a Spark Connect client (``SparkSession.builder.remote
("local[2]")``): the JVM is the local Connect server pyspark starts, with the same 1 GB. The
*state* is the model's weights and optimizer slots (Adam: 3 × the weights; plain SGD: the
weights). Each process's
*growth* is its peak above the same process's peak in the ``tiny`` cell of the same mode
(Python, Spark and TensorFlow loaded, a 17k-parameter model): the memory the model's size
costs. The targets: growth at most 3 × the state for a worker, 2 × for the driver.

Models (``weights=None``; shapes small enough for 2 cores):

* ``tiny``: the digits MLP (64 → 128 → 64 → 10), the baseline;
* ``resnet50``: ``keras.applications.ResNet50`` on 32 × 32 × 3 inputs, 10 classes (23.6M);
* ``mlp-40m``: an MLP 64 → 4096 → 4096 → 4096 → 2048 → 10 (42M);
* ``bert-base``: a BERT-base-size Transformer encoder (vocabulary 30,522, 12 layers of width
  768, 12 heads, feed-forward 3,072; sequences of 16 tokens) with a classification head
  (109M);
* ``bert-large``: a BERT-large-size encoder (24 layers of width 1,024, 16 heads, feed-forward
  4,096; 334M), trained with plain SGD: the largest model that fits this machine (24 GB)
  three times over (the driver that builds it and two workers); Adam's two slots would add
  2.7 GB to each of them.

Mode ``keras`` is the reference for the memory: the same model fitted by plain Keras
(``model.fit`` on arrays, one process, no Spark) for the same steps, its process's peak in
the *worker* column: the memory TensorFlow and Keras themselves take for the step.

``time to first step`` runs from the ``fit`` call to the driver's event of the first step's
end (writing the model, starting the tasks, loading the model, tracing the step).

Mode ``sharing-resume`` checks checkpoints at size: a sharing fit of ``EPOCHS`` epochs
straight, then the same fit stopped after one epoch (a checkpoint at its end: the model with
Adam's slots and every rank's residual) and resumed from it with ``resume=True``; the two
trained models must be the same bit for bit (weights and optimizer state), which they are
only if every rank's residual, threshold and optimizer state came back exactly. Its memory
is the peak over the three fits, checkpoint writes and reads included.

Mode ``sharing-elastic`` checks an elastic relaunch's resume at size: a 2-worker sharing fit
stopped after one epoch's checkpoint, resumed by an elastic fit with 1 worker
(``ElasticPolicy(min_workers=1)``), as the relaunch after a lost host does: rank 1's residual
folded into rank 0's, the data re-planned; it passes when that fit trains its remaining epoch
on one worker from the checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.report import print_table

MODELS = ("tiny", "resnet50", "mlp-40m", "bert-base", "bert-large")
MODES = ("dense", "dense-bf16", "sharing", "powersgd", "averaging")
SESSIONS = ("classic", "connect")
KERAS = "keras"  # not in the default grid either: the reference, plain Keras, no Spark
RESUME = "sharing-resume"  # not in the default grid: three fits
ELASTIC = "sharing-elastic"  # nor this: two more fits
#: Per-worker batch of each model (small: the figures are of the exchange and the memory).
BATCH = {"tiny": 32, "resnet50": 8, "mlp-40m": 32, "bert-base": 4, "bert-large": 4}
#: Each model's feature shape (the encoders: token ids of a 16-token sequence).
SHAPES = {"tiny": [64], "resnet50": [32, 32, 3], "mlp-40m": [64], "bert-base": [16],
          "bert-large": [16]}
#: Optimizer slots per weight (Adam: its two moments; plain SGD: none).
SLOTS = {"adam": 2, "sgd": 0}
STEPS_PER_EPOCH = 3
EPOCHS = 2  # the second epoch's steps are the steady ones
WORKERS = 2


def build_model(name: str) -> tuple[Any, list[int]]:
    """The compiled Keras model ``name`` (Adam; ``bert-large``: plain SGD) and its feature
    shape."""
    import keras

    keras.utils.set_random_seed(1)
    if name == "tiny":
        from sparkdl.models import mlp

        model = mlp((64,), 10)
    elif name == "mlp-40m":
        from sparkdl.models import mlp

        model = mlp((64,), 10, hidden=(4096, 4096, 4096, 2048))
    elif name == "resnet50":
        model = keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3), classes=10)
    elif name == "bert-base":
        model = _encoder(vocabulary=30522, length=16, width=768, layers=12, heads=12,
                         hidden=3072)
    elif name == "bert-large":
        model = _encoder(vocabulary=30522, length=16, width=1024, layers=24, heads=16,
                         hidden=4096)
    else:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    optimizer = (keras.optimizers.SGD(1e-3) if name == "bert-large"
                 else keras.optimizers.Adam(1e-4))
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    return model, SHAPES[name]


def _encoder(vocabulary: int, length: int, width: int, layers: int, heads: int,
             hidden: int) -> Any:
    import keras
    from keras import layers as kl

    tokens = keras.Input((length,))
    x = kl.Embedding(vocabulary, width)(tokens)  # float ids: Embedding casts them
    x = x + kl.Embedding(length, width)(keras.ops.arange(length))
    x = kl.LayerNormalization()(x)
    for _ in range(layers):
        attended = kl.MultiHeadAttention(heads, width // heads)(x, x)
        x = kl.LayerNormalization()(x + attended)
        forward = kl.Dense(width)(kl.Dense(hidden, activation="gelu")(x))
        x = kl.LayerNormalization()(x + forward)
    pooled = kl.Dense(width, activation="tanh")(x[:, 0])
    return keras.Model(tokens, kl.Dense(10, activation="softmax")(pooled))


def master_for(mode: str, batch: int, workers: int = WORKERS) -> Any:
    """The training master of ``mode`` (a suffix ``-overlap`` turns overlap on; ``compute``:
    parameter averaging that never averages, the compute-only reference)."""
    from sparkdl.compression.powersgd import PowerSGDCompressorConfig
    from sparkdl.training.masters import (
        DenseTrainingMaster,
        ParameterAveragingTrainingMaster,
        SharedTrainingMaster,
    )

    common: dict[str, Any] = {"batch_size_per_worker": batch, "num_workers": workers}
    base, overlap = mode.removesuffix("-overlap"), mode.endswith("-overlap")
    if base == "compute":
        return ParameterAveragingTrainingMaster(**common, averaging_frequency=10**9)
    if base == "dense":
        return DenseTrainingMaster(**common, overlap=overlap)
    if base == "dense-bf16":
        return DenseTrainingMaster(**common, wire_dtype="bfloat16", overlap=overlap)
    if base in ("sharing", RESUME, ELASTIC):
        return SharedTrainingMaster(**common, overlap=overlap)
    if base == "powersgd":
        return SharedTrainingMaster(**common, compressor=PowerSGDCompressorConfig(rank=4),
                                    overlap=overlap)
    if base == "averaging":
        return ParameterAveragingTrainingMaster(**common, averaging_frequency=2)
    raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")


# One cell, in its own process ---------------------------------------------------------------


def session(kind: str) -> Any:
    """A ``local[2]`` session with a 1 GB driver JVM: ``classic``, or ``connect`` (a Spark
    Connect client of the local Connect server pyspark starts, whose JVM is the driver)."""
    if kind not in SESSIONS:
        raise ValueError(f"unknown session {kind!r}; known: {', '.join(SESSIONS)}")
    if kind == "classic":
        from sparkdl.config import ClusterConfig
        from sparkdl.session import get_spark

        return get_spark(ClusterConfig(spark_conf={"spark.driver.memory": "1g"}))
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return (SparkSession.builder.remote("local[2]")
            .config("spark.driver.memory", "1g").getOrCreate())


def run_cell(model_name: str, mode: str, out: str, kind: str = "classic") -> None:
    """Fit ``model_name`` in ``mode`` for a few steps on a ``kind`` session
    (:func:`session`) and write the figures to ``out``."""
    import keras
    import pandas as pd

    from sparkdl.data.writer import write_shards
    from sparkdl.spark_model import SparkModel

    if mode == KERAS:
        keras_cell(model_name, out)
        return
    spark = session(kind)
    model, shape = build_model(model_name)
    batch = BATCH[model_name]
    rows = WORKERS * batch * STEPS_PER_EPOCH
    x, y = sample_data(model_name, shape, rows)
    with tempfile.TemporaryDirectory(prefix="sparkdl-bench-size-") as workdir:
        uri = f"file://{workdir}/shards"
        frame = pd.DataFrame({"features": list(x.reshape(rows, -1)), "label": y})
        write_shards(spark.createDataFrame(frame), uri, feature_shape=shape,
                     classes=[str(i) for i in range(10)], num_files=WORKERS,
                     rows_per_group=batch)
        first: list[float] = []

        class FirstStep(keras.callbacks.Callback):
            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                if not first:
                    first.append(time.perf_counter())

        parameters = count_parameters(model)
        resumed_identical = (_resumes_exactly(spark, model_name, mode, uri, workdir)
                             if mode == RESUME else None)
        if mode == ELASTIC:
            resumed_identical = _resumes_on_fewer_workers(spark, model_name, uri, workdir)
        before_fit = _rss()  # the model built, Spark up: what a user's script holds
        started = time.perf_counter()
        fit = SparkModel(spark, model, master_for(mode, batch)).fit(
            uri, epochs=EPOCHS, verbose=0, log_every_steps=1, callbacks=[FirstStep()])
        wall = time.perf_counter() - started
    metrics = fit.metrics
    steady = metrics.steady_samples_per_second
    Path(out).write_text(json.dumps({
        "parameters": parameters,
        "state_bytes": state_bytes(model),
        "step_s": WORKERS * batch / steady if steady else None,
        "bytes_per_step": metrics.bytes_per_step,
        "dense_bytes_per_step": metrics.dense_bytes_per_step,
        "first_step_s": first[0] - started if first else None,
        "fit_s": wall,
        "replicas_identical": metrics.replicas_identical,
        "resumed_identical": resumed_identical,
        "driver_before_fit": before_fit,
    }))
    spark.stop()


def sample_data(model_name: str, shape: list[int], rows: int) -> tuple[Any, Any]:
    """``rows`` random examples for ``model_name``: token ids for the encoders, normal
    features otherwise, and labels of 10 classes (float32 features, a fixed seed)."""
    import numpy as np

    rng = np.random.default_rng(0)
    if model_name.startswith("bert"):
        x = rng.integers(0, 30522, (rows, *shape))
    else:
        x = rng.normal(0, 1, (rows, *shape))
    return x.astype(np.float32), rng.integers(0, 10, rows)


def count_parameters(model: Any) -> int:
    """The model's trainable parameters."""
    import numpy as np

    return sum(int(np.prod(w.shape)) for w in model.trainable_weights)


def state_bytes(model: Any) -> int:
    """The bytes of the model's state: its float32 weights and the optimizer's slots."""
    slots = SLOTS[type(model.optimizer).__name__.lower()]
    return 4 * count_parameters(model) * (1 + slots)


def keras_cell(model_name: str, out: str) -> None:
    """Mode ``keras``: plain ``model.fit`` of the same steps in this process, no Spark; the
    process's peak is the reference for a worker's."""
    import keras

    from sparkdl.training.worker.run_worker import configure_tensorflow

    configure_tensorflow(1)  # as a training task: one core, one malloc arena
    model, shape = build_model(model_name)
    batch = BATCH[model_name]
    x, y = sample_data(model_name, shape, batch * STEPS_PER_EPOCH)
    epochs: list[float] = []

    class EpochTimes(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            epochs.append(time.perf_counter())

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            epochs[-1] = time.perf_counter() - epochs[-1]

    started = time.perf_counter()
    model.fit(x, y, batch_size=batch, epochs=EPOCHS, verbose=0, callbacks=[EpochTimes()])
    Path(out).write_text(json.dumps({
        "parameters": count_parameters(model), "state_bytes": state_bytes(model),
        "step_s": epochs[-1] / STEPS_PER_EPOCH, "bytes_per_step": 0,
        "dense_bytes_per_step": 0, "first_step_s": None,
        "fit_s": time.perf_counter() - started, "replicas_identical": None,
        "resumed_identical": None, "driver_before_fit": 0,
    }))


def _rss(pid: int | str = "self") -> int:
    """A process's resident bytes now (``VmRSS``); 0 once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) * 1024 for line in status.splitlines()
                 if line.startswith("VmRSS:")), 0)


def _resumes_exactly(spark: Any, model_name: str, mode: str, uri: str, workdir: str) -> bool:
    """Whether a fit stopped after its first epoch's checkpoint and resumed gives, bit for
    bit, the model (weights and optimizer state) of the same fit run straight."""
    import numpy as np

    from sparkdl.spark_model import SparkModel

    def fit(epochs: int, checkpoint: str | None, resume: bool = False) -> list[Any]:
        model, _ = build_model(model_name)  # seeded: the same initial weights every time
        SparkModel(spark, model, master_for(mode, BATCH[model_name])).fit(
            uri, epochs=epochs, verbose=0, checkpoint_dir=checkpoint, resume=resume)
        return [np.asarray(v) for v in (*model.weights, *model.optimizer.variables)]

    straight = fit(EPOCHS, None)
    checkpoint = f"file://{workdir}/checkpoints"
    fit(1, checkpoint)
    resumed = fit(EPOCHS, checkpoint, resume=True)
    return len(straight) == len(resumed) and all(
        a.dtype == b.dtype and a.tobytes() == b.tobytes() for a, b in zip(straight, resumed))


def _resumes_on_fewer_workers(spark: Any, model_name: str, uri: str, workdir: str) -> bool:
    """Whether a 2-worker sharing fit's first-epoch checkpoint is resumed by an elastic fit on
    1 worker, which then trains the remaining epoch."""
    import math

    from sparkdl.spark_model import SparkModel
    from sparkdl.training.elastic import ElasticPolicy
    from sparkdl.training.masters import SharedTrainingMaster

    batch = BATCH[model_name]
    checkpoint = f"file://{workdir}/elastic-checkpoints"
    model, _ = build_model(model_name)
    SparkModel(spark, model, master_for(ELASTIC, batch)).fit(
        uri, epochs=1, verbose=0, checkpoint_dir=checkpoint)
    model, _ = build_model(model_name)
    one = SparkModel(spark, model, SharedTrainingMaster(batch_size_per_worker=batch,
                                                        num_workers=1),
                     elastic=ElasticPolicy(min_workers=1, max_failures=0))
    fit = one.fit(uri, epochs=EPOCHS, verbose=0, checkpoint_dir=checkpoint, resume=True)
    losses = fit.history["loss"]
    return (fit.metrics["num_workers"] == 1 and bool(fit.metrics["resumed_from"])
            and fit.history["workers"][-1] == 1 and all(math.isfinite(v) for v in losses))


# The grid, from this process ----------------------------------------------------------------


def _tree(root: int) -> dict[int, tuple[str, int]]:
    """``{pid: (role, rss bytes)}`` of ``root`` and its descendants now."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        parents[int(entry)] = int(stat[stat.rindex(")") + 2 :].split()[1])
        names[int(entry)] = name
    found: dict[int, tuple[str, int]] = {}
    for pid in parents:
        chain, node, jvm = [], pid, False
        while node in parents and node != root and node > 1:
            chain.append(node)
            node = parents[node]
            jvm = jvm or names.get(node) == "java"
        if node != root:
            continue
        role = ("driver" if pid == root else "jvm" if names[pid] == "java"
                else "worker" if jvm else "other")
        found[pid] = (role, _rss(pid))
    return found


def measure_cell(model_name: str, mode: str, workdir: str, kind: str = "classic"
                 ) -> dict[str, Any]:
    """Run one cell's job on a ``kind`` session and sample its process tree; its figures
    with each role's peak."""
    out = os.path.join(workdir, f"{model_name}-{mode}-{kind}.json")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    job = subprocess.Popen([sys.executable, "-m", "benchmarks.model_size", "--cell",
                            model_name, mode, out, kind], cwd=root, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peaks: dict[int, tuple[str, int]] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for pid, (role, rss) in _tree(job.pid).items():
                if rss > peaks.get(pid, (role, 0))[1]:
                    peaks[pid] = (role, rss)
            done.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        _, stderr = job.communicate(timeout=1800)
    finally:
        done.set()
        sampler.join()
    if job.returncode != 0 or not os.path.exists(out):
        tail = "\n".join(stderr.strip().splitlines()[-8:])
        return {"model": model_name, "mode": mode, "session": kind,
                "failed": tail or f"exit {job.returncode}"}
    figures = json.loads(Path(out).read_text())
    workers = sorted((rss for role, rss in peaks.values()
                      if role == ("driver" if mode == KERAS else "worker")), reverse=True)
    figures.update(
        model=model_name, mode=mode, session=kind,
        driver_peak=max((rss for role, rss in peaks.values() if role == "driver"), default=0),
        jvm_peak=max((rss for role, rss in peaks.values() if role == "jvm"), default=0),
        worker_peak=workers[0] if workers else 0,
        load=os.getloadavg()[0],
    )
    return figures


def run(options: dict[str, Any]) -> dict[str, Any]:
    """``quick``: tiny and resnet50 in dense and sharing. Otherwise every model and mode, or
    those named in ``options["models"]`` / ``options["modes"]`` (comma-separated), on the
    sessions in ``options["sessions"]`` (``classic``, ``connect``; default classic).
    ``harness``: the grid of :mod:`benchmarks.model_size_harness` instead."""
    if options.get("harness"):
        from benchmarks import model_size_harness

        return model_size_harness.run(options)
    quick = bool(options.get("quick"))
    models = (options.get("models") or ("tiny,resnet50" if quick else ",".join(MODELS)))
    modes = (options.get("modes") or ("dense,sharing" if quick else ",".join(MODES)))
    kinds = [k for k in (options.get("sessions") or "classic").split(",") if k]
    unknown = sorted(set(kinds) - set(SESSIONS))
    if unknown:
        raise ValueError(f"unknown sessions {unknown}; known: {', '.join(SESSIONS)}")
    chosen = [m for m in models.split(",") if m]
    if "tiny" not in chosen:
        chosen.insert(0, "tiny")  # the baseline of every growth figure
    cells: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sparkdl-bench-size-") as workdir:
        for kind in kinds:
            for model_name in chosen:
                for mode in [m for m in modes.split(",") if m]:
                    if mode == KERAS and kind != kinds[0]:
                        continue  # no session: once is enough
                    cell = measure_cell(model_name, mode, workdir, kind)
                    cells.append(cell)
                    print(json.dumps(cell), flush=True)
    base = {(c["mode"], c["session"]): c for c in cells
            if c["model"] == "tiny" and "failed" not in c}
    table = []
    for cell in cells:
        if "failed" in cell:
            table.append([cell["model"], cell["mode"], cell["session"],
                          "failed: " + cell["failed"][-60:]] + [""] * 13)
            continue
        ref = base.get((cell["mode"], cell["session"]), cell)
        state = cell["state_bytes"]
        driver_growth = (cell["driver_peak"] - ref["driver_peak"]) / state
        # the fit's own share: the peak above the driver's memory just before fit()
        fit_growth = (cell["driver_peak"] - cell["driver_before_fit"]) / state
        worker_growth = (cell["worker_peak"] - ref["worker_peak"]) / state
        cell.update(driver_growth_x_state=driver_growth, worker_growth_x_state=worker_growth,
                    driver_fit_growth_x_state=fit_growth)
        alone = cell["mode"] == KERAS  # one process: no driver, JVM or wire
        table.append([
            cell["model"], cell["mode"], "-" if alone else cell["session"],
            f"{cell['parameters'] / 1e6:.1f}M",
            f"{state / 1e6:.0f}", f"{(cell['step_s'] or 0) * 1e3:.0f}",
            "-" if alone else f"{cell['bytes_per_step'] / 1e6:.1f}",
            "-" if alone else f"{cell['first_step_s'] or 0:.1f}",
            *(["-"] * 3 if alone else [
                f"{cell['driver_before_fit'] / 1e6:.0f}", f"{cell['driver_peak'] / 1e6:.0f}",
                f"{cell['jvm_peak'] / 1e6:.0f}"]),
            f"{cell['worker_peak'] / 1e6:.0f}",
            "-" if cell["model"] == "tiny" or alone else f"{driver_growth:.2f}",
            "-" if cell["model"] == "tiny" or alone else f"{fit_growth:.2f}",
            "-" if cell["model"] == "tiny" else f"{worker_growth:.2f}",
            {None: "", True: "yes", False: "NO"}[cell.get("resumed_identical")],
            f"{cell['load']:.2f}",
        ])
    print_table(
        f"models of real size: {WORKERS} workers on local[2] (classic Spark or a Spark "
        "Connect client of a local server), spark.driver.memory=1g, "
        f"{STEPS_PER_EPOCH} steps x {EPOCHS} epochs; memory: peak VmRSS per process (MB); "
        "growth: the peak above the tiny model's in the same mode, over the state; growth in "
        "fit: the driver's peak above its memory just before fit(), over the state",
        ["model", "mode", "session", "params", "state MB", "step ms", "MB/step", "first step s",
         "driver MB before fit", "driver MB", "JVM MB", "worker MB", "driver growth/state",
         "driver growth in fit/state", "worker growth/state", "resumed", "load"],
        table,
    )
    return {"cells": cells}


if __name__ == "__main__":
    if len(sys.argv) in (5, 6) and sys.argv[1] == "--cell":
        run_cell(*sys.argv[2:])
    else:
        print("usage: python jobs/benchmark.py model-size [--quick]", file=sys.stderr)
        sys.exit(2)
