"""What the evaluate stage writes from several evaluations: evaluation.json, the metrics'
headline figures, the report's table, and the ``evaluation`` configuration section."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _run_dir import write_run_dir

from sparkdl.config import load_config
from sparkdl.errors import ConfigurationError
from sparkdl.evaluation import Evaluation, RegressionEvaluation, ROCMultiClass, TopNAccuracy
from sparkdl.report import build_report, read_run
from sparkdl.stages import evaluation_document, headline_figures


def _classification():
    rng = np.random.default_rng(0)
    y, scores = rng.integers(0, 3, 60), rng.random((60, 3))
    return [e.eval(y, scores) for e in (Evaluation(3), TopNAccuracy(3, 2), ROCMultiClass(3))]


def test_single_output_document_keeps_the_classification_fields(tmp_path):
    evaluations = _classification()
    document = evaluation_document({None: evaluations})
    assert document["confusion"] == evaluations[0].confusion.tolist()  # as before
    assert [e["kind"] for e in document["evaluations"]] == [
        "classification", "top_n", "roc_multiclass"]
    figures = headline_figures({None: evaluations})
    assert figures["test_accuracy"] == evaluations[0].accuracy()
    assert figures["test_top_2_accuracy"] == evaluations[1].accuracy()
    assert figures["test_macro_auroc"] == evaluations[2].summary()["macro_auroc"]
    assert figures["test_examples"] == 60

    write_run_dir(tmp_path)
    (tmp_path / "evaluation.json").write_text(json.dumps(document))
    _, evaluation = read_run(tmp_path)
    assert evaluation is not None and evaluation.count == 60
    page = build_report(tmp_path)
    assert "Evaluations (test data)" in page and "macro_auroc" in page


def test_regression_and_multi_output_documents_in_the_report(tmp_path):
    regression = RegressionEvaluation(1).eval([1.0, 2.0, 4.0], [1.5, 2.0, 3.0])
    figures = headline_figures({None: [regression]})
    assert figures["test_mse"] == pytest.approx(regression.mse()[0])
    assert figures["test_examples"] == 3 and "test_accuracy" not in figures
    write_run_dir(tmp_path)
    (tmp_path / "evaluation.json").write_text(
        json.dumps(evaluation_document({None: [regression]})))
    assert read_run(tmp_path)[1] is None  # no confusion matrix to draw
    assert "<td>r2</td>" in build_report(tmp_path)

    per_output = {"digit": _classification()[:1], "ink": [regression]}
    assert set(headline_figures(per_output)) >= {"test_digit_accuracy", "test_ink_r2"}
    (tmp_path / "evaluation.json").write_text(json.dumps(evaluation_document(per_output)))
    page = build_report(tmp_path)
    assert "<td>ink</td>" in page and "<td>digit</td>" in page


def test_evaluation_section_of_the_configuration():
    config = load_config(data={"evaluation": {"metrics": ["classification", "roc:100",
                                                          "top_n:5"]}})
    assert config.evaluation.metrics == ["classification", "roc:100", "top_n:5"]
    assert load_config(data={}).evaluation.metrics == []
    with pytest.raises(ConfigurationError, match=r"evaluation\.metrics.*unknown evaluation 'f2'"):
        load_config(data={"evaluation": {"metrics": ["f2"]}})
    with pytest.raises(ConfigurationError, match="names an evaluation twice"):
        load_config(data={"evaluation": {"metrics": ["roc", "roc"]}})
    with pytest.raises(ConfigurationError, match=r"unknown key 'evaluation\.metric'"):
        load_config(data={"evaluation": {"metric": ["roc"]}})


def test_evaluation_plan_per_output_and_its_errors():
    from sparkdl.data.metadata import ShardFile, ShardMetadata, packed_metadata_fields
    from sparkdl.errors import DataError
    from sparkdl.evaluation.plan import by_output, evaluation_plan
    from sparkdl.pipelines.digits_split import INPUTS, OUTPUTS

    meta = ShardMetadata(format_version=2, num_rows=1, files=[ShardFile("p", 1, [1])],
                         **packed_metadata_fields(INPUTS, OUTPUTS))
    plan = evaluation_plan(meta, {"digit": ["classification", "top_n:3"]})
    assert [e.kind for e in plan["digit"]] == ["classification", "top_n"]
    assert [e.kind for e in plan["ink"]] == ["regression"] and plan["ink"][0].columns == ["ink"]
    with pytest.raises(ConfigurationError, match="no output named 'dgt'"):
        evaluation_plan(meta, {"dgt": ["roc"]})
    with pytest.raises(ConfigurationError, match=r"roc needs class labels.*output 'ink'"):
        evaluation_plan(meta, ["roc"])

    class TwoHeads:
        output_names = ["digit", "ink"]

    y = {"digit": np.array([1]), "ink": np.array([[0.5]])}
    matched = by_output(TwoHeads(), [np.eye(10)[[1]], np.array([[0.4]])], y)
    assert matched["ink"][1].tolist() == [[0.4]] and matched["digit"][0].tolist() == [1]
    with pytest.raises(DataError, match="output 'ink' is not an output of the model"):
        by_output(TwoHeads(), {"digit": np.eye(10)[[1]]}, y)
