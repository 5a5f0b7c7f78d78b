"""Validating a DataFrame of several named inputs and outputs (a MultiDataSet) on Spark before
the shard writer writes it: one Spark aggregation, one :class:`DataError` naming the column.

Input columns are ``array<numeric>`` of ``prod(shape)`` values; class outputs hold integer
class indices; regression outputs are numbers or ``array<numeric>`` of ``prod(shape)`` values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sparkdl.data.metadata import TensorSpec
from sparkdl.errors import ConfigurationError, DataError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def as_specs(specs: Sequence[TensorSpec | dict[str, Any]], *, output: bool) -> list[TensorSpec]:
    """``inputs`` / ``outputs`` arguments as validated :class:`TensorSpec` objects."""
    what = "outputs" if output else "inputs"
    result = [s if isinstance(s, TensorSpec) else TensorSpec.from_dict(s, what) for s in specs]
    if not result:
        raise ConfigurationError(f"{what}: a multi-input/output shard needs at least one")
    for spec in result:
        try:
            spec.validate(what, output=output)
        except DataError as exc:
            raise ConfigurationError(str(exc)) from None
    return result


def prepare_multi(
    df: DataFrame, inputs: list[TensorSpec], outputs: list[TensorSpec]
) -> tuple[DataFrame, int]:
    """Select and cast the named columns; check every row. Returns the data and its row count."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    fields = {f.name: f.dataType for f in df.schema.fields}
    selected, aggs = [], [F.count(F.lit(1)).alias("rows")]
    for spec in (*inputs, *outputs):
        if spec.name not in fields:
            raise DataError(f"DataFrame has no column {spec.name!r} "
                            f"(columns: {', '.join(df.columns)})")
        dtype, col = fields[spec.name], F.col(spec.name)
        if spec.kind == "class":
            if not isinstance(dtype, T.NumericType):
                raise DataError(f"column {spec.name!r} must hold integer class indices, "
                                f"got {dtype}")
            bad = col.isNull() | (col < 0) | (col >= len(spec.classes)) | (col != F.floor(col))
            selected.append(col.cast("long").alias(spec.name))
            aggs.append(_count_if(bad).alias(spec.name))
            continue
        if isinstance(dtype, T.NumericType):
            col = F.array(col)
        elif not (isinstance(dtype, T.ArrayType) and isinstance(dtype.elementType,
                                                                  T.NumericType)):
            raise DataError(f"column {spec.name!r} must be array<numeric>, got {dtype}")
        col = col.cast("array<float>")
        finite = F.forall(col, lambda v: ~(F.isnull(v) | F.isnan(v)
                                           | (F.abs(v) == F.lit(float("inf")))))
        bad = col.isNull() | (F.size(col) != spec.size) | ~finite
        selected.append(col.alias(spec.name))
        aggs.append(_count_if(bad).alias(spec.name))
    data = df.select(*selected)
    counts = df.agg(*aggs).collect()[0].asDict()
    rows = int(counts.pop("rows"))
    if rows == 0:
        raise DataError("the DataFrame is empty: no rows to write")
    for spec in (*inputs, *outputs):
        if counts[spec.name]:
            want = (f"a class index in [0, {len(spec.classes)})" if spec.kind == "class"
                    else f"{spec.size} finite values (shape {spec.shape})")
            raise DataError(f"column {spec.name!r}: {counts[spec.name]} of {rows} rows do "
                            f"not hold {want}")
    return data, rows


def _count_if(condition: Any) -> Any:
    from pyspark.sql import functions as F

    return F.sum(F.when(condition, 1).otherwise(0))
