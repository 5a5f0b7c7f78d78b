"""Normalizers, splits and the digits pipeline on a real local Spark."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sparkdl.data import read_all, read_metadata
from sparkdl.errors import ConfigurationError, DataError
from sparkdl.etl.normalizers import (
    MinMaxNormalizer,
    StandardizeNormalizer,
    get_normalizer,
    normalizer_from_config,
)
from sparkdl.etl.samples import load_digits_df, load_iris_df
from sparkdl.etl.split import train_test_split

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def small(spark):
    rng = np.random.default_rng(1)
    x = rng.normal(3.0, 2.0, size=(200, 5)).astype(np.float32)
    x[:, 2] = 7.0  # constant column: std 0, range 0
    df = spark.createDataFrame([(r.tolist(), 0) for r in x], "features array<float>, label long")
    return df, x


def _collect(df) -> np.ndarray:
    return np.array([r["features"] for r in df.orderBy("label", "features").collect()],
                    np.float32)


def test_standardize(small) -> None:
    df, x = small
    norm = StandardizeNormalizer().fit(df)
    np.testing.assert_allclose(norm.mean, x.astype(np.float64).mean(0), rtol=1e-6)
    np.testing.assert_allclose(norm.std, x.astype(np.float64).std(0), rtol=1e-6, atol=1e-9)
    assert norm.scale[2] == 1.0
    out = _collect(norm.transform(df))
    expected = norm.apply_numpy(_collect(df))
    np.testing.assert_array_equal(out, expected)  # Spark and numpy: identical math
    assert np.abs(out.mean(0)).max() < 1e-5
    np.testing.assert_allclose(out[:, [0, 1, 3, 4]].std(0), 1.0, rtol=1e-5)
    assert (out[:, 2] == 0).all()
    again = normalizer_from_config(json.loads(json.dumps(norm.to_config())))
    np.testing.assert_array_equal(again.apply_numpy(x), norm.apply_numpy(x))
    assert norm.apply_numpy(x.reshape(200, 5, 1)).shape == (200, 5, 1)


def test_minmax(small) -> None:
    df, x = small
    norm = get_normalizer("minmax", feature_range=(-1.0, 1.0)).fit(df)
    assert isinstance(norm, MinMaxNormalizer)
    out = _collect(norm.transform(df))
    np.testing.assert_array_equal(out, norm.apply_numpy(_collect(df)))
    np.testing.assert_allclose(out[:, [0, 1, 3, 4]].min(0), -1.0, atol=1e-6)
    np.testing.assert_allclose(out[:, [0, 1, 3, 4]].max(0), 1.0, atol=1e-6)
    assert norm.to_config()["class_name"] == "MinMaxNormalizer"
    again = MinMaxNormalizer.from_config(norm.to_config())
    np.testing.assert_array_equal(again.apply_numpy(x), norm.apply_numpy(x))


def test_normalizer_errors(spark) -> None:
    with pytest.raises(ConfigurationError,
                       match="unknown normalizer 'zscore'; known: image, minmax, standardize"):
        get_normalizer("zscore")
    with pytest.raises(ConfigurationError, match="not fitted"):
        StandardizeNormalizer().apply_numpy(np.zeros((2, 3)))
    empty = spark.createDataFrame([], "features array<float>, label long")
    with pytest.raises(DataError, match="column 'features': the DataFrame is empty"):
        StandardizeNormalizer().fit(empty)
    # the lengths and the statistics are one query: rows of different lengths still name
    # the lengths, not the summary's failure
    ragged = spark.createDataFrame([([1.0, 2.0], 0), ([1.0, 2.0, 3.0], 1)],
                                   "features array<float>, label long")
    with pytest.raises(DataError, match="column 'features': rows have from 2 to 3 values"):
        MinMaxNormalizer().fit(ragged)


def test_split_deterministic(spark) -> None:
    df = load_iris_df(spark)
    train, test = train_test_split(df, 0.3, seed=5)
    train2, test2 = train_test_split(df.repartition(3), 0.3, seed=5)
    _, test3 = train_test_split(df, 0.3, seed=6)
    rows = sorted(map(tuple, (r["features"] for r in test.collect())))
    assert rows == sorted(map(tuple, (r["features"] for r in test2.collect())))
    assert rows != sorted(map(tuple, (r["features"] for r in test3.collect())))
    assert train.count() + test.count() == 150 == train2.count() + test2.count()
    assert 25 <= len(rows) <= 65
    with pytest.raises(ConfigurationError, match="test_fraction must be in"):
        train_test_split(df, 1.5, seed=0)


def test_digits_pipeline(spark, tmp_path: Path) -> None:
    from sparkdl.pipelines import get_pipeline

    with pytest.raises(ConfigurationError, match="unknown pipeline 'petastorm'; known: "
                       "csv, digits, digits_split, images, iris, mnist"):
        get_pipeline("petastorm")
    out_dir = f"file://{tmp_path}/digits"
    result = get_pipeline("digits")(spark, out_dir, num_files=4)
    assert result["train"] == f"{out_dir}/train" and result["test"] == f"{out_dir}/test"
    assert result["train_rows"] + result["test_rows"] == 1797
    assert 0.15 < result["test_rows"] / 1797 < 0.25
    train, test = read_metadata(result["train"]), read_metadata(result["test"])
    assert train.num_rows == result["train_rows"] and len(train.files) == 4
    assert train.feature_shape == [8, 8, 1] and train.classes == [str(i) for i in range(10)]
    assert train.normalizer == test.normalizer
    assert train.normalizer["class_name"] == "StandardizeNormalizer"
    assert len(train.normalizer["mean"]) == 64 and train.normalizer["count"] == train.num_rows
    assert train.extra["split"] == "train"
    x, y = read_all(result["train"])
    assert x.shape == (train.num_rows, 8, 8, 1) and set(np.unique(y)) == set(range(10))
    flat = x.reshape(len(x), -1)
    assert np.abs(flat.mean(0)).max() < 1e-4
    std = flat.std(0)
    assert np.allclose(std[std > 0], 1.0, atol=1e-3)
    # The stored normalizer reproduces the shards from raw pixels.
    raw = load_digits_df(spark).collect()
    norm = normalizer_from_config(train.normalizer)
    pixels = np.array([r["features"] for r in raw], np.float32)
    normalized = {tuple(r) for r in norm.apply_numpy(pixels)}
    assert {tuple(r) for r in flat} <= normalized
    with pytest.raises(DataError, match="already exists"):
        get_pipeline("digits")(spark, out_dir)


def test_digits_arrays_are_load_digits() -> None:
    """The digits read without importing scikit-learn are load_digits's, bit for bit."""
    from sklearn.datasets import load_digits

    from sparkdl.etl.samples import digits_arrays

    x, y = digits_arrays()
    bunch = load_digits()
    assert x.dtype == bunch.data.dtype and y.dtype == bunch.target.dtype
    assert x.tobytes() == bunch.data.tobytes() and y.tobytes() == bunch.target.tobytes()
