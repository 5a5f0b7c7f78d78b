"""User DataFrames → the shard writer's ``features`` / ``label`` columns (driver side, Spark).

Features may be a Spark ML vector column (``VectorUDT``), an ``array<numeric>`` column, a
numeric column, or a list of numeric columns. The label kind is forced with ``label_kind`` or
inferred (:func:`label_spec`): string labels, labels with Spark ML nominal metadata (from
``StringIndexer``) and integer labels are classes; array labels are regression targets; a
fractional label is a class index when the model ends in a softmax (or a one-unit sigmoid) and
a regression target otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sparkdl.data.files import FEATURES, LABEL, WEIGHT
from sparkdl.errors import ConfigurationError, DataError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

FeaturesCol = str | Sequence[str]
_ACCEPTED_FEATURES = (
    "a Spark ML vector column, an array<numeric> column, a numeric column, or a list of "
    "numeric columns"
)


@dataclass
class LabelSpec:
    """How the label column becomes the shards' ``label``: its kind and class names."""

    kind: str  # "class" or "regression"
    classes: list[str] = field(default_factory=list)
    string_labels: bool = False  # labels are the class names themselves

    def get_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "classes": list(self.classes),
                "string_labels": self.string_labels}


def model_output_width(model: Any) -> int:
    shape = model.output_shape
    if isinstance(shape, list):
        raise ConfigurationError("fit on a DataFrame supports single-output models only")
    return int(math.prod(d for d in shape[1:] if d is not None) or 1)


def model_feature_shape(model: Any) -> list[int]:
    shape = model.input_shape
    if isinstance(shape, list) or any(d is None for d in shape[1:]):
        raise ConfigurationError(
            f"the model's input shape {shape} must be one input with known dimensions"
        )
    return [int(d) for d in shape[1:]]


def infer_model_kind(model: Any) -> str:
    """``"class"`` when the model ends in a softmax or a one-unit sigmoid, else regression."""
    last = model.layers[-1] if getattr(model, "layers", None) else None
    if last is not None and type(last).__name__ == "Softmax":
        return "class"
    activation = getattr(getattr(last, "activation", None), "__name__", "")
    if activation == "softmax" or (activation == "sigmoid" and model_output_width(model) == 1):
        return "class"
    return "regression"


def _num_classes(model: Any) -> int:
    width = model_output_width(model)
    return 2 if width == 1 else width


def _column_type(df: DataFrame, name: str, role: str) -> Any:
    if not isinstance(name, str):
        raise ConfigurationError(f"{role} must name a column (a str), got {type(name).__name__}")
    fields = {f.name: f for f in df.schema.fields}
    if name not in fields:
        raise DataError(f"{role}: the DataFrame has no column {name!r} (columns: "
                        f"{', '.join(df.columns)})")
    return fields[name]


def features_column(df: DataFrame, features_col: FeaturesCol) -> Column:
    """``features_col`` of ``df`` as one ``array<float>`` column expression."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(features_col, str):
        dtype = _column_type(df, features_col, "features_col").dataType
        col = F.col(features_col)
        if isinstance(dtype, VectorUDT):
            return vector_to_array(col, "float32")
        if isinstance(dtype, T.ArrayType) and isinstance(dtype.elementType, T.NumericType):
            return col.cast("array<float>")
        if isinstance(dtype, T.NumericType):
            return F.array(col).cast("array<float>")
        raise DataError(f"features_col {features_col!r} has type {dtype.simpleString()}; "
                        f"accepted: {_ACCEPTED_FEATURES}")
    if isinstance(features_col, Sequence) and features_col:
        for name in features_col:
            dtype = _column_type(df, name, "features_col").dataType
            if not isinstance(dtype, T.NumericType):
                raise DataError(f"features_col: column {name!r} has type "
                                f"{dtype.simpleString()}; a list of columns must be numeric")
        return F.array(*[F.col(c) for c in features_col]).cast("array<float>")
    raise ConfigurationError(
        f"features_col takes a column name or a non-empty list of column names "
        f"({_ACCEPTED_FEATURES}), got {features_col!r}"
    )


def label_spec(
    df: DataFrame, label_col: str, model: Any, label_kind: str | None = None,
    classes: Sequence[str] | None = None,
) -> LabelSpec:
    """The kind and classes of ``label_col`` for ``model`` (see the module docstring)."""
    from pyspark.sql import types as T

    if label_kind not in (None, "class", "regression"):
        raise ConfigurationError(
            f"label_kind must be 'class', 'regression' or None (infer), got {label_kind!r}"
        )
    column = _column_type(df, label_col, "label_col")
    dtype = column.dataType
    nominal = (column.metadata or {}).get("ml_attr", {})
    names = [str(v) for v in nominal.get("vals", [])] if nominal.get("type") == "nominal" else []
    is_string = isinstance(dtype, T.StringType)
    if label_kind is None:
        if is_string or names or isinstance(dtype, T.IntegralType | T.BooleanType):
            label_kind = "class"
        elif isinstance(dtype, T.ArrayType):
            label_kind = "regression"
        else:
            label_kind = infer_model_kind(model)
    if label_kind == "regression":
        if is_string:
            raise DataError(f"label_col {label_col!r} holds strings; regression needs numbers")
        return LabelSpec("regression")
    if classes:
        return LabelSpec("class", [str(c) for c in classes], is_string)
    width = _num_classes(model)
    if is_string:
        found = sorted(r[0] for r in df.select(label_col).distinct().collect() if r[0] is not None)
        names = found
    if names and len(names) != width:
        raise ConfigurationError(
            f"label_col {label_col!r} has {len(names)} classes ({', '.join(names[:5])}"
            f"{', ...' if len(names) > 5 else ''}) but the model outputs {width}"
        )
    return LabelSpec("class", names or [str(i) for i in range(width)], is_string)


def label_column(label_col: str, spec: LabelSpec) -> Column:
    """``label_col`` as the writer expects it; unknown string labels become -1 (rejected by the
    writer's range check)."""
    from pyspark.sql import functions as F

    col = F.col(label_col)
    if spec.string_labels:
        names = F.array(*[F.lit(c) for c in spec.classes])
        return (F.array_position(names, col) - 1).cast("long")
    return col


def training_frame(
    df: DataFrame, features_col: FeaturesCol, label_col: str, spec: LabelSpec,
    weight_col: str | None = None,
) -> DataFrame:
    """``df`` reduced to the writer's ``features`` (array<float>) and ``label`` columns, plus
    ``sample_weight`` (the column ``weight_col``) when given."""
    from pyspark.sql import functions as F

    columns = [features_column(df, features_col).alias(FEATURES),
               label_column(label_col, spec).alias(LABEL)]
    if weight_col is not None:
        if weight_col not in df.columns:
            raise DataError(f"sample_weight_col {weight_col!r} is not a column of the "
                            f"DataFrame (columns: {', '.join(df.columns)})")
        columns.append(F.col(weight_col).alias(WEIGHT))
    return df.select(*columns)


__all__ = [
    "LabelSpec",
    "features_column",
    "infer_model_kind",
    "label_spec",
    "model_feature_shape",
    "model_output_width",
    "training_frame",
]
