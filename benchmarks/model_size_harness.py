"""Models of real size across hosts: ``python jobs/benchmark.py model-size --harness``.

The network-namespace harness (:mod:`benchmarks.netcluster`, root needed): 2 hosts of one
worker each, every byte between them through a ``tc tbf`` link. For each model
(``--models``, default ``resnet50``; :func:`benchmarks.model_size.build_model`) and mode, one
fit through real Spark barrier stages whose epochs run at a warm-up rate (not measured: it
traces the step), then 1 Gbit/s, then 100 Mbit/s (a driver callback changes the rate between
epochs). Modes: ``compute`` (parameter averaging that never averages inside an epoch: the
compute-only step, the reference), dense float32, dense with a bfloat16 wire (the fair
baseline for compression), threshold sharing and PowerSGD (rank 4), each of the last two also
with ``overlap``. Per cell: the mean step of the rate's epoch, its ratio to the compute-only
step at that rate (the targets: sharing at least 0.9 at 1 Gbit/s and 0.85 at 100 Mbit/s,
PowerSGD 0.8 at 100 Mbit/s), the bytes a worker sends per step, and where the step's time
goes (the epoch's phases per step), with the 1-minute load average beside it.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.report import print_table

HOSTS = 2
CORES_PER_HOST = 1
MODES = ("compute", "dense", "dense-bf16", "sharing", "sharing-overlap", "powersgd",
         "powersgd-overlap")
RATES = ("1gbit", "100mbit")
SCHEDULE = ("1gbit", *RATES)  # a warm-up epoch, then one per rate
STEPS_PER_EPOCH = 4
#: Where a step's time goes, per epoch (each a mean over the ranks of the epoch's sum).
PHASES = ("data_wait_s", "compute_s", "encode_s", "communicate_s", "decode_s", "apply_s")
TARGETS = {("sharing", "1gbit"): 0.9, ("sharing", "100mbit"): 0.85,
           ("powersgd", "100mbit"): 0.8}


def _shards(root: Path, model_name: str) -> str:
    from benchmarks.model_size import BATCH, SHAPES, sample_data
    from benchmarks.timeline import write_arrays

    x, y = sample_data(model_name, SHAPES[model_name], HOSTS * BATCH[model_name] * STEPS_PER_EPOCH)
    return "file://" + write_arrays(root, x, y, classes=10, batch=BATCH[model_name],
                                    num_files=HOSTS)


def _fit(spark: Any, cluster: Any, uri: str, model_name: str, mode: str) -> dict[str, Any]:
    import keras

    from benchmarks.model_size import BATCH, build_model, master_for
    from sparkdl.config import ClusterConfig
    from sparkdl.spark_model import SparkModel

    class RateSchedule(keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if epoch + 1 < len(SCHEDULE) and SCHEDULE[epoch + 1] != SCHEDULE[epoch]:
                cluster.set_rate(SCHEDULE[epoch + 1])

    cluster.set_rate(SCHEDULE[0])
    model, _ = build_model(model_name)
    fit = SparkModel(spark, model, master_for(mode, BATCH[model_name], workers=HOSTS),
                     cluster=ClusterConfig(topology="flat")).fit(
        uri, epochs=len(SCHEDULE), verbose=0, log_every_steps=10**6,
        callbacks=[RateSchedule()])
    steps = fit.metrics["steps_per_epoch"]
    history = fit.history
    phases = [name for name in PHASES if name in history]
    return {
        "step_s": [s / steps for s in history["epoch_s"]],
        "bytes_per_step": list(history["bytes_sent_per_step"]),
        "phases": [{name: history[name][e] / steps for name in phases}
                   for e in range(len(SCHEDULE))],
        "load": os.getloadavg()[0],
    }


def run(options: dict[str, Any]) -> dict[str, Any]:
    from benchmarks.model_size import build_model, count_parameters
    from benchmarks.netcluster import NetCluster, check_privileges
    from benchmarks.scaling import _session

    check_privileges()
    models = (options.get("models") or "resnet50").split(",")
    modes = (options.get("modes") or ",".join(MODES)).split(",")
    if "compute" not in modes:
        modes.insert(0, "compute")
    workdir = Path(tempfile.mkdtemp(prefix="sparkdl-size-harness-"))
    cluster = NetCluster(HOSTS, CORES_PER_HOST, state_dir=workdir / "cluster", name="sdlz",
                         subnet="10.77.8")
    cells: list[dict[str, Any]] = []
    started = time.time()
    try:
        cluster.up()
        with _session(cluster, 1) as spark:
            for model_name in models:
                uri = _shards(workdir / model_name, model_name)
                model, _ = build_model(model_name)
                parameters = count_parameters(model)
                del model
                for mode in modes:
                    measured = _fit(spark, cluster, uri, model_name, mode)
                    print(f"[{time.time() - started:6.0f} s] {model_name} {mode}: "
                          + ", ".join(f"{s * 1e3:.0f} ms" for s in measured["step_s"][1:])
                          + f" (load {measured['load']:.2f})", flush=True)
                    for epoch, rate in enumerate(SCHEDULE[1:], start=1):
                        cells.append({
                            "model": model_name, "parameters": parameters, "mode": mode,
                            "rate": rate, "step_s": measured["step_s"][epoch],
                            "bytes_per_step": measured["bytes_per_step"][epoch],
                            "phases": measured["phases"][epoch], "load": measured["load"],
                        })
    finally:
        cluster.down()
    compute = {(c["model"], c["rate"]): c["step_s"] for c in cells if c["mode"] == "compute"}
    for cell in cells:
        cell["of_compute"] = compute[cell["model"], cell["rate"]] / cell["step_s"]
        target = TARGETS.get((cell["mode"].removesuffix("-overlap"), cell["rate"]))
        cell["target"] = target
        cell["met"] = None if target is None else cell["of_compute"] >= target
    print_table(
        f"Models of real size on {HOSTS} harness hosts x 1 worker, {STEPS_PER_EPOCH} steps per "
        "rate: step time against the compute-only step",
        ["model", "mode", "rate", "step ms", "compute / step", "target", "MB sent/step",
         "phases ms per step", "load"],
        [[c["model"], c["mode"], c["rate"], f"{c['step_s'] * 1e3:.0f}",
          f"{c['of_compute']:.2f}",
          "" if c["target"] is None else f">= {c['target']} {'met' if c['met'] else 'missed'}",
          f"{c['bytes_per_step'] / 1e6:.2f}",
          " ".join(f"{k.removesuffix('_s')} {v * 1e3:.0f}" for k, v in c["phases"].items()
                   if v and v > 5e-4),
          f"{c['load']:.2f}"] for c in cells],
    )
    medians = {m: statistics.median(c["of_compute"] for c in cells if c["mode"] == m)
               for m in dict.fromkeys(c["mode"] for c in cells)}
    return {"cells": cells, "median_of_compute": medians, "workdir": str(workdir)}
