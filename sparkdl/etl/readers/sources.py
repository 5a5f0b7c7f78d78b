"""Parquet files, existing DataFrames and the built-in samples as record sources."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sparkdl.errors import DataError, unknown_name

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def read_parquet(
    spark: SparkSession, path: str | Sequence[str], *, columns: Sequence[str] | None = None
) -> DataFrame:
    """Parquet files (any Spark-readable URI), optionally only ``columns``."""
    from pyspark.sql.utils import AnalysisException

    paths = [path] if isinstance(path, str) else list(path)
    try:
        df = spark.read.parquet(*paths)
    except AnalysisException as exc:
        raise DataError(f"cannot read Parquet {path}: {str(exc).splitlines()[0]}") from None
    if columns:
        missing = [c for c in columns if c not in df.columns]
        if missing:
            raise DataError(f"Parquet {path} has no columns {missing} (columns: {df.columns})")
        df = df.select(*columns)
    return df


def from_dataframe(df: DataFrame, *, columns: Sequence[str] | None = None) -> DataFrame:
    """An existing DataFrame as a record source (optionally only ``columns``)."""
    if columns:
        missing = [c for c in columns if c not in df.columns]
        if missing:
            raise DataError(f"the DataFrame has no columns {missing} (columns: {df.columns})")
        return df.select(*columns)
    return df


def read_sample(spark: SparkSession, name: str, *, num_partitions: int = 2) -> DataFrame:
    """A built-in sample (``digits`` or ``iris``) with columns ``features`` and ``label``."""
    from sparkdl.etl import samples

    loaders = {"digits": samples.load_digits_df, "iris": samples.load_iris_df}
    if name not in loaders:
        raise unknown_name("sample", name, loaders)
    return loaders[name](spark, num_partitions)
