"""Evaluation metrics and merging."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import (
    accuracy_score,
    confusion_matrix,
    f1_score,
    precision_score,
    recall_score,
)

from sparkdl.errors import DataError
from sparkdl.evaluation import Evaluation


def test_matches_scikit_learn_and_merges():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 500)
    scores = rng.random((500, 4))
    scores[np.arange(500), y] += rng.random(500)  # better than chance
    pred = scores.argmax(axis=1)
    whole = Evaluation(4).eval(y, scores)
    parts = Evaluation(4)
    for chunk in np.array_split(np.arange(500), 7):
        parts.merge(Evaluation(4).eval(y[chunk], scores[chunk]))
    for evaluation in (whole, parts):
        assert evaluation.accuracy() == pytest.approx(accuracy_score(y, pred))
        np.testing.assert_array_equal(evaluation.confusion, confusion_matrix(y, pred))
        np.testing.assert_allclose(evaluation.precision(), precision_score(y, pred, average=None))
        np.testing.assert_allclose(evaluation.recall(), recall_score(y, pred, average=None))
        np.testing.assert_allclose(evaluation.f1(), f1_score(y, pred, average=None))
    restored = Evaluation.from_dict(whole.to_dict())
    np.testing.assert_array_equal(restored.confusion, whole.confusion)


def test_stats_text_names_classes():
    evaluation = Evaluation(3, ["cat", "dog", "eel"]).eval([0, 1, 2, 2], [0, 1, 1, 2])
    text = evaluation.stats()
    assert "Accuracy:        0.7500" in text
    assert "dog" in text and "Confusion matrix" in text


def test_label_outside_classes_is_an_error():
    with pytest.raises(DataError, match="label 5 is outside the 3 classes"):
        Evaluation(3).eval([5], [0])


def test_merge_of_different_class_counts_is_refused():
    with pytest.raises(ValueError, match="3 and 4 classes"):
        Evaluation(3).merge(Evaluation(4))
