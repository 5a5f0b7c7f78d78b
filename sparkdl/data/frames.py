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

from typing_extensions import TypeIs

from sparkdl.data.files import FEATURES, LABEL, WEIGHT
from sparkdl.errors import ConfigurationError, DataError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


def is_dataframe(data: Any) -> TypeIs[DataFrame]:
    """Whether ``data`` is a Spark DataFrame, classic or Spark Connect."""
    from pyspark.sql import DataFrame

    return isinstance(data, DataFrame)

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


def _features_name(features_col: FeaturesCol, model_input: str | None) -> str:
    listed = features_col if isinstance(features_col, str) else list(features_col)
    return f"features_col {listed!r}" + (f" (input {model_input!r})" if model_input else "")


def schema_feature_width(df: DataFrame, features_col: FeaturesCol) -> int | None:
    """The values per row of ``features_col`` that ``df``'s schema shows (a list of columns, a
    numeric column, a vector column with Spark ML attributes), else None."""
    from pyspark.sql import types as T

    if not isinstance(features_col, str):
        return len(features_col)
    column = _column_type(df, features_col, "features_col")
    if isinstance(column.dataType, T.NumericType):
        return 1
    width = (column.metadata or {}).get("ml_attr", {}).get("num_attrs")
    return int(width) if isinstance(width, int) and width >= 0 else None


def check_schema_width(
    df: DataFrame, features_col: FeaturesCol, shape: Sequence[int],
    model_input: str | None = None,
) -> None:
    """A :class:`DataError` when ``df``'s schema shows a width the model's input ``shape``
    does not have (no Spark job)."""
    width = schema_feature_width(df, features_col)
    _check_width(width, "per row", features_col, shape, model_input)


def _check_width(width: int | None, where: str, features_col: FeaturesCol,
                 shape: Sequence[int], model_input: str | None) -> None:
    size = math.prod(shape)
    if width is not None and width != size:
        raise DataError(f"{_features_name(features_col, model_input)}: {width} values {where}; "
                        f"the model's input shape {tuple(shape)} takes {size}")


def checked_features_column(
    df: DataFrame, features_col: FeaturesCol, shape: Sequence[int], *,
    model_input: str | None = None, what: str = "predict()",
) -> Column:
    """:func:`features_column`, checked against the model's input ``shape`` as ``fit`` checks
    its rows: a width the schema or the first row shows is a :class:`DataError` here, on the
    driver (one ``limit(1)`` job, none for a streaming DataFrame); each row is checked where
    Spark computes it, a null, a width other than ``prod(shape)`` or a null, NaN or infinite
    value failing the action in one marked line
    (:func:`~sparkdl.data.spark_errors.fail_when`, no Python traceback)."""
    from pyspark.sql import functions as F

    from sparkdl.data.spark_errors import dataframe_errors, fail_when

    features = features_column(df, features_col)
    width = schema_feature_width(df, features_col)
    if width is not None:
        _check_width(width, "per row", features_col, shape, model_input)
    elif not df.isStreaming:  # a stream's rows are checked one by one only
        with dataframe_errors(what):
            first = df.select(F.size(features)).limit(1).collect()
        found = first[0][0] if first else None
        if found is not None and found >= 0:  # size(null) is -1 (null with ANSI on)
            _check_width(int(found), "in the first row", features_col, shape, model_input)
    size, name = math.prod(shape), _features_name(features_col, model_input)
    takes = f"the model's input shape {tuple(shape)} takes {size}"
    count = F.size(features)
    bad_value = F.exists(features, lambda x: x.isNull() | F.isnan(x)
                         | (F.abs(x) == F.lit(float("inf"))))
    message = (F.when(features.isNull(), F.lit(f"{name} is null in a row; {takes} values"))
               .when(count != size, F.concat(F.lit(f"{name} holds "), count.cast("string"),
                                             F.lit(f" values in a row; {takes}")))
               .otherwise(F.lit(f"{name} has null, NaN or infinite values in a row; the model "
                                f"takes {size} finite values (input shape {tuple(shape)})")))
    bad = features.isNull() | (count != size) | bad_value
    return F.coalesce(fail_when(bad, message), features)


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
    "check_schema_width",
    "checked_features_column",
    "features_column",
    "infer_model_kind",
    "label_spec",
    "model_feature_shape",
    "model_output_width",
    "schema_feature_width",
    "training_frame",
]
