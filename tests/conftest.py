"""Shared pytest fixtures."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """A local[2] SparkSession shared by the whole test session."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("sparkdl-tests")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "1g")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def digits_shards(spark, tmp_path_factory) -> dict:
    """Digits train/test shards written once per test session by the real ETL pipeline."""
    from pipelines import digits

    out = tmp_path_factory.mktemp("digits")
    return digits.run(spark, out.as_uri() + "/data")


@pytest.fixture
def make_mlp():
    """Builds the default conf's MLP, compiled, with seeded initial weights."""
    return _make_mlp


def _make_mlp(input_shape, num_classes: int, learning_rate: float = 0.002, seed: int = 7):
    """The default conf's MLP, compiled, with seeded initial weights."""
    import keras

    from sparkdl.models import mlp

    keras.utils.set_random_seed(seed)
    model = mlp(input_shape, num_classes, hidden=(128, 64))
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate), loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model
