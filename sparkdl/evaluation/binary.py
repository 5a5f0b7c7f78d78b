"""Binary evaluation of independent outputs (DL4J's EvaluationBinary): for multi-label
models with one sigmoid per output, each output column is its own yes/no classification.

State: true/false positive/negative counts per column; constant memory, exact merging.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from sparkdl.errors import DataError
from sparkdl.evaluation.base import BaseEvaluation, DataInfo, as_2d, register


def _binary(argument: str | None, info: DataInfo) -> EvaluationBinary:
    threshold = 0.5 if argument is None else float(argument)
    width = info.label_size if not info.classes else (1 if len(info.classes) == 2 else 0)
    if width < 1:
        raise ValueError("binary needs 0/1 targets per output (regression-kind label vectors "
                         "or two classes)")
    return EvaluationBinary(width, threshold, info.columns)


@register("binary", _binary)
class EvaluationBinary(BaseEvaluation):
    """Per-column accuracy, precision, recall and F1 of ``score >= threshold`` against 0/1
    targets."""

    sizes: ClassVar[dict[str, tuple[str, int]]] = {"num_columns": ("counts", 1_000_000)}

    def __init__(self, num_columns: int = 1, threshold: float = 0.5,
                 columns: Sequence[str] | None = None) -> None:
        if num_columns < 1:
            raise ValueError(f"num_columns must be at least 1, got {num_columns}")
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold must be in (0, 1), got {threshold}")
        self.num_columns, self.threshold = int(num_columns), float(threshold)
        self.columns = [str(c) for c in columns] if columns is not None else [
            f"col_{i}" for i in range(num_columns)
        ]
        # rows: columns; entries: tp, fp, tn, fn
        self.counts = np.zeros((num_columns, 4), dtype=np.int64)

    def eval(self, y_true: Any, y_pred: Any) -> EvaluationBinary:
        true = as_2d(y_true, self.num_columns)
        pred = as_2d(y_pred, self.num_columns) >= self.threshold
        if len(true) != len(pred):
            raise DataError(f"{len(true)} targets but {len(pred)} predictions")
        if not np.isin(true, (0.0, 1.0)).all():
            raise DataError(f"binary evaluation: targets must be 0 or 1, got "
                            f"{true[~np.isin(true, (0.0, 1.0))][0]:g}")
        actual = true == 1.0
        self.counts += np.stack([(pred & actual).sum(0), (pred & ~actual).sum(0),
                                 (~pred & ~actual).sum(0), (~pred & actual).sum(0)], axis=1)
        return self

    def merge(self, other: BaseEvaluation) -> EvaluationBinary:
        self._check_mergeable(other)
        assert isinstance(other, EvaluationBinary)
        self.counts += other.counts
        return self

    def _ratio(self, top: np.ndarray, bottom: np.ndarray) -> np.ndarray:
        return np.divide(top, bottom, out=np.zeros(self.num_columns), where=bottom > 0)

    def accuracy(self) -> np.ndarray:
        tp, _, tn, _ = self.counts.T
        return self._ratio(tp + tn, self.counts.sum(axis=1))

    def precision(self) -> np.ndarray:
        tp, fp, _, _ = self.counts.T
        return self._ratio(tp, tp + fp)

    def recall(self) -> np.ndarray:
        tp, _, _, fn = self.counts.T
        return self._ratio(tp, tp + fn)

    def f1(self) -> np.ndarray:
        p, r = self.precision(), self.recall()
        return self._ratio(2 * p * r, p + r)

    def summary(self) -> dict[str, float]:
        return {"binary_accuracy": float(self.accuracy().mean()),
                "binary_f1": float(self.f1().mean())}

    def stats(self) -> str:
        lines = [f"Binary evaluation (threshold {self.threshold:g}), "
                 f"{int(self.counts[0].sum())} examples",
                 f" {'column':>10} {'accuracy':>10} {'precision':>10} {'recall':>10} {'f1':>10}"]
        for name, *values in zip(self.columns, self.accuracy(), self.precision(),
                                 self.recall(), self.f1()):
            lines.append(f" {name:>10}" + "".join(f" {v:>10.4f}" for v in values))
        return "\n".join(lines)

    def config(self) -> dict[str, Any]:
        return {"kind": self.kind, "num_columns": self.num_columns,
                "threshold": self.threshold, "columns": self.columns}

    def to_dict(self) -> dict[str, Any]:
        return {**self.config(), "counts": self.counts.tolist(), "figures": self.summary()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvaluationBinary:
        evaluation = cls(int(data["num_columns"]), float(data.get("threshold", 0.5)),
                         data.get("columns"))
        if "counts" in data:
            evaluation.counts = np.asarray(data["counts"], dtype=np.int64).reshape(
                evaluation.num_columns, 4)
        return evaluation
