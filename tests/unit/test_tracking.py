"""log_run against a real MLflow file store, read back with MlflowClient."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from _run_dir import EPOCHS, write_run_dir

from sparkdl.config import JobConfig, load_config
from sparkdl.errors import ConfigurationError, DataError
from sparkdl.tracking import flatten, log_run

REPO = Path(__file__).resolve().parents[2]


def test_flatten_uses_dotted_keys():
    flat = flatten({"training": {"mode": "sharing", "epochs": 3, "checkpoint_dir": None,
                                 "threshold": {"initial": 1e-3}},
                    "cluster": {"spark_conf": {"spark.executor.memory": "2g"}, "tags": [1, 2]},
                    "data": {"options": {}}})
    assert flat == {"training.mode": "sharing", "training.epochs": "3",
                    "training.checkpoint_dir": "null", "training.threshold.initial": "0.001",
                    "cluster.spark_conf.spark.executor.memory": "2g", "cluster.tags": "[1, 2]",
                    "data.options": "{}"}


def test_log_run_to_a_file_store(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    run_dir = tmp_path / "run"
    metrics = write_run_dir(run_dir, validation_freq=2)
    (run_dir / "report.html").write_text("<html></html>")
    model = run_dir / "model.keras"
    model.write_bytes(b"PK\x03\x04 not really a zip, but a file")
    config = load_config(None, ["training.mode=sharing", "training.epochs=6",
                                "cluster.spark_conf.spark.executor.memory=2g"])
    uri = (tmp_path / "mlruns").as_uri()

    run_id = log_run(uri, "digits", config, metrics["history"], run_dir, model)

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "digits"
    params = run.data.params
    assert params["training.mode"] == "sharing" and params["training.epochs"] == "6"
    assert params["cluster.spark_conf.spark.executor.memory"] == "2g"
    assert params["tracking.experiment"] == "sparkdl"
    assert len(params) == len(flatten(config.to_dict())) > 30
    loss = client.get_metric_history(run_id, "loss")
    assert [(m.step, m.value) for m in sorted(loss, key=lambda m: m.step)] == list(
        enumerate(metrics["history"]["loss"]))
    val = sorted(client.get_metric_history(run_id, "val_accuracy"), key=lambda m: m.step)
    assert [m.step for m in val] == [1, 3, 5]  # validation every 2nd epoch
    assert [m.value for m in val] == metrics["history"]["val_accuracy"]
    assert len(client.get_metric_history(run_id, "tau")) == EPOCHS
    assert run.data.metrics["test_accuracy"] == pytest.approx(metrics["test_accuracy"])
    assert "samples_per_second" in run.data.metrics  # the history series, not the job figure
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert artifacts == {"metrics.json", "evaluation.json", "report.html", "model"}
    assert [a.path for a in client.list_artifacts(run_id, "model")] == ["model/model.keras"]
    logged = Path(client.download_artifacts(run_id, "metrics.json", str(tmp_path / "dl")))
    assert json.loads(logged.read_text())["history"]["loss"] == metrics["history"]["loss"]

    # A second run goes into the same experiment.
    again = log_run(uri, "digits", {"a": {"b": 1}}, {"loss": [1.0, math.nan]}, run_dir, None)
    assert client.get_run(again).info.experiment_id == run.info.experiment_id
    assert [m.step for m in client.get_metric_history(again, "loss")] == [0]


def test_log_run_refuses_missing_inputs_before_creating_a_run(tmp_path):
    pytest.importorskip("mlflow")
    uri = (tmp_path / "mlruns").as_uri()
    with pytest.raises(DataError, match=r"run directory .*nope does not exist"):
        log_run(uri, "x", JobConfig(), {}, tmp_path / "nope", None)
    with pytest.raises(DataError, match=r"model file .*model\.keras does not exist"):
        log_run(uri, "x", JobConfig(), {}, tmp_path, tmp_path / "model.keras")
    assert not (tmp_path / "mlruns").exists()


def test_importing_sparkdl_does_not_import_mlflow_and_says_how_to_install_it(tmp_path):
    code = (
        "import sys, builtins\n"
        "import sparkdl, sparkdl.tracking, sparkdl.config, sparkdl.report\n"
        "assert 'mlflow' not in sys.modules, 'mlflow imported'\n"
        "real = builtins.__import__\n"
        "def no_mlflow(name, *a, **k):\n"
        "    if name.split('.')[0] == 'mlflow':\n"
        "        raise ImportError('No module named mlflow')\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = no_mlflow\n"
        "from sparkdl.tracking import log_run\n"
        f"log_run('file:///unused', 'x', {{}}, {{}}, {str(tmp_path)!r}, None)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env={"PYTHONPATH": str(REPO)})
    assert done.returncode == 1
    assert "ConfigurationError" in done.stderr
    assert "pip install 'sparkdl[mlflow]'" in done.stderr


def test_config_has_a_tracking_section():
    config = load_config(None, ["tracking.mlflow=file:///tmp/mlruns"])
    assert config.tracking.mlflow == "file:///tmp/mlruns"
    assert config.tracking.experiment == "sparkdl"
    assert JobConfig().tracking.mlflow is None
    with pytest.raises(ConfigurationError, match=r"tracking\.server"):
        load_config(None, ["tracking.server=x"])
