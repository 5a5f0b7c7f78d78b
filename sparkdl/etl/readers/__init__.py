"""Record readers: each turns a raw source into a Spark DataFrame with a declared schema,
reading on the executors (DataVec's RecordReaders)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparkdl.errors import ConfigurationError, unknown_name
from sparkdl.etl.readers.csv import read_csv
from sparkdl.etl.readers.idx import read_idx, read_idx_header, write_idx
from sparkdl.etl.readers.images import read_images, shape_of, with_shape
from sparkdl.etl.readers.sources import from_dataframe, read_parquet, read_sample

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

READERS = {
    "csv": read_csv,
    "images": read_images,
    "idx": read_idx,
    "parquet": read_parquet,
    "sample": read_sample,
}


def read_source(spark: SparkSession, spec: dict[str, Any], *, key: str = "source") -> DataFrame:
    """Read ``{"format": "csv", <reader keyword arguments>}`` with the named reader."""
    if not isinstance(spec, dict) or "format" not in spec:
        raise ConfigurationError(f"{key}: expected a mapping with a 'format' key, got {spec!r}")
    options = dict(spec)
    fmt = options.pop("format")
    reader = READERS.get(fmt)
    if reader is None:
        raise unknown_name("format", fmt, READERS, where=f"{key}.format")
    try:
        return reader(spark, **options)
    except TypeError as exc:
        raise ConfigurationError(f"{key}: bad options for the {fmt} reader: {exc}") from None


__all__ = [
    "READERS", "from_dataframe", "read_csv", "read_idx", "read_idx_header", "read_images",
    "read_parquet", "read_sample", "read_source", "shape_of", "with_shape", "write_idx",
]
