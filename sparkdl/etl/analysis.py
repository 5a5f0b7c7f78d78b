"""Data analysis on Spark (DataVec's ``AnalyzeSpark``): per-column statistics and histograms.

Two Spark aggregations over the data, whatever its size: one for count, missing, min, max,
mean and standard deviation of every column, one for the histograms (which need min and max).
Array columns are summarized over all their elements. String columns get count, missing and
the number of distinct values (approximate) with the most frequent ones.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sparkdl.errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def _kind(dtype: Any) -> str:
    from pyspark.sql import types as T

    if isinstance(dtype, T.ArrayType) and isinstance(dtype.elementType, T.NumericType):
        return "array"
    if isinstance(dtype, T.NumericType):
        return "numeric"
    if isinstance(dtype, T.StringType | T.BooleanType):
        return "categorical"
    return "other"


def _finite(v: Any) -> Any:
    return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else v


def analyze(
    df: DataFrame, columns: Sequence[str] | None = None, *, bins: int = 10, top: int = 10
) -> dict[str, Any]:
    """Statistics of ``columns`` (default: all) as a JSON-safe dict ``{"rows", "columns"}``.

    Numeric (and array-element) columns: count, missing (null or NaN), min, max, mean, std
    (sample), and a ``bins``-bucket histogram over [min, max]. Categorical: count, missing,
    distinct (approximate) and the ``top`` most frequent values with their counts.
    """
    from pyspark.sql import functions as F

    cols = list(columns or df.columns)
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ConfigurationError(f"analyze: no columns {missing} (columns: {df.columns})")
    if bins < 1:
        raise ConfigurationError(f"analyze: bins must be >= 1, got {bins}")
    kinds = {c: _kind(df.schema[c].dataType) for c in cols}

    # Array columns are analysed element-wise with higher-order functions (no explode).
    aggs: list[Any] = [F.count(F.lit(1)).alias("__rows")]
    for k, c in enumerate(cols):
        x = F.col(f"`{c}`")
        if kinds[c] == "numeric":
            v = x.cast("double")
            ok = v.isNotNull() & ~F.isnan(v)
            good = F.when(ok, v)
            aggs += [
                F.count(good).alias(f"count{k}"),
                F.sum(F.when(~ok | v.isNull(), 1).otherwise(0)).alias(f"missing{k}"),
                F.min(good).alias(f"min{k}"), F.max(good).alias(f"max{k}"),
                F.mean(good).alias(f"mean{k}"), F.stddev(good).alias(f"std{k}"),
            ]
        elif kinds[c] == "array":
            elems = F.filter(x, lambda e: e.isNotNull() & ~F.isnan(e.cast("double")))
            aggs += [
                F.sum(F.size(elems)).alias(f"count{k}"),
                F.sum(F.coalesce(F.size(x) - F.size(elems), F.lit(1))).alias(f"missing{k}"),
                F.min(F.array_min(elems)).alias(f"min{k}"),
                F.max(F.array_max(elems)).alias(f"max{k}"),
                F.sum(F.aggregate(elems, F.lit(0.0), lambda a, e: a + e)).alias(f"sum{k}"),
                F.sum(F.aggregate(elems, F.lit(0.0), lambda a, e: a + e * e)).alias(f"sq{k}"),
            ]
        else:
            s = x.cast("string")
            aggs += [
                F.count(s).alias(f"count{k}"),
                F.sum(F.when(s.isNull() | (F.trim(s) == ""), 1).otherwise(0)).alias(f"missing{k}"),
                F.approx_count_distinct(s).alias(f"distinct{k}"),
            ]
    r = df.agg(*aggs).collect()[0].asDict()
    rows = int(r["__rows"])
    out: dict[str, Any] = {}
    hist_aggs: list[Any] = []
    for k, c in enumerate(cols):
        stats: dict[str, Any] = {"type": kinds[c], "count": int(r[f"count{k}"] or 0),
                                 "missing": int(r[f"missing{k}"] or 0)}
        if kinds[c] in ("numeric", "array"):
            lo, hi = _finite(r[f"min{k}"]), _finite(r[f"max{k}"])
            if kinds[c] == "array":
                n = stats["count"]
                mean = r[f"sum{k}"] / n if n else None
                var = (r[f"sq{k}"] - n * mean * mean) / (n - 1) if n > 1 else None
                std = math.sqrt(max(var, 0.0)) if var is not None else None
            else:
                mean, std = r[f"mean{k}"], r[f"std{k}"]
            stats.update(min=lo, max=hi, mean=_finite(mean), std=_finite(std))
            if lo is not None and hi is not None:
                width = (hi - lo) / bins if hi > lo else 1.0
                edges = [lo + i * width for i in range(bins)] + [hi if hi > lo else lo + 1.0]
                stats["histogram"] = {"edges": edges, "counts": [0] * bins}
                x = F.col(f"`{c}`")

                def bucket(v: Any, lo: float = lo, width: float = width) -> Any:
                    b = F.floor((v.cast("double") - lo) / width).cast("int")
                    return F.least(F.greatest(b, F.lit(0)), F.lit(bins - 1))

                if kinds[c] == "array":
                    good = F.filter(x, lambda e: e.isNotNull() & ~F.isnan(e.cast("double")))
                    def in_bin(i: int, bucket: Any = bucket) -> Any:
                        return lambda e: bucket(e) == i

                    hist_aggs += [
                        F.sum(F.size(F.filter(good, in_bin(i)))).alias(f"h{k}_{i}")
                        for i in range(bins)
                    ]
                else:
                    ok = x.isNotNull() & ~F.isnan(x.cast("double"))
                    hist_aggs += [
                        F.sum(F.when(ok & (bucket(x) == i), 1).otherwise(0)).alias(f"h{k}_{i}")
                        for i in range(bins)
                    ]
        elif kinds[c] == "categorical":
            stats["distinct"] = int(r[f"distinct{k}"] or 0)
        out[c] = stats
    if hist_aggs:
        h = df.agg(*hist_aggs).collect()[0].asDict()
        for k, c in enumerate(cols):
            if "histogram" in out[c]:
                out[c]["histogram"]["counts"] = [int(h[f"h{k}_{i}"] or 0) for i in range(bins)]
    for c in cols:  # most frequent values: one small grouped aggregation per categorical column
        if kinds[c] == "categorical":
            freq = (df.groupBy(F.col(f"`{c}`").cast("string").alias("v")).count()
                    .orderBy(F.desc("count"), "v").limit(top).collect())
            out[c]["top"] = [[row["v"], int(row["count"])] for row in freq]
    return {"rows": rows, "columns": out}


def write_analysis(analysis: dict[str, Any], uri: str) -> None:
    """Write an analysis as JSON to a local path or any filesystem URI sparkdl can open.

    The file appears whole or not at all (:func:`sparkdl.storage.write_bytes`).
    """
    from sparkdl.storage import resolve, write_bytes

    fs, path = resolve(uri)
    parent = path.rpartition("/")[0]
    if parent:
        fs.create_dir(parent, recursive=True)
    write_bytes(fs, path, (json.dumps(analysis, indent=2, sort_keys=True) + "\n").encode())
