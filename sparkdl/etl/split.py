"""Deterministic train/test splits of Spark DataFrames."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sparkdl.errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

_BUCKETS = 1 << 30


def train_test_split(
    df: DataFrame,
    test_fraction: float,
    seed: int,
    *,
    key_columns: Sequence[str] | None = None,
) -> tuple[DataFrame, DataFrame]:
    """Split ``df`` into (train, test) by a seeded hash of each row.

    A row goes to test when ``xxhash64(seed, *key_columns)`` falls in the first
    ``test_fraction`` of the hash range, so the split depends only on the row's content (or on
    an id column passed as ``key_columns``) and the seed — never on partitioning or order. The
    test size is ``test_fraction`` of the rows in expectation, not exactly; identical rows
    always land in the same split.
    """
    from pyspark.sql import functions as F

    if not 0.0 < test_fraction < 1.0:
        raise ConfigurationError(f"test_fraction must be in (0, 1), got {test_fraction}")
    columns = list(key_columns or df.columns)
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ConfigurationError(f"key_columns {missing} are not columns of {df.columns}")
    bucket = F.pmod(F.xxhash64(F.lit(int(seed)), *[F.col(c) for c in columns]), F.lit(_BUCKETS))
    is_test = bucket < F.lit(round(test_fraction * _BUCKETS))
    return df.filter(~is_test), df.filter(is_test)
