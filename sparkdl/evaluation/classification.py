"""Classification evaluations that can be computed in parts and merged (DL4J's Evaluation,
and its top-N accuracy)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from sparkdl.errors import DataError
from sparkdl.evaluation.base import BaseEvaluation, DataInfo, positive_int, register


def _classes(argument: str | None, info: DataInfo) -> Evaluation:
    if argument is not None:
        raise ValueError("classification takes no argument")
    if not info.classes:
        raise ValueError("classification needs class labels; these shards hold regression targets")
    return Evaluation(len(info.classes), info.classes)


def _top_n(argument: str | None, info: DataInfo) -> TopNAccuracy:
    if not info.classes:
        raise ValueError("top_n needs class labels; these shards hold regression targets")
    return TopNAccuracy(len(info.classes), positive_int(argument, 5, "top_n's N"))


def _class_indices(values: np.ndarray) -> np.ndarray:
    """Integer labels from indices or one-hot rows."""
    array = np.asarray(values)
    if array.ndim == 2 and array.shape[1] > 1:
        array = array.argmax(axis=1)
    return array.astype(np.int64).ravel()


@register("classification", _classes)
class Evaluation(BaseEvaluation):
    """Accuracy, per-class precision/recall/F1 and the confusion matrix.

    Feed it batches with :meth:`eval`, combine partial evaluations from many executors with
    :meth:`merge`, and print :meth:`stats`. Rows of the confusion matrix are true classes,
    columns are predicted classes.
    """

    sizes: ClassVar[dict[str, tuple[str, int]]] = {"num_classes": ("confusion", 10_000)}

    def __init__(self, num_classes: int, labels: Sequence[str] | None = None) -> None:
        if num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, got {num_classes}")
        if labels is not None and len(labels) != num_classes:
            raise ValueError(f"expected {num_classes} labels, got {len(labels)}")
        self.num_classes = int(num_classes)
        self.labels = [str(c) for c in labels] if labels is not None else [
            str(i) for i in range(num_classes)
        ]
        self.confusion = np.zeros((num_classes, num_classes), dtype=np.int64)

    def eval(self, y_true: np.ndarray, y_pred: np.ndarray) -> Evaluation:
        """Add a batch: integer labels (or one-hot) and class scores (or predicted indices)."""
        true = _class_indices(y_true)
        pred = np.asarray(y_pred)
        if pred.ndim == 2:
            pred = pred.argmax(axis=1)
        pred = pred.astype(np.int64).ravel()
        if true.shape != pred.shape:
            raise DataError(f"{true.size} labels but {pred.size} predictions")
        for name, values in (("label", true), ("prediction", pred)):
            bad = (values < 0) | (values >= self.num_classes)
            if bad.any():
                raise DataError(
                    f"{name} {int(values[bad][0])} is outside the {self.num_classes} classes"
                )
        np.add.at(self.confusion, (true, pred), 1)
        return self

    def merge(self, other: Evaluation) -> Evaluation:  # type: ignore[override]
        """Add another evaluation's counts into this one."""
        if not isinstance(other, Evaluation) or other.num_classes != self.num_classes:
            raise ValueError(
                f"cannot merge evaluations of {self.num_classes} and "
                f"{getattr(other, 'num_classes', type(other).__name__)} classes"
            )
        self.confusion += other.confusion
        return self

    @property
    def count(self) -> int:
        return int(self.confusion.sum())

    def accuracy(self) -> float:
        return float(np.trace(self.confusion) / self.count) if self.count else float("nan")

    def precision(self, cls: int | None = None) -> float | np.ndarray:
        """Per-class precision (or one class's); a class never predicted has precision 0."""
        predicted = self.confusion.sum(axis=0)
        values = np.divide(np.diag(self.confusion), predicted, out=np.zeros(self.num_classes),
                           where=predicted > 0)
        return values if cls is None else float(values[cls])

    def recall(self, cls: int | None = None) -> float | np.ndarray:
        actual = self.confusion.sum(axis=1)
        values = np.divide(np.diag(self.confusion), actual, out=np.zeros(self.num_classes),
                           where=actual > 0)
        return values if cls is None else float(values[cls])

    def f1(self, cls: int | None = None) -> float | np.ndarray:
        p, r = self.precision(), self.recall()
        values = np.divide(2 * p * r, p + r, out=np.zeros(self.num_classes), where=(p + r) > 0)
        return values if cls is None else float(values[cls])

    def macro_f1(self) -> float:
        present = self.confusion.sum(axis=1) > 0
        return float(self.f1()[present].mean()) if present.any() else float("nan")

    def stats(self) -> str:
        """A readable report: totals, per-class table and confusion matrix."""
        lines = [
            "========================Evaluation Metrics========================",
            f" # of classes:    {self.num_classes}",
            f" Examples:        {self.count}",
            f" Accuracy:        {self.accuracy():.4f}",
            f" Macro F1:        {self.macro_f1():.4f}",
            "",
            f" {'class':>10} {'precision':>10} {'recall':>10} {'f1':>10} {'support':>10}",
        ]
        p, r, f, support = self.precision(), self.recall(), self.f1(), self.confusion.sum(axis=1)
        for i, label in enumerate(self.labels):
            lines.append(f" {label:>10} {p[i]:>10.4f} {r[i]:>10.4f} {f[i]:>10.4f} {support[i]:>10}")
        width = max(5, *(len(label) for label in self.labels))
        lines += ["", " Confusion matrix (rows: actual, columns: predicted)"]
        lines.append(" " + " " * width + "".join(f" {label:>{width}}" for label in self.labels))
        for label, row in zip(self.labels, self.confusion):
            lines.append(f" {label:>{width}}" + "".join(f" {v:>{width}}" for v in row))
        lines.append("==================================================================")
        return "\n".join(lines)

    def summary(self) -> dict[str, float]:
        return {"accuracy": self.accuracy(), "macro_f1": self.macro_f1(),
                "examples": float(self.count)}

    def config(self) -> dict[str, Any]:
        return {"kind": self.kind, "num_classes": self.num_classes, "labels": self.labels}

    def to_dict(self) -> dict[str, Any]:
        return {**self.config(), "confusion": self.confusion.tolist()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Evaluation:
        evaluation = cls(data["num_classes"], data.get("labels"))
        if "confusion" not in data:
            return evaluation
        evaluation.confusion = np.asarray(data["confusion"], dtype=np.int64).reshape(
            evaluation.num_classes, evaluation.num_classes
        )
        return evaluation

    def __repr__(self) -> str:
        return f"Evaluation(num_classes={self.num_classes}, count={self.count}, " \
               f"accuracy={self.accuracy():.4f})"


@register("top_n", _top_n)
class TopNAccuracy(BaseEvaluation):
    """Top-N accuracy: a row counts as correct when its true class is among the N highest
    scores (a tie with the true class's score counts in its favour)."""

    def __init__(self, num_classes: int, n: int = 5) -> None:
        if num_classes < 1 or n < 1:
            raise ValueError(f"num_classes and n must be at least 1, got {num_classes}, {n}")
        self.num_classes, self.n = int(num_classes), int(n)
        self.correct = 0
        self.count = 0

    def eval(self, y_true: Any, y_pred: Any) -> TopNAccuracy:
        true = _class_indices(y_true)
        scores = np.asarray(y_pred, dtype=np.float64).reshape(len(true), -1)
        if scores.shape[1] != self.num_classes:
            raise DataError(f"top_n: expected {self.num_classes} scores per row, "
                            f"got {scores.shape[1]}")
        bad = (true < 0) | (true >= self.num_classes)
        if bad.any():
            raise DataError(f"label {int(true[bad][0])} is outside the {self.num_classes} classes")
        own = scores[np.arange(len(true)), true]
        higher = (scores > own[:, None]).sum(axis=1)
        self.correct += int((higher < self.n).sum())
        self.count += len(true)
        return self

    def merge(self, other: BaseEvaluation) -> TopNAccuracy:
        self._check_mergeable(other)
        assert isinstance(other, TopNAccuracy)
        self.correct += other.correct
        self.count += other.count
        return self

    def accuracy(self) -> float:
        return self.correct / self.count if self.count else float("nan")

    def summary(self) -> dict[str, float]:
        return {f"top_{self.n}_accuracy": self.accuracy()}

    def stats(self) -> str:
        return (f"Top-{self.n} accuracy: {self.accuracy():.4f} "
                f"({self.correct} of {self.count} examples)")

    def config(self) -> dict[str, Any]:
        return {"kind": self.kind, "num_classes": self.num_classes, "n": self.n}

    def to_dict(self) -> dict[str, Any]:
        return {**self.config(), "correct": self.correct, "count": self.count}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TopNAccuracy:
        evaluation = cls(int(data["num_classes"]), int(data["n"]))
        evaluation.correct = int(data.get("correct", 0))
        evaluation.count = int(data.get("count", 0))
        return evaluation
