"""The regression pipeline of issue 12.3: ``conf/diabetes.yaml`` on the CSV ``sparkdl samples``
writes, through the ETL, train and evaluate stages; the regression figures in
``evaluation.json`` and ``metrics.json`` equal scikit-learn's on the same predictions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

from sparkdl.config import load_config
from sparkdl.data.reader import read_all
from sparkdl.etl.samples import write_regression_sample
from sparkdl.stages import run_etl, run_evaluate, run_train

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # three stages with a fit and a report: about a minute on an idle machine
def test_diabetes_conf_trains_and_evaluates_like_scikit_learn(spark, tmp_path):
    import keras

    csv = write_regression_sample(str(tmp_path / "diabetes.csv"))
    config = load_config(REPO / "conf" / "diabetes.yaml", [
        f"data.options.path={csv}", f"data.dir={tmp_path / 'data'}",
        f"output.dir={tmp_path / 'run'}", "training.epochs=3",
    ])
    shards = run_etl(config, spark)
    run_train(config, spark)
    metrics = run_evaluate(config, spark)

    document = json.loads((tmp_path / "run" / "evaluation.json").read_text())
    (regression,) = document["evaluations"]
    assert regression["kind"] == "regression"
    x, y = read_all(shards["test"])
    model = keras.models.load_model(tmp_path / "run" / "model.keras")
    pred = model.predict(x, verbose=0)
    figures = regression["figures"]
    assert regression["count"] == len(y) == metrics["test_examples"]
    assert figures["mse"][0] == pytest.approx(mean_squared_error(y, pred), rel=1e-5)
    assert figures["rmse"][0] == pytest.approx(np.sqrt(mean_squared_error(y, pred)), rel=1e-5)
    assert figures["mae"][0] == pytest.approx(mean_absolute_error(y, pred), rel=1e-5)
    assert figures["r2"][0] == pytest.approx(r2_score(y, pred), abs=1e-5)
    assert metrics["test_r2"] == pytest.approx(r2_score(y, pred), abs=1e-5)
    assert "test_accuracy" not in metrics
    assert "Evaluations (test data)" in (tmp_path / "run" / "report.html").read_text()
