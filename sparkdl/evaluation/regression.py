"""Regression evaluation (DL4J's RegressionEvaluation): MSE, MAE, RMSE and R² per column.

The state per output column is the row count, the mean and the sum of squared deviations of
the targets (merged with Chan et al.'s parallel formula, so R² has no cancellation error), and
the sums of squared and absolute errors. Memory is constant in the number of rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from sparkdl.errors import DataError
from sparkdl.evaluation.base import BaseEvaluation, DataInfo, as_2d, register


def _regression(argument: str | None, info: DataInfo) -> RegressionEvaluation:
    if argument is not None:
        raise ValueError("regression takes no argument")
    if info.classes:
        raise ValueError("regression needs regression targets; these shards hold class labels")
    return RegressionEvaluation(info.label_size, info.columns)


@register("regression", _regression)
class RegressionEvaluation(BaseEvaluation):
    """Per-column MSE, MAE, RMSE and R² (R² as scikit-learn's ``r2_score``: 1 for a perfect
    fit of constant targets, 0 for an imperfect one)."""

    sizes: ClassVar[dict[str, tuple[str, int]]] = {"num_columns": ("mean", 1_000_000)}

    def __init__(self, num_columns: int = 1, columns: Sequence[str] | None = None) -> None:
        if num_columns < 1:
            raise ValueError(f"num_columns must be at least 1, got {num_columns}")
        if columns is not None and len(columns) != num_columns:
            raise ValueError(f"expected {num_columns} column names, got {len(columns)}")
        self.num_columns = int(num_columns)
        self.columns = [str(c) for c in columns] if columns is not None else [
            f"col_{i}" for i in range(num_columns)
        ]
        self.count = 0
        self.mean = np.zeros(num_columns)
        self.m2 = np.zeros(num_columns)  # sum of squared deviations of the targets
        self.sse = np.zeros(num_columns)
        self.sae = np.zeros(num_columns)

    def eval(self, y_true: Any, y_pred: Any) -> RegressionEvaluation:
        true = as_2d(y_true, self.num_columns)
        pred = as_2d(y_pred, self.num_columns)
        if len(true) != len(pred):
            raise DataError(f"{len(true)} targets but {len(pred)} predictions")
        if not (np.isfinite(true).all() and np.isfinite(pred).all()):
            raise DataError("regression evaluation: NaN or infinite targets or predictions")
        if len(true) == 0:
            return self
        errors = pred - true
        batch_mean = true.mean(axis=0)
        self._combine(len(true), batch_mean, ((true - batch_mean) ** 2).sum(axis=0),
                      (errors**2).sum(axis=0), np.abs(errors).sum(axis=0))
        return self

    def _combine(self, n: int, mean: np.ndarray, m2: np.ndarray, sse: np.ndarray,
                 sae: np.ndarray) -> None:
        total = self.count + n
        delta = mean - self.mean
        self.m2 = self.m2 + m2 + delta**2 * self.count * n / total
        self.mean = self.mean + delta * n / total
        self.sse = self.sse + sse
        self.sae = self.sae + sae
        self.count = total

    def merge(self, other: BaseEvaluation) -> RegressionEvaluation:
        self._check_mergeable(other)
        assert isinstance(other, RegressionEvaluation)
        if other.count:
            self._combine(other.count, other.mean, other.m2, other.sse, other.sae)
        return self

    def _per_row(self, total: np.ndarray) -> np.ndarray:
        return total / self.count if self.count else np.full(self.num_columns, np.nan)

    def mse(self) -> np.ndarray:
        return self._per_row(self.sse)

    def mae(self) -> np.ndarray:
        return self._per_row(self.sae)

    def rmse(self) -> np.ndarray:
        return np.sqrt(self.mse())

    def r2(self) -> np.ndarray:
        if not self.count:
            return np.full(self.num_columns, np.nan)
        constant = self.m2 == 0
        safe = np.where(constant, 1.0, self.m2)
        return np.where(constant, np.where(self.sse == 0, 1.0, 0.0), 1.0 - self.sse / safe)

    def summary(self) -> dict[str, float]:
        return {"mse": float(self.mse().mean()), "mae": float(self.mae().mean()),
                "rmse": float(self.rmse().mean()), "r2": float(self.r2().mean())}

    def stats(self) -> str:
        lines = ["=====================Regression Evaluation=====================",
                 f" Examples: {self.count}", "",
                 f" {'column':>12} {'MSE':>12} {'MAE':>12} {'RMSE':>12} {'R2':>12}"]
        for name, *values in zip(self.columns, self.mse(), self.mae(), self.rmse(), self.r2()):
            lines.append(f" {name:>12}" + "".join(f" {v:>12.6g}" for v in values))
        lines.append("===============================================================")
        return "\n".join(lines)

    def config(self) -> dict[str, Any]:
        return {"kind": self.kind, "num_columns": self.num_columns, "columns": self.columns}

    def to_dict(self) -> dict[str, Any]:
        return {**self.config(), "count": self.count, "mean": self.mean.tolist(),
                "m2": self.m2.tolist(), "sse": self.sse.tolist(), "sae": self.sae.tolist(),
                "figures": {"mse": self.mse().tolist(), "mae": self.mae().tolist(),
                            "rmse": self.rmse().tolist(), "r2": self.r2().tolist()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RegressionEvaluation:
        evaluation = cls(int(data["num_columns"]), data.get("columns"))
        evaluation.count = int(data.get("count", 0))
        for name in ("mean", "m2", "sse", "sae"):
            if name in data:
                value = np.asarray(data[name], dtype=np.float64)
                if value.shape != (evaluation.num_columns,):
                    raise ValueError(f"{name!r} must hold {evaluation.num_columns} values")
                setattr(evaluation, name, value)
        return evaluation
