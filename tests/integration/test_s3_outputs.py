"""A whole job with output.dir, training.checkpoint_dir and --conf on a real S3-compatible
server (moto's, over HTTP), run as a user runs it: jobs/*.py in fresh processes. The shards
stay local (Spark reads them through Hadoop, which has no s3a client here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from sparkdl import storage

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(2400)]

JOB = """\
cluster:
  master: local[2]
  spark_conf:
    spark.driver.memory: 1g
    spark.ui.enabled: "false"
data:
  pipeline: digits
  dir: {data}
  options: {{test_fraction: 0.2, seed: 42, num_files: 4}}
model:
  name: mlp
  params: {{hidden: [32]}}
training:
  num_workers: 2
  epochs: 1
  checkpoint_dir: {bucket}/ckpt
output:
  dir: {bucket}/run
  export: savedmodel
"""


def _job(stage: str, conf: str, *args: str, env: dict[str, str]) -> dict:
    proc = subprocess.run(
        [sys.executable, f"jobs/{stage}.py", "--conf", conf, *args], cwd=REPO,
        env={**env, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable},
        capture_output=True, text=True, timeout=900, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _files(uri: str) -> list[str]:
    fs, root = storage.resolve(uri)
    return sorted(i.path[len(root) + 1:] for i in
                  fs.get_file_info(pafs.FileSelector(root, recursive=True))
                  if i.type == pafs.FileType.File)


def _json(uri: str) -> dict:
    return json.loads(storage.read_bytes(uri))


def test_pipeline_on_s3_completes_and_resumes(s3_server: str, s3_bucket: str,
                                              tmp_path: Path) -> None:
    fs, root = storage.resolve(s3_bucket)
    conf = f"{s3_bucket}/job.yaml"
    text = JOB.format(data=tmp_path / "data", bucket=s3_bucket)
    storage.write_bytes(fs, f"{root}/job.yaml", text.encode())

    # 1. the whole pipeline, its --conf read from S3 (endpoint from AWS_ENDPOINT_URL)
    result = _job("pipeline", conf, env=dict(os.environ))
    run = f"{s3_bucket}/run"
    assert result["model"] == f"{run}/model.keras" and result["savedmodel"] == f"{run}/savedmodel"
    names = _files(run)
    for name in ("model.keras", "metrics.json", "evaluation.json", "history.csv", "report.html",
                 "savedmodel/saved_model.pb"):
        assert name in names, names
    first = _json(f"{run}/metrics.json")
    assert len(first["history"]["loss"]) == 1 and first["test_accuracy"] > 0.2  # chance: 0.1
    checkpoints = [n for n in _files(f"{s3_bucket}/ckpt") if n.endswith("/state.json")]
    assert len(checkpoints) == 1, checkpoints
    assert not [n for n in _files(f"{s3_bucket}/ckpt") if ".tmp-" in n]

    # 2. resume to 2 epochs from the checkpoint on S3; the endpoint from the config key this
    # time (executors get it from the driver), the configuration from a local file
    local_conf = tmp_path / "job.yaml"
    local_conf.write_text(text)
    env = {k: v for k, v in os.environ.items() if k != storage.S3_ENDPOINT_ENV}
    endpoint = f"cluster.s3.endpoint_override={s3_server}"
    _job("train", str(local_conf), "--set", endpoint, "--set", "training.epochs=2",
         "--resume", env=env)
    resumed = _json(f"{run}/metrics.json")
    assert len(resumed["history"]["loss"]) == 2
    assert resumed["history"]["loss"][0] == pytest.approx(first["history"]["loss"][0])
    assert resumed["history"]["loss"][1] < resumed["history"]["loss"][0]
    checkpoints = [n for n in _files(f"{s3_bucket}/ckpt") if n.endswith("/state.json")]
    assert len(checkpoints) == 2, checkpoints  # the first one and the resumed run's

    # 3. predictions written to S3, marker last, readable there
    predicted = _job("predict", str(local_conf), "--set", endpoint, env=env)
    assert predicted["predictions"] == f"{run}/predictions"
    names = _files(f"{run}/predictions")
    assert "_sparkdl_predictions.json" in names
    pfs, proot = storage.resolve(f"{run}/predictions")
    table = pq.read_table(proot, filesystem=pfs)  # the marker (_*) is not data
    assert table.num_rows == first["test_examples"]
