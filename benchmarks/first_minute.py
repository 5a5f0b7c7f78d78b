"""The first minute: the README's quick-start job against the same work in one process.

``python jobs/benchmark.py first-minute [--repeats N] [--quick]`` runs, alternately and each in
a fresh interpreter:

* **the job**: ``python jobs/pipeline.py --conf conf/digits.yaml`` — the digits ETL into 8
  Parquet shard files, 12 epochs of gradient sharing on ``local[2]`` (2 workers x 32 rows),
  the evaluation stage and the report;
* **one process**: the same work without Spark — scikit-learn's digits split 80/20 (a seeded
  shuffle), standardised with the train rows' statistics, the same MLP (128, 64; Adam 0.002)
  fitted for 12 epochs at batch 64 (the job's global batch), evaluated on the test rows.

The job's phases come from the timestamps of its own log lines (``starting Spark``, ``Spark
started``, ``etl: ...``, ``fit: ...``, ``the workers are ready``, ``train: ...``,
``evaluate: ...``); "start" is the interpreter's start and the imports up to Spark's, "exit"
what follows the last line (stopping Spark). Each row prints the load average (1 min) at its
start; the verdict compares the median wall times (target: the job within 2.5x of one
process). ``--quick``: one of each.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.report import print_table

REPO = Path(__file__).resolve().parents[1]
TARGET_RATIO = 2.5
#: phase name -> the log line that ends it (each phase starts where the one before ends)
MARKERS = {
    "start": "starting Spark",
    "spark": "Spark started in",
    "etl": "rows written in",
    "to fit": "workers x batch",
    "workers": "the workers are ready",
    "training": "train: the model and its metrics written",
    "evaluation": "evaluate: the evaluation and report written",
}
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")

ONE_PROCESS = """
import time
started = time.time()
import numpy as np
import keras
from sklearn.datasets import load_digits
from sparkdl.models import mlp

data = load_digits()
x, y = data.data.astype("float32"), data.target
order = np.random.default_rng(42).permutation(len(x))
test = order[: int(0.2 * len(x))]
train = order[int(0.2 * len(x)):]
mean, std = x[train].mean(axis=0), x[train].std(axis=0)
x = (x - mean) / np.where(std > 0, std, 1.0)
keras.utils.set_random_seed(42)
model = mlp((64,), 10, hidden=(128, 64))
model.compile(optimizer=keras.optimizers.Adam(0.002), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
model.fit(x[train], y[train], batch_size=64, epochs=12, verbose=0,
          validation_data=(x[test], y[test]))
loss, accuracy = model.evaluate(x[test], y[test], verbose=0)
print(f"accuracy {accuracy:.4f} in {time.time() - started:.1f} s")
"""


def run(options: dict[str, Any]) -> dict[str, Any]:
    repeats = 1 if options.get("quick") else int(options.get("repeats") or 3)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sparkdl-first-minute-") as work:
        for i in range(repeats):
            order = ("job", "one process") if i % 2 == 0 else ("one process", "job")
            for kind in order:
                run_dir = Path(work) / f"{kind.replace(' ', '-')}-{i}"
                run_dir.mkdir()
                load = os.getloadavg()[0]
                measured = _job(run_dir) if kind == "job" else _one_process(run_dir)
                runs.append({"kind": kind, "load1": load, **measured})
                print(f"  {kind}: {measured['wall_s']:.1f} s (load {load:.2f})", flush=True)
    rows = [(r["kind"], f"{r['load1']:.2f}", f"{r['wall_s']:.1f}",
             *(f"{r['phases'].get(p, float('nan')):.1f}" for p in (*MARKERS, "exit")))
            for r in runs]
    print_table(
        "the quick-start job (jobs/pipeline.py, digits conf) and the same work in one "
        "process, alternately; phases of the job from its log lines (s)",
        ["run", "load1", "wall s", *MARKERS, "exit"], rows)
    job = statistics.median(r["wall_s"] for r in runs if r["kind"] == "job")
    alone = statistics.median(r["wall_s"] for r in runs if r["kind"] == "one process")
    ratio = job / alone
    verdict = "met" if ratio <= TARGET_RATIO else "missed"
    print(f"median wall: job {job:.1f} s, one process {alone:.1f} s: {ratio:.2f}x "
          f"(target {TARGET_RATIO}x: {verdict}); load {os.getloadavg()[0]:.2f} now")
    phases = {p: statistics.median(r["phases"].get(p, float("nan")) for r in runs
                                   if r["kind"] == "job") for p in (*MARKERS, "exit")}
    return {"runs": runs, "job_wall_s": job, "one_process_wall_s": alone, "ratio": ratio,
            "verdict": verdict, "job_phases_s": phases, "target_ratio": TARGET_RATIO}


def _job(run_dir: Path) -> dict[str, Any]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable}
    started = time.time()
    proc = subprocess.run(
        [sys.executable, "jobs/pipeline.py", "--conf", "conf/digits.yaml",
         "--set", f"output.dir={run_dir / 'out'}", "--set", f"data.dir={run_dir / 'data'}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
    ended = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"the quick-start job failed: {proc.stderr[-3000:]}")
    return {"wall_s": ended - started, "phases": phases(proc.stderr, started, ended)}


def _one_process(run_dir: Path) -> dict[str, Any]:
    started = time.time()
    proc = subprocess.run([sys.executable, "-c", ONE_PROCESS], cwd=run_dir,
                          capture_output=True, text=True, timeout=900, check=False)
    ended = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"the one-process run failed: {proc.stderr[-3000:]}")
    return {"wall_s": ended - started, "phases": {}, "said": proc.stdout.strip()}


def phases(log: str, started: float, ended: float) -> dict[str, float]:
    """Each phase's seconds from the job's log lines (``MARKERS``), ``exit`` the rest."""
    seen: dict[str, float] = {}
    for line in log.splitlines():
        stamp = STAMP.match(line)
        if not stamp:
            continue
        for phase, marker in MARKERS.items():
            if phase not in seen and marker in line:
                seen[phase] = datetime.strptime(stamp.group(1),
                                                "%Y-%m-%d %H:%M:%S,%f").timestamp()
    result, previous = {}, started
    for phase in MARKERS:
        if phase in seen:
            result[phase] = seen[phase] - previous
            previous = seen[phase]
    result["exit"] = ended - previous
    return result
