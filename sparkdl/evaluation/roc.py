"""ROC evaluations (DL4J's ROC and ROCMultiClass): AUROC and AUPRC, exact by default.

Exact mode keeps, for every distinct score seen, how many positive and negative rows had it
(sorted unique scores with two count arrays). Merging adds counts score by score, so the
merged areas equal those computed over all rows at once, and equal scikit-learn's
``roc_auc_score`` and ``average_precision_score``. Memory grows with the number of distinct
scores: at most 24 bytes per row (float64 score + two int64 counts), less when scores repeat.

Binned mode (``steps=N``, configured as ``roc:N``) rounds each score down to a multiple of
1/N in [0, 1] first (DL4J's ``thresholdSteps``): memory is then at most N + 1 entries per
class whatever the data size, at the price of a binning error in the areas.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from sparkdl.errors import DataError
from sparkdl.evaluation.base import (
    BaseEvaluation,
    DataInfo,
    alias,
    as_2d,
    positive_int,
    register,
)

_COMPACT_AT = 1 << 16  # pending rows before they are folded into the sorted counts


def _steps(argument: str | None) -> int | None:
    return None if argument is None else positive_int(argument, 0, "roc's number of bins")


def _roc(argument: str | None, info: DataInfo) -> BaseEvaluation:
    if not info.classes:
        raise ValueError("roc needs class labels; these shards hold regression targets")
    if len(info.classes) == 2:
        return ROC(_steps(argument))
    return ROCMultiClass(len(info.classes), _steps(argument), info.classes)


def _roc_multiclass(argument: str | None, info: DataInfo) -> ROCMultiClass:
    if not info.classes:
        raise ValueError("roc_multiclass needs class labels; these shards hold regression targets")
    return ROCMultiClass(len(info.classes), _steps(argument), info.classes)


class ScoreCounts:
    """Positive and negative counts per distinct score: the exact, mergeable state of a ROC
    curve. ``steps`` (optional) bins the scores to multiples of 1/steps in [0, 1]."""

    def __init__(self, steps: int | None = None) -> None:
        self.steps = steps
        self.scores = np.zeros(0)
        self.positives = np.zeros(0, dtype=np.int64)
        self.negatives = np.zeros(0, dtype=np.int64)
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_rows = 0

    def add(self, scores: np.ndarray, positive: np.ndarray) -> None:
        scores = np.asarray(scores, dtype=np.float64).ravel()
        if not np.isfinite(scores).all():
            raise DataError("ROC: NaN or infinite scores")
        if self.steps:
            scores = np.floor(np.clip(scores, 0.0, 1.0) * self.steps) / self.steps
        self._pending.append((scores, np.asarray(positive, dtype=bool).ravel()))
        self._pending_rows += len(scores)
        if self._pending_rows >= _COMPACT_AT:
            self._compact()

    def _compact(self) -> None:
        if not self._pending:
            return
        scores = np.concatenate([self.scores, *(s for s, _ in self._pending)])
        pos = np.concatenate([self.positives, *(p.astype(np.int64) for _, p in self._pending)])
        neg = np.concatenate([self.negatives, *((~p).astype(np.int64) for _, p in self._pending)])
        self._fold(scores, pos, neg)
        self._pending, self._pending_rows = [], 0

    def _fold(self, scores: np.ndarray, pos: np.ndarray, neg: np.ndarray) -> None:
        self.scores, index = np.unique(scores, return_inverse=True)
        self.positives = np.bincount(index, weights=pos, minlength=len(self.scores)).astype(
            np.int64)
        self.negatives = np.bincount(index, weights=neg, minlength=len(self.scores)).astype(
            np.int64)

    def merge(self, other: ScoreCounts) -> None:
        self._compact()
        other._compact()
        self._fold(np.concatenate([self.scores, other.scores]),
                   np.concatenate([self.positives, other.positives]),
                   np.concatenate([self.negatives, other.negatives]))

    def curve(self) -> tuple[np.ndarray, np.ndarray]:
        """Cumulative true and false positives at each distinct threshold, highest first."""
        self._compact()
        return np.cumsum(self.positives[::-1]), np.cumsum(self.negatives[::-1])

    def auroc(self) -> float:
        tps, fps = self.curve()
        if not len(tps) or tps[-1] == 0 or fps[-1] == 0:
            return float("nan")  # undefined with one class only, as in scikit-learn
        tpr = np.concatenate([[0.0], tps / tps[-1]])
        fpr = np.concatenate([[0.0], fps / fps[-1]])
        return float(np.trapezoid(tpr, fpr))

    def auprc(self) -> float:
        """Average precision: Σ (Rₖ − Rₖ₋₁) Pₖ over thresholds (scikit-learn's definition)."""
        tps, fps = self.curve()
        if not len(tps) or tps[-1] == 0:
            return float("nan")
        precision = tps / (tps + fps)
        recall = tps / tps[-1]
        return float(np.sum(np.diff(np.concatenate([[0.0], recall])) * precision))

    @property
    def count(self) -> int:
        self._compact()
        return int(self.positives.sum() + self.negatives.sum())

    def to_dict(self) -> dict[str, Any]:
        self._compact()
        return {"scores": self.scores.tolist(), "positives": self.positives.tolist(),
                "negatives": self.negatives.tolist()}

    def load(self, data: dict[str, Any]) -> None:
        scores = np.asarray(data.get("scores", []), dtype=np.float64)
        pos = np.asarray(data.get("positives", []), dtype=np.int64)
        neg = np.asarray(data.get("negatives", []), dtype=np.int64)
        if not (scores.shape == pos.shape == neg.shape) or scores.ndim != 1:
            raise ValueError("'scores', 'positives' and 'negatives' must be lists of one length")
        self._fold(scores, pos, neg)


def _binary_scores(y_pred: Any) -> np.ndarray:
    """The positive-class score: one column as is, the second of two softmax columns."""
    scores = as_2d(y_pred)
    if scores.shape[1] == 2:
        return scores[:, 1]
    if scores.shape[1] != 1:
        raise DataError(f"ROC: expected 1 or 2 scores per row, got {scores.shape[1]}")
    return scores[:, 0]


def _labels(y_true: Any) -> np.ndarray:
    array = np.asarray(y_true)
    if array.ndim == 2 and array.shape[1] > 1:
        return array.argmax(axis=1)
    return array.ravel()


@register("roc_binary", lambda argument, info: ROC(_steps(argument)))
class ROC(BaseEvaluation):
    """Binary ROC: AUROC and AUPRC of the positive class (label 1)."""

    def __init__(self, steps: int | None = None) -> None:
        self.steps = steps
        self.counts = ScoreCounts(steps)

    def eval(self, y_true: Any, y_pred: Any) -> ROC:
        labels = _labels(y_true)
        scores = _binary_scores(y_pred)
        if len(labels) != len(scores):
            raise DataError(f"{len(labels)} labels but {len(scores)} predictions")
        bad = ~np.isin(labels, (0, 1))
        if bad.any():
            raise DataError(f"ROC: labels must be 0 or 1, got {labels[bad][0]}")
        self.counts.add(scores, labels == 1)
        return self

    def merge(self, other: BaseEvaluation) -> ROC:
        self._check_mergeable(other)
        assert isinstance(other, ROC)
        self.counts.merge(other.counts)
        return self

    def auroc(self) -> float:
        return self.counts.auroc()

    def auprc(self) -> float:
        return self.counts.auprc()

    def summary(self) -> dict[str, float]:
        return {"auroc": self.auroc(), "auprc": self.auprc()}

    def stats(self) -> str:
        mode = f"binned, {self.steps} steps" if self.steps else "exact"
        return (f"ROC ({mode}): AUROC {self.auroc():.4f}, AUPRC {self.auprc():.4f} "
                f"over {self.counts.count} examples")

    def config(self) -> dict[str, Any]:
        return {"kind": self.kind, "steps": self.steps}

    def to_dict(self) -> dict[str, Any]:
        return {**self.config(), **self.counts.to_dict(), "figures": self.summary()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ROC:
        evaluation = cls(data.get("steps"))
        evaluation.counts.load(data)
        return evaluation


@register("roc_multiclass", _roc_multiclass)
class ROCMultiClass(BaseEvaluation):
    """One-vs-all ROC per class: AUROC and AUPRC of each class, and their macro averages."""

    sizes: ClassVar[dict[str, tuple[str, int]]] = {"num_classes": ("per_class", 100_000)}

    def __init__(self, num_classes: int, steps: int | None = None,
                 labels: Sequence[str] | None = None) -> None:
        if num_classes < 2:
            raise ValueError(f"num_classes must be at least 2, got {num_classes}")
        self.num_classes, self.steps = int(num_classes), steps
        self.labels = [str(c) for c in labels] if labels is not None else [
            str(i) for i in range(num_classes)
        ]
        self.per_class = [ScoreCounts(steps) for _ in range(num_classes)]

    def eval(self, y_true: Any, y_pred: Any) -> ROCMultiClass:
        labels = _labels(y_true).astype(np.int64)
        scores = as_2d(y_pred, self.num_classes)
        if len(labels) != len(scores):
            raise DataError(f"{len(labels)} labels but {len(scores)} predictions")
        bad = (labels < 0) | (labels >= self.num_classes)
        if bad.any():
            raise DataError(f"label {int(labels[bad][0])} is outside the "
                            f"{self.num_classes} classes")
        for k, counts in enumerate(self.per_class):
            counts.add(scores[:, k], labels == k)
        return self

    def merge(self, other: BaseEvaluation) -> ROCMultiClass:
        self._check_mergeable(other)
        assert isinstance(other, ROCMultiClass)
        for mine, theirs in zip(self.per_class, other.per_class, strict=True):
            mine.merge(theirs)
        return self

    def auroc(self, cls: int | None = None) -> float | np.ndarray:
        values = np.array([c.auroc() for c in self.per_class])
        return values if cls is None else float(values[cls])

    def auprc(self, cls: int | None = None) -> float | np.ndarray:
        values = np.array([c.auprc() for c in self.per_class])
        return values if cls is None else float(values[cls])

    def summary(self) -> dict[str, float]:
        return {"macro_auroc": float(np.nanmean(self.auroc())) if self._any() else float("nan"),
                "macro_auprc": float(np.nanmean(self.auprc())) if self._any() else float("nan")}

    def _any(self) -> bool:
        return bool(np.isfinite(self.auroc()).any())

    def stats(self) -> str:
        mode = f"binned, {self.steps} steps" if self.steps else "exact"
        lines = [f"ROC one-vs-all ({mode}), {self.per_class[0].count} examples",
                 f" {'class':>10} {'AUROC':>10} {'AUPRC':>10}"]
        for label, auroc, auprc in zip(self.labels, self.auroc(), self.auprc()):
            lines.append(f" {label:>10} {auroc:>10.4f} {auprc:>10.4f}")
        figures = self.summary()
        lines.append(f" {'macro':>10} {figures['macro_auroc']:>10.4f} "
                     f"{figures['macro_auprc']:>10.4f}")
        return "\n".join(lines)

    def config(self) -> dict[str, Any]:
        return {"kind": self.kind, "num_classes": self.num_classes, "steps": self.steps,
                "labels": self.labels}

    def to_dict(self) -> dict[str, Any]:
        return {**self.config(), "per_class": [c.to_dict() for c in self.per_class],
                "figures": self.summary()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ROCMultiClass:
        evaluation = cls(int(data["num_classes"]), data.get("steps"), data.get("labels"))
        parts = data.get("per_class")
        if parts is not None:
            if len(parts) != evaluation.num_classes:
                raise ValueError(f"'per_class' must hold {evaluation.num_classes} entries")
            for counts, part in zip(evaluation.per_class, parts):
                counts.load(part)
        return evaluation


alias("roc", _roc)  # binary for two classes, one-vs-all otherwise
