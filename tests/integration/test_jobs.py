"""The jobs as a user runs them: python jobs/*.py and spark-submit, in fresh processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from _startup import STARTUP_CHATTER

from sparkdl.logs import TF_BANNER

REPO = Path(__file__).resolve().parents[2]
CONF = str(REPO / "conf" / "digits.yaml")

pytestmark = pytest.mark.spark


def run(args: list[str], tmp_path: Path, timeout: float = 400) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_WORKER_DIR": str(tmp_path / "spark-work"),
    }
    return subprocess.run(
        args, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def spark_submit() -> str:
    return str(Path(sys.executable).parent / "spark-submit")


def test_pipeline_job_default_conf(tmp_path):
    """The main job as a user sees it: one progress line per epoch *while* it trains, no
    TensorFlow banner, history.csv and report.html written, one JSON object last."""
    out, data = tmp_path / "out", tmp_path / "data"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    proc = subprocess.Popen(
        [sys.executable, "jobs/pipeline.py", "--conf", CONF,
         "--set", f"data.dir={data}", "--set", f"output.dir={out}",
         "--json-out", str(tmp_path / "result.json")],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    stderr_lines: list[str] = []
    drain = threading.Thread(target=lambda: stderr_lines.extend(proc.stderr), daemon=True)
    drain.start()
    # For each line: was the job still running, and had it saved the model yet, when the
    # line was read? Proves streaming by order (the fit's epoch lines are read before the
    # fit ends and its model is written), never by the clock.
    arrivals: list[tuple[bool, str]] = []
    try:
        for line in proc.stdout:  # read as the job writes, not after it ended
            before_model = proc.poll() is None and not (out / "model.keras").exists()
            arrivals.append((before_model, line.rstrip("\n")))
        proc.wait(timeout=400)
    finally:
        proc.kill()
    drain.join(10)
    stdout = "\n".join(text for _, text in arrivals)
    assert proc.returncode == 0, "".join(stderr_lines)[-3000:]
    epochs = [(at, text) for at, text in arrivals if text.startswith("epoch ")]
    assert [text.split()[1] for _, text in epochs] == [f"{e}/12" for e in range(1, 13)], stdout
    assert "val_loss" in epochs[0][1] and "B/step" in epochs[0][1]
    # printed as each epoch ended: the first epoch's line was read while the job was still
    # training, before it wrote model.keras (a job that printed its lines at the end fails)
    assert epochs[0][0], "the first epoch line arrived only after the model was saved"
    assert not arrivals[-1][0], "the result line came before the model was saved"
    banner = [line for line in [*stdout.splitlines(), *stderr_lines] if TF_BANNER.search(line)]
    assert len(banner) <= 2, banner
    # from the first seconds it says what it does: Spark's start, the ETL, the workers ready
    said = [next((line for line in stderr_lines if what in line), None)
            for what in ("starting Spark", "Spark started in", "etl: the digits pipeline",
                         "train, 374 test rows written in", "the workers are ready")]
    assert all(said), (said, stderr_lines[:20])
    chatter = [line for line in stderr_lines if STARTUP_CHATTER.search(line)]
    assert chatter == [], chatter  # the JVM's start-up lines (log4j notice, hostname, ...)
    result = json.loads(arrivals[-1][1])  # one JSON object, the last line
    assert result["model"] == str(out / "model.keras")
    assert json.loads((tmp_path / "result.json").read_text()) == result  # --json-out
    header = (out / "history.csv").read_text().splitlines()[0].split(",")
    assert header[:3] == ["epoch", "loss", "accuracy"] and "val_loss" in header
    report = (out / "report.html").read_text()
    assert report.count('<img src="data:image/png;base64,') >= 4
    metrics = json.loads((out / "metrics.json").read_text())
    for key in ("test_accuracy", "epochs", "steps", "samples_per_second", "bytes_per_step",
                "dense_bytes_per_step"):
        assert key in metrics, key
    assert metrics["mode"] == "sharing"
    assert metrics["test_accuracy"] >= 0.95
    assert metrics["dense_bytes_per_step"] / metrics["bytes_per_step"] >= 50
    assert (data / "train" / "_sparkdl.json").is_file()


def test_fit_on_two_executor_jvms(tmp_path, digits_shards):
    out = tmp_path / "out"
    data_dir = digits_shards["train"].rsplit("/", 1)[0]
    result = tmp_path / "train.json"
    proc = run([sys.executable, "jobs/train.py", "--conf", CONF,
                "--set", f"data.dir={data_dir}", "--set", f"output.dir={out}",
                "--set", "cluster.master=local-cluster[2,1,1024]",
                "--set", "training.epochs=3", "--json-out", str(result)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the stage's result: in --json-out (what the Airflow DAG's tasks push) and as the last
    # line of stdout (the stage jobs one at a time: test_airflow_dag.py)
    assert json.loads(result.read_text()) == json.loads(proc.stdout.splitlines()[-1])
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["replicas_identical"] is True
    assert metrics["steps"] == 3 * metrics["steps_per_epoch"]
    assert len(set(metrics["executor_addresses"])) == 2, metrics["executor_addresses"]
    assert metrics["topology"] == "flat"  # auto: two executors, but on one host


def test_a_stage_spark_refuses_for_want_of_slots_is_retried_then_named(tmp_path, digits_shards):
    """Spark refuses a barrier stage with more tasks than registered slots (executors still
    registering, or too few); the launcher submits it again until ``cluster.timeout_s``, then
    fails with one line naming the slots and the setting. Here the refusal is for good:
    ``spark.default.parallelism=3`` on ``local[2]`` passes the slot check before launch, and
    Spark refuses the three-task stage on its two slots every time."""
    out = tmp_path / "out"
    data_dir = digits_shards["train"].rsplit("/", 1)[0]
    proc = run([sys.executable, "jobs/train.py", "--conf", CONF,
                "--set", f"data.dir={data_dir}", "--set", f"output.dir={out}",
                "--set", "cluster.master=local[2]", "--set", "training.num_workers=3",
                "--set", "cluster.spark_conf.spark.default.parallelism=3",
                "--set", "cluster.timeout_s=3"], tmp_path, timeout=300)
    assert proc.returncode != 0
    assert "waiting for the executors: the training stage needs 3 task slots" in proc.stderr
    assert "Spark refused the training stage for 3 s (cluster.timeout_s): barrier mode " \
           "needs 3 task slots at once" in proc.stderr, proc.stderr[-3000:]
    assert "Traceback (most recent call last)" not in proc.stderr
    assert not (out / "model.keras").exists()


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("training:\n  epochz: 3\n", "unknown key 'training.epochz'"),
        ("training:\n  epochs: ten\n", "training.epochs"),
    ],
)
def test_bad_conf_fails_fast_and_writes_nothing(tmp_path, yaml_text, message):
    conf = tmp_path / "bad.yaml"
    conf.write_text(yaml_text + f"output:\n  dir: {tmp_path / 'out'}\n")
    proc = run([sys.executable, "jobs/pipeline.py", "--conf", str(conf)], tmp_path, timeout=60)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_reader_benchmark_quick_run(tmp_path):
    """The reader suite runs end to end and writes its headline figures (no timing asserted)."""
    out = tmp_path / "reader.json"
    proc = run([sys.executable, "jobs/benchmark.py", "reader", "--quick", "--json", str(out)],
               tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["reader_vs_pyarrow"] > 0 and 0 <= figures["data_wait_fraction"] < 1
    assert 0 < figures["shard_reader_peak_row_groups"] < figures["row_groups"]
    assert "ShardReader (batches of 256)" in proc.stdout


@pytest.mark.slow
def test_workers_benchmark_quick_run(tmp_path):
    """The workers suite fits every exchange on the digits MLP end to end and writes its table
    (2 workers, 2 epochs: a smoke test; the accuracy comparison at 8 workers is the suite's
    full run, docs/scaling.md; the collectives at 8 ranks are tests/unit/test_comm_mesh.py)."""
    out = tmp_path / "workers.json"
    proc = run([sys.executable, "jobs/benchmark.py", "workers", "--quick", "--ranks", "2",
                "--json", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    cells = figures["cells"]
    assert [c["mode"] for c in cells] == ["dense", "sharing", "sharing_mesh", "powersgd",
                                         "powersgd_warmup"]
    for cell in cells:
        assert cell["replicas_identical"] is True and cell["workers"] == 2, cell
        assert cell["test_accuracy"] > 0.5 and cell["bytes_per_step"] > 0, cell
    dense = next(c for c in cells if c["mode"] == "dense")
    assert all(c["bytes_per_step"] < dense["bytes_per_step"] for c in cells if c is not dense)
    assert "vs dense pp" in proc.stdout
