"""Every evaluation kind against scikit-learn, split into parts and merged, and through JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import (
    accuracy_score,
    average_precision_score,
    f1_score,
    mean_absolute_error,
    mean_squared_error,
    precision_score,
    r2_score,
    recall_score,
    roc_auc_score,
    top_k_accuracy_score,
)
from sklearn.preprocessing import label_binarize

from sparkdl.errors import ConfigurationError, DataError
from sparkdl.evaluation import (
    ROC,
    DataInfo,
    EvaluationBinary,
    RegressionEvaluation,
    ROCMultiClass,
    TopNAccuracy,
    create_evaluation,
    evaluation_from_dict,
)


def _in_parts(make, y, p, parts=5):
    """Evaluate in ``parts`` chunks, each through JSON, merged into a fresh evaluation."""
    total = make()
    for chunk in np.array_split(np.arange(len(y)), parts):
        part = make().eval(y[chunk], p[chunk])
        total.merge(evaluation_from_dict(json.loads(json.dumps(part.to_dict()))))
    return total


def test_regression_matches_scikit_learn_per_column():
    rng = np.random.default_rng(1)
    y = rng.normal(100.0, 3.0, (300, 3))  # a large mean: R² must not lose digits
    p = y + rng.normal(0, 1.5, (300, 3))
    for evaluation in (RegressionEvaluation(3).eval(y, p),
                       _in_parts(lambda: RegressionEvaluation(3), y, p, parts=7)):
        np.testing.assert_allclose(evaluation.mse(),
                                   mean_squared_error(y, p, multioutput="raw_values"))
        np.testing.assert_allclose(evaluation.rmse(),
                                   np.sqrt(mean_squared_error(y, p, multioutput="raw_values")))
        np.testing.assert_allclose(evaluation.mae(),
                                   mean_absolute_error(y, p, multioutput="raw_values"))
        np.testing.assert_allclose(evaluation.r2(), r2_score(y, p, multioutput="raw_values"),
                                   rtol=1e-9)
    assert "R2" in evaluation.stats()


def test_regression_constant_targets_as_scikit_learn():
    y = np.ones((4, 2))
    p = np.stack([np.ones(4), np.arange(4.0)], axis=1)
    np.testing.assert_allclose(RegressionEvaluation(2).eval(y, p).r2(),
                               r2_score(y, p, multioutput="raw_values"))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 6)), min_size=2, max_size=60),
       st.integers(1, 6))
def test_binary_roc_exact_with_ties_in_any_split(rows, parts):
    y = np.array([r[0] for r in rows])
    s = np.array([r[1] for r in rows]) / 6.0  # few distinct scores: many ties
    evaluation = _in_parts(ROC, y, s, parts=min(parts, len(y)))
    if len(set(y)) < 2:
        assert np.isnan(evaluation.auroc())
        return
    assert evaluation.auroc() == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    assert evaluation.auprc() == pytest.approx(average_precision_score(y, s), abs=1e-12)


def test_binary_roc_takes_softmax_pairs_and_bins_on_request():
    rng = np.random.default_rng(2)
    y = rng.integers(0, 2, 1000)
    s = np.clip(rng.random(1000) * 0.7 + 0.3 * y, 0, 1)
    pairs = np.stack([1 - s, s], axis=1)
    exact = ROC().eval(y, pairs)
    assert exact.auroc() == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    binned = ROC(steps=20).eval(y, pairs)
    assert len(binned.counts.scores) <= 21  # memory bounded by the bins
    assert binned.auroc() == pytest.approx(roc_auc_score(y, s), abs=0.02)


def test_multiclass_roc_one_vs_all_matches_scikit_learn():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 4, 400)
    scores = rng.random((400, 4))
    scores[np.arange(400), y] += 0.4 * rng.random(400)
    scores /= scores.sum(axis=1, keepdims=True)
    evaluation = _in_parts(lambda: ROCMultiClass(4), y, scores)
    onehot = label_binarize(y, classes=range(4))
    np.testing.assert_allclose(evaluation.auroc(), roc_auc_score(onehot, scores, average=None))
    np.testing.assert_allclose(evaluation.auprc(),
                               average_precision_score(onehot, scores, average=None))
    assert evaluation.summary()["macro_auroc"] == pytest.approx(
        roc_auc_score(y, scores, multi_class="ovr", average="macro"))


@pytest.mark.parametrize("n", [1, 2, 3])
def test_top_n_matches_scikit_learn(n):
    rng = np.random.default_rng(4)
    y = rng.integers(0, 5, 300)
    scores = rng.random((300, 5))
    evaluation = _in_parts(lambda: TopNAccuracy(5, n), y, scores)
    assert evaluation.accuracy() == pytest.approx(
        top_k_accuracy_score(y, scores, k=n, labels=range(5)))


def test_evaluation_binary_matches_scikit_learn_per_column():
    rng = np.random.default_rng(5)
    y = rng.integers(0, 2, (250, 3)).astype(float)
    scores = np.clip(0.6 * y + 0.5 * rng.random((250, 3)), 0, 1)
    evaluation = _in_parts(lambda: EvaluationBinary(3), y, scores)
    pred = scores >= 0.5
    for k in range(3):
        assert evaluation.accuracy()[k] == pytest.approx(accuracy_score(y[:, k], pred[:, k]))
        assert evaluation.precision()[k] == pytest.approx(precision_score(y[:, k], pred[:, k]))
        assert evaluation.recall()[k] == pytest.approx(recall_score(y[:, k], pred[:, k]))
        assert evaluation.f1()[k] == pytest.approx(f1_score(y[:, k], pred[:, k]))


def test_registry_builds_from_specs_and_names_mistakes():
    classes = DataInfo(classes=["a", "b", "c"])
    assert create_evaluation("top_n:2", classes).n == 2
    assert isinstance(create_evaluation("roc", classes), ROCMultiClass)
    assert isinstance(create_evaluation("roc", DataInfo(classes=["no", "yes"])), ROC)
    assert create_evaluation("roc:50", classes).steps == 50
    assert create_evaluation("regression", DataInfo(label_size=2)).num_columns == 2
    with pytest.raises(ConfigurationError, match="unknown evaluation 'auc'"):
        create_evaluation("auc", classes)
    with pytest.raises(ConfigurationError, match="top_n's N must be an integer"):
        create_evaluation("top_n:x", classes)
    with pytest.raises(ConfigurationError, match="regression needs regression targets"):
        create_evaluation("regression", classes)
    with pytest.raises(DataError, match="unknown evaluation kind 'nope'"):
        evaluation_from_dict({"kind": "nope"})


def test_merging_different_configurations_is_refused():
    with pytest.raises(ValueError, match="cannot merge"):
        TopNAccuracy(5, 2).merge(TopNAccuracy(5, 3))
    with pytest.raises(ValueError, match="cannot merge"):
        RegressionEvaluation(1).merge(ROC())


def test_bad_batches_name_the_problem():
    with pytest.raises(DataError, match="expected 2 values per row, got 3"):
        RegressionEvaluation(2).eval(np.zeros((4, 3)), np.zeros((4, 3)))
    with pytest.raises(DataError, match="labels must be 0 or 1, got 2"):
        ROC().eval([0, 2], [0.1, 0.2])
    with pytest.raises(DataError, match="NaN"):
        ROC().eval([0, 1], [0.1, np.nan])


HOSTILE = [  # a few hundred bytes each, asking for tens of GiB
    ({"kind": "classification", "num_classes": 100_000}, "num_classes"),
    ({"kind": "classification", "num_classes": 100_000, "confusion": [[1]]}, "num_classes"),
    ({"kind": "regression", "num_columns": 10**10}, "num_columns"),
    ({"kind": "regression", "num_columns": 10**10, "mean": [0.0]}, "num_columns"),
    ({"kind": "binary", "num_columns": 10**10, "counts": [[0, 0, 0, 0]]}, "num_columns"),
    ({"kind": "roc_multiclass", "num_classes": 10**8}, "num_classes"),
]


@pytest.mark.parametrize(("data", "key"), HOSTILE, ids=[d["kind"] + "-" + k for d, k in HOSTILE])
def test_a_small_hostile_evaluation_json_is_refused_before_allocating(data, key):
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(DataError, match=rf"evaluation\.json: .*'{key}'"):
            evaluation_from_dict(data, source="run/evaluation.json")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak


def test_the_report_refuses_a_hostile_evaluation_json_naming_it(tmp_path):
    from sparkdl.report import build_report

    (tmp_path / "metrics.json").write_text(json.dumps({"history": {"loss": [1.0]}}))
    (tmp_path / "evaluation.json").write_text(json.dumps(HOSTILE[0][0]))
    with pytest.raises(DataError, match=r"evaluation\.json.*'num_classes'"):
        build_report(tmp_path)


def test_a_serialized_evaluation_of_many_classes_still_loads():
    from sparkdl.evaluation import Evaluation

    big = Evaluation(300).eval(np.arange(300), np.arange(300))
    again = evaluation_from_dict(json.loads(json.dumps(big.to_dict())))
    assert again.accuracy() == 1.0 and again.num_classes == 300
