"""Small built-in sample data sets as Spark DataFrames (columns ``features``, ``label``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SCHEMA = "features array<float>, label long"


def _to_df(spark: SparkSession, x: np.ndarray, y: np.ndarray, num_partitions: int) -> DataFrame:
    rows = list(zip(x.astype(np.float32).tolist(), y.astype(np.int64).tolist(), strict=True))
    return spark.createDataFrame(rows, SCHEMA).repartition(num_partitions)


def load_digits_df(spark: SparkSession, num_partitions: int = 2) -> DataFrame:
    """scikit-learn's bundled digits: 1797 rows, 64 pixel values (8x8, 0..16), 10 classes."""
    from sklearn.datasets import load_digits

    data = load_digits()
    return _to_df(spark, data.data, data.target, num_partitions)


def load_iris_df(spark: SparkSession, num_partitions: int = 2) -> DataFrame:
    """scikit-learn's bundled iris: 150 rows, 4 measurements, 3 classes."""
    from sklearn.datasets import load_iris

    data = load_iris()
    return _to_df(spark, data.data, data.target, num_partitions)


DIGITS_CLASSES = [str(i) for i in range(10)]
DIGITS_SHAPE = [8, 8, 1]
IRIS_CLASSES = ["setosa", "versicolor", "virginica"]
IRIS_SHAPE = [4]
