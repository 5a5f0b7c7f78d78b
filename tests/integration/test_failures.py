"""Failures and recovery on real Spark: lost workers, lost executors, hung peers, bad steps.

The cluster tests run ``jobs/train.py`` on ``local-cluster[2,1,1024]`` (two executor JVMs)
with checkpoints, hurt a worker once the first checkpoint exists (one job carries the killed
worker, the killed executor and the hung worker, one after another: each job pays Spark's
and TensorFlow's start), and check that the job completes from the checkpoint with the
accuracy of an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from sparkdl import DenseTrainingMaster, SharedTrainingMaster, SparkModel
from sparkdl.compression import AdaptiveThreshold
from sparkdl.errors import TrainingError
from sparkdl.training.model_files import temporary_model_dir

REPO = Path(__file__).resolve().parents[2]
CONF = str(REPO / "conf" / "digits.yaml")
EPOCHS = 16  # room to hurt a worker after the first checkpoint (step 40) and recover

pytestmark = pytest.mark.spark


# Process helpers (Linux /proc) -----------------------------------------------------------


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _descendants(root: int) -> set[int]:
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    children: dict[int, list[int]] = {}
    for pid in pids:
        children.setdefault(_parent(pid), []).append(pid)
    found, stack = set(), [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.add(child)
            stack.append(child)
    return found


def python_workers(root: int) -> list[int]:
    """PySpark worker processes (forked by a pyspark.daemon) under ``root``."""
    return sorted(
        pid for pid in _descendants(root)
        if "pyspark.daemon" in _cmdline(pid) and "pyspark.daemon" in _cmdline(_parent(pid))
    )


def executor_jvms(root: int) -> list[int]:
    return sorted(p for p in _descendants(root) if "CoarseGrainedExecutorBackend" in _cmdline(p))


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


# Running the train job ---------------------------------------------------------------------


def start_train(tmp_path: Path, data_dir: str, name: str, *extra: str) -> tuple:
    out = tmp_path / name
    out.mkdir()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
           "SPARK_WORKER_DIR": str(tmp_path / f"{name}-work")}
    args = [sys.executable, "jobs/train.py", "--conf", CONF,
            "--set", f"data.dir={data_dir}", "--set", f"output.dir={out}",
            "--set", f"training.epochs={EPOCHS}",
            "--set", f"training.checkpoint_dir={out / 'ckpt'}",
            "--set", "training.checkpoint_every=40", "--set", "training.checkpoint_unit=steps",
            *extra]
    log = open(out / "log.txt", "w")  # noqa: SIM115 (closed by finish())
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    return proc, out, log


def finish(proc, out: Path, log, timeout: float = 420) -> tuple[int, str]:
    try:
        code = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    return code, (out / "log.txt").read_text()


def first_checkpoint(out: Path) -> None:
    wait_for(lambda: list((out / "ckpt").glob("ckpt-*")), 240, "the first checkpoint")


def measure_accuracy(out: Path, test_uri: str) -> float:
    import keras

    from sparkdl.data.reader import read_all

    x, y = read_all(test_uri)
    model = keras.models.load_model(out / "model.keras")
    return float((model.predict(x, verbose=0).argmax(axis=1) == y).mean())


@pytest.fixture(scope="module")
def reference(tmp_path_factory, digits_shards):
    """An uninterrupted run with the same seed and settings (local[2], same code path)."""
    tmp = tmp_path_factory.mktemp("reference")
    data_dir = digits_shards["train"].rsplit("/", 1)[0]
    proc, out, log = start_train(tmp, data_dir, "ref")
    code, text = finish(proc, out, log)
    assert code == 0, text[-3000:]
    return {"data_dir": data_dir, "accuracy": measure_accuracy(out, digits_shards["test"])}


def _check_recovered(out: Path, code: int, text: str, reference, digits_shards, hurt_at: float):
    assert code == 0, text[-4000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["resumed_from"], "the retried stage did not resume from a checkpoint"
    assert "resumed from checkpoint" in text and metrics["resumed_from"] in text
    assert metrics["steps"] == EPOCHS * metrics["steps_per_epoch"]
    assert metrics["replicas_identical"] is True
    accuracy = measure_accuracy(out, digits_shards["test"])
    assert abs(accuracy - reference["accuracy"]) <= 0.01, (accuracy, reference["accuracy"])
    recovery = metrics["attempt_started_at"] - hurt_at
    print(f"recovered in {recovery:.1f} s; accuracy {accuracy:.4f} vs "
          f"{reference['accuracy']:.4f} uninterrupted; resumed from {metrics['resumed_from']}")
    return recovery


def newer_checkpoint(out: Path) -> set[str]:
    """Wait until the retried stage writes a checkpoint newer than every one there now (a
    checkpoint the hurt attempt was renaming into place lands first); those there before."""
    time.sleep(1)
    before = {p.name for p in (out / "ckpt").glob("ckpt-*")}
    newer = wait_for(lambda: {p.name for p in (out / "ckpt").glob("ckpt-*")} - before, 240,
                     "a checkpoint of the retried stage")
    # the retry continued from the latest checkpoint: a retry that started over would first
    # write one older than those (the store keeps the newest two)
    assert min(newer) > max(before, default=""), (sorted(newer), sorted(before))
    return before


def training_worker(root: int) -> int | None:
    """A PySpark worker under ``root`` that is training now (using CPU), not an idle one."""
    return next((pid for pid in reversed(python_workers(root)) if _is_training(pid)), None)


@pytest.mark.slow
@pytest.mark.timeout(900)  # with the reference run (setup): three recoveries on a slow machine
def test_a_killed_worker_a_killed_executor_and_a_hung_worker_resume_from_checkpoints(
        tmp_path, reference, digits_shards):
    """Three hurts in one job on two executor JVMs, each once the stage retried after the
    one before has written a checkpoint of its own: SIGKILL one worker's Python process after
    the first checkpoint; SIGKILL one executor JVM; SIGSTOP a training worker (a silent peer,
    which the others time out on after ``cluster.timeout_s``). Each retry resumes from the
    latest checkpoint, and the job ends with the accuracy of an uninterrupted run."""
    timeout_s = 8
    proc, out, log = start_train(
        tmp_path, reference["data_dir"], "hurt",
        "--set", "cluster.master=local-cluster[2,1,1024]",
        "--set", f"cluster.timeout_s={timeout_s}",
        # three planned failures in one stage: Spark's default of 4 attempts leaves no room
        # for a slow machine's extra one (test_retries_are_bounded checks the bound itself)
        "--set", "cluster.spark_conf.spark.stage.maxConsecutiveAttempts=8",
    )
    stopped = None
    try:
        first_checkpoint(out)
        os.kill(wait_for(lambda: python_workers(proc.pid), 30, "training workers")[-1],
                signal.SIGKILL)
        newer_checkpoint(out)
        jvm = wait_for(lambda: executor_jvms(proc.pid), 30, "executor JVMs")[-1]
        orphans = python_workers(jvm)
        os.kill(jvm, signal.SIGKILL)
        # the killed executor's Python workers end with it (bounded), then its retry's turn
        wait_for(lambda: not [p for p in orphans if Path(f"/proc/{p}").exists()], 60,
                 f"the killed executor's workers {orphans} to end")
        before = newer_checkpoint(out)
        stopped = wait_for(lambda: training_worker(proc.pid), 60, "a training worker")
        os.kill(stopped, signal.SIGSTOP)
        hurt_at = time.time()
    finally:
        code, text = finish(proc, out, log)
        if stopped:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(stopped, sig)
    recovery = _check_recovered(out, code, text, reference, digits_shards, hurt_at)
    # the last retry waited for the silent peer to time out, and said so
    assert recovery >= timeout_s * 0.9, "resumed before the silent peer could have timed out"
    assert f"within {timeout_s:.1f} s" in text, text[-4000:]
    metrics = json.loads((out / "metrics.json").read_text())
    resumed = metrics["resumed_from"]
    # from a checkpoint the retry after the killed executor wrote
    assert resumed.rsplit("/", 1)[-1] not in before, (resumed, before)
    # Spark's retries, in the metrics as a relaunch with the same workers at the checkpoint
    # the last attempt resumed from
    [event] = metrics["elastic_events"]
    assert (event["from_workers"], event["to_workers"]) == (2, 2), event
    step = event["epoch"] * metrics["steps_per_epoch"] + event["step"]
    assert resumed.endswith(f"ckpt-{step:010d}"), (event, resumed)


@pytest.mark.slow
def test_retries_are_bounded_and_every_failure_is_reported(tmp_path, reference):
    proc, out, log = start_train(
        tmp_path, reference["data_dir"], "nan",
        "--set", "cluster.master=local-cluster[2,1,1024]",
        "--set", "cluster.spark_conf.spark.stage.maxConsecutiveAttempts=3",
        "--set", "model.optimizer.name=sgd", "--set", "model.optimizer.learning_rate=1e12",
        "--set", "training.mode=dense",
    )
    code, text = finish(proc, out, log)
    assert code == 2, text[-3000:]
    error = next(line for line in text.splitlines() if "sparkdl train: error:" in line)
    assert "non-finite loss" in error and "at epoch 0, step" in error
    for attempt in range(3):
        assert f"attempt {attempt}," in error, error
    assert not (out / "model.keras").exists()


def test_non_finite_loss_stops_training_naming_epoch_and_step(spark, digits_shards, make_mlp,
                                                              tmp_path):
    import keras

    model = make_mlp([8, 8, 1], 10)
    model.compile(optimizer=keras.optimizers.SGD(1e12), loss="sparse_categorical_crossentropy")
    spark_model = SparkModel(spark, model, DenseTrainingMaster(num_workers=2))
    before = model.get_weights()
    with pytest.raises(TrainingError, match=r"non-finite loss .* at epoch 0, step \d+"):
        spark_model.fit(digits_shards["train"], epochs=2)
    # the model was not replaced by a broken one
    for a, b in zip(before, spark_model.model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_resume_continues_a_fit_exactly(spark, digits_shards, make_mlp, tmp_path):
    """2 epochs, stop, resume to 4 == 4 epochs uninterrupted, bit for bit: the checkpoint
    holds weights, position, threshold τ and every rank's residual and optimizer state."""
    tm = SharedTrainingMaster(num_workers=2)
    whole = SparkModel(spark, make_mlp([8, 8, 1], 10), tm).fit(digits_shards["train"], epochs=4)

    ckpt = (tmp_path / "ckpt").as_uri()
    SparkModel(spark, make_mlp([8, 8, 1], 10), tm).fit(
        digits_shards["train"], epochs=2, checkpoint_dir=ckpt
    )
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("ckpt-*"))  # written
    assert list((tmp_path / "ckpt").glob("ckpt-*/workers/rank-00001"))
    resumed = SparkModel(spark, make_mlp([8, 8, 1], 10), tm)
    fit = resumed.fit(digits_shards["train"], epochs=4, checkpoint_dir=ckpt, resume=True)
    per_epoch = fit.metrics["steps_per_epoch"]
    assert fit.metrics["resumed_from"].endswith(f"ckpt-{2 * per_epoch:010d}")
    assert fit.metrics["steps"] == 4 * per_epoch
    assert len(fit.history["loss"]) == 4
    assert fit.workers[0].checksum == whole.workers[0].checksum
    # the default shuffle reassigns row groups every epoch; the resumed epochs read the same
    assert fit.metrics["shuffle"] == "global"
    from sparkdl.data.files import read_metadata

    rows = read_metadata(digits_shards["train"]).num_rows
    dropped = rows - 2 * per_epoch * tm.batch_size_per_worker
    assert fit.metrics["rows_dropped_per_epoch"] == dropped
    assert fit.history["rows_dropped"] == [dropped] * 4
    # without resume, the same directory starts over
    fresh = SparkModel(spark, make_mlp([8, 8, 1], 10), tm)
    again = fresh.fit(digits_shards["train"], epochs=1, checkpoint_dir=ckpt)
    assert again.metrics["resumed_from"] is None


def test_resume_restores_every_ranks_own_threshold_state(spark, digits_shards, make_mlp,
                                                         tmp_path):
    """Issue 14.1: each rank adapts its own τ from its own message sizes, so ranks hold
    different τ at a checkpoint; a mid-epoch resume must give every rank back its own τ (with
    its residual and optimizer state) and end bit-identical to the uninterrupted run."""
    tm = SharedTrainingMaster(
        num_workers=2,
        threshold=AdaptiveThreshold(initial=4e-3, min_sparsity=2e-2, max_sparsity=4e-2),
    )
    whole = SparkModel(spark, make_mlp([8, 8, 1], 10), tm).fit(digits_shards["train"], epochs=3)
    taus = [w.loop.extras["tau"] for w in whole.workers]
    assert taus[0] != taus[1]  # the ranks' thresholds really differ

    ckpt = (tmp_path / "ckpt").as_uri()
    SparkModel(spark, make_mlp([8, 8, 1], 10), tm).fit(
        digits_shards["train"], epochs=2, checkpoint_dir=ckpt, checkpoint_every=5,
        checkpoint_unit="steps",
    )
    latest = sorted((tmp_path / "ckpt").glob("ckpt-*"))[-1]
    saved_taus = []
    for rank in range(2):
        with np.load(latest / "workers" / f"rank-{rank:05d}") as state:
            saved_taus.append(float(state["compressor.threshold.tau"]))
            assert state["compressor.memory.residual"].any()
    assert saved_taus[0] != saved_taus[1]  # each rank saved its own, different τ
    resumed = SparkModel(spark, make_mlp([8, 8, 1], 10), tm).fit(
        digits_shards["train"], epochs=3, checkpoint_dir=ckpt, checkpoint_every=5,
        checkpoint_unit="steps", resume=True,
    )
    per_epoch = resumed.metrics["steps_per_epoch"]
    assert 2 * per_epoch % 5  # the last checkpoint of the short fit is mid-epoch
    assert resumed.metrics["resumed_from"].endswith(f"ckpt-{2 * per_epoch // 5 * 5:010d}")
    assert resumed.metrics["steps"] == 3 * per_epoch
    for rank in range(2):
        assert resumed.workers[rank].checksum == whole.workers[rank].checksum, rank


def test_cancelled_fit_leaves_nothing_behind(spark, digits_shards, make_mlp, tmp_path):
    # the process's model directory lives until exit (model_files.temporary_model_dir): it
    # may stay, and nothing of this fit in it
    models = Path(temporary_model_dir().removeprefix("file://"))
    models_before = set(models.iterdir())
    tmp_before = set(Path(tempfile.gettempdir()).glob("sparkdl-*"))
    ckpt = tmp_path / "ckpt"
    spark_model = SparkModel(spark, make_mlp([8, 8, 1], 10), SharedTrainingMaster(num_workers=2))
    errors: list[BaseException] = []

    def fit() -> None:
        try:
            spark_model.fit(digits_shards["train"], epochs=200, checkpoint_dir=ckpt.as_uri(),
                            checkpoint_every=20, checkpoint_unit="steps")
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=fit)
    thread.start()
    wait_for(lambda: list(ckpt.glob("ckpt-*")), 120, "training to start")
    workers = python_workers(os.getpid())
    spark.sparkContext.cancelAllJobs()
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert errors and isinstance(errors[0], TrainingError)
    busy = [p for p in workers if p in python_workers(os.getpid()) and _listening(p)]
    assert not busy, f"workers still hold listening sockets: {busy}"
    wait_for(lambda: not [p for p in workers if _is_training(p)], 30, "training workers to stop")
    assert set(Path(tempfile.gettempdir()).glob("sparkdl-*")) <= tmp_before
    assert set(models.iterdir()) <= models_before  # the model to train was deleted
    assert not list(ckpt.glob(".ckpt-*"))  # no half-written checkpoint


def _listening(pid: int) -> bool:
    """Whether ``pid`` holds a TCP socket in LISTEN state."""
    try:
        inodes = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    except OSError:
        return False
    sockets = {i[8:-1] for i in inodes if i.startswith("socket:[")}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in sockets:
                return True
    return False


def _is_training(pid: int) -> bool:
    """A worker still running a training task uses CPU; an idle reused worker does not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    first = int(stat[11]) + int(stat[12])
    time.sleep(0.5)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return int(stat[11]) + int(stat[12]) - first > 10


@pytest.mark.slow
def test_train_job_resume_flag_continues_a_killed_job(tmp_path, reference):
    """A job killed as a whole (SIGKILL of the driver) continues with ``--resume``."""
    proc, out, log = start_train(tmp_path, reference["data_dir"], "whole")
    first_checkpoint(out)
    os.kill(proc.pid, signal.SIGKILL)
    finish(proc, out, log)
    assert not (out / "model.keras").exists()
    proc, out2, log = start_train(tmp_path, reference["data_dir"], "whole-resumed",
                                  "--set", f"training.checkpoint_dir={out / 'ckpt'}", "--resume")
    code, text = finish(proc, out2, log)
    assert code == 0, text[-3000:]
    metrics = json.loads((out2 / "metrics.json").read_text())
    assert metrics["resumed_from"] and metrics["resumed_from"].startswith((out / "ckpt").as_uri())
    assert metrics["steps"] == EPOCHS * metrics["steps_per_epoch"]


@pytest.mark.slow
def test_interrupted_driver_leaves_no_workers_sockets_or_temp_dirs(tmp_path, reference):
    """Ctrl-C on the driver (SIGINT): pyspark cancels the jobs, the job exits, and nothing of
    the training survives it."""
    tmp_before = set(Path(tempfile.gettempdir()).glob("sparkdl-*"))
    proc, out, log = start_train(tmp_path, reference["data_dir"], "sigint")
    first_checkpoint(out)
    workers = wait_for(lambda: python_workers(proc.pid), 30, "training workers")
    os.kill(proc.pid, signal.SIGINT)
    code, _ = finish(proc, out, log, timeout=120)
    assert code != 0
    # the workers go as their JVM does: wait for that (bounded) rather than a fixed pause
    wait_for(lambda: not [p for p in workers if Path(f"/proc/{p}").exists()], 60,
             f"training workers {workers} to end with the driver")
    assert not (out / "model.keras").exists()
    assert set(Path(tempfile.gettempdir()).glob("sparkdl-*")) <= tmp_before
    assert not list((out / "ckpt").glob(".ckpt-*"))
