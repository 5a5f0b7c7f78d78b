"""The non-finite values policy: fail on NaN / ±inf features, or drop those rows and count."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparkdl.errors import ConfigurationError, DataError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

POLICIES = ("fail", "drop")


def handle_non_finite(
    df: DataFrame, policy: str = "fail", column: str = "features"
) -> tuple[DataFrame, int]:
    """Apply ``policy`` to rows whose ``column`` (array or numeric) holds NaN, ±inf or null.

    One Spark aggregation counts the bad rows. ``fail`` raises :class:`DataError` with the
    count; ``drop`` returns the DataFrame without them and the number dropped.
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if policy not in POLICIES:
        raise ConfigurationError(f"nan_policy must be one of {POLICIES}, got {policy!r}")
    if column not in df.columns:
        raise DataError(f"no column {column!r} to check for NaN (columns: {df.columns})")
    inf = F.lit(float("inf"))
    x = F.col(column)
    if isinstance(df.schema[column].dataType, T.ArrayType):
        bad = F.exists(x, lambda v: v.isNull() | F.isnan(v) | (F.abs(v) == inf))
    else:
        bad = x.isNull() | F.isnan(x) | (F.abs(x) == inf)
    bad = F.coalesce(bad, F.lit(True))
    r = df.agg(F.count(F.lit(1)).alias("n"), F.sum(F.when(bad, 1).otherwise(0)).alias("bad"))
    row = r.collect()[0]
    n, count = int(row["n"]), int(row["bad"] or 0)
    if count and policy == "fail":
        raise DataError(
            f"column {column!r} has NaN or infinite values in {count} of {n} rows "
            f"(nan_policy 'fail'; set nan_policy: drop to drop them)"
        )
    return (df.filter(~bad) if count else df), count
