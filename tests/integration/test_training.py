"""Training on real local Spark: barrier stages, real TCP rings, real Parquet shards."""

from __future__ import annotations

import os

import pytest

from sparkdl import (
    DenseTrainingMaster,
    ParameterAveragingTrainingMaster,
    SharedTrainingMaster,
    SparkModel,
)
from sparkdl.compression import AdaptiveThreshold
from sparkdl.config import ClusterConfig
from sparkdl.cpus import current_cpus
from sparkdl.data.files import read_metadata
from sparkdl.errors import ConfigurationError, DataError

pytestmark = pytest.mark.spark


@pytest.fixture
def model_for(make_mlp):
    def build(uri: str):
        meta = read_metadata(uri)
        return make_mlp(meta.feature_shape, meta.num_classes)

    return build


def test_sharing_reaches_accuracy_with_compression_and_identical_replicas(
    spark, digits_shards, model_for
):
    tm = SharedTrainingMaster(
        batch_size_per_worker=32, num_workers=2, threshold=AdaptiveThreshold(initial=1e-3)
    )
    spark_model = SparkModel(spark, model_for(digits_shards["train"]), tm)
    fit = spark_model.fit(digits_shards["train"], epochs=12)

    checksums = [w.checksum for w in fit.workers]
    assert len(checksums) == 2 and checksums[0] == checksums[1], checksums
    assert fit.metrics["replicas_identical"] is True
    assert fit.metrics["dense_bytes_per_step"] / fit.metrics["bytes_per_step"] >= 50
    assert fit.metrics["steps"] == 12 * fit.metrics["steps_per_epoch"]
    assert fit.history["loss"][-1] < fit.history["loss"][0]

    evaluation = spark_model.evaluate(digits_shards["test"])
    assert evaluation.count == digits_shards["test_rows"]
    assert evaluation.accuracy() >= 0.95, evaluation.stats()


def test_averaging_reaches_accuracy(spark, digits_shards, model_for):
    tm = ParameterAveragingTrainingMaster(
        batch_size_per_worker=32, num_workers=2, averaging_frequency=5, save_updater=True
    )
    spark_model = SparkModel(spark, model_for(digits_shards["train"]), tm)
    fit = spark_model.fit(digits_shards["train"], epochs=12)
    assert fit.metrics["replicas_identical"] is True
    assert spark_model.evaluate(digits_shards["test"]).accuracy() >= 0.95


def test_spark_rpc_transport_gives_the_same_model_as_tcp(spark, digits_shards, model_for):
    """Training is deterministic for a seed, so both transports must end bit-identical, and
    so must a fit whose tasks are pinned to cores of their own (``cluster.cpu_affinity``): the
    cores' keys ride on the TCP ring's address exchange, and take an allGather of their own
    on the Spark RPC transport, which exchanges nothing on connecting."""
    checksums = {}
    fits = {}
    for transport, affinity in (("tcp", "on"), ("spark", "on"), ("tcp", "off")):
        tm = SharedTrainingMaster(batch_size_per_worker=32, num_workers=2)
        spark_model = SparkModel(
            spark, model_for(digits_shards["train"]), tm,
            cluster=ClusterConfig(transport=transport, cpu_affinity=affinity),
        )
        fits[transport, affinity] = fit = spark_model.fit(digits_shards["train"], epochs=1)
        checksums[transport, affinity] = fit.workers[0].checksum
        assert fit.metrics["replicas_identical"] is True
    assert len(set(checksums.values())) == 1, checksums
    cpus = current_cpus()
    if len(cpus) >= 2:  # local[2]: both tasks' Python workers share this machine's cores
        for transport in ("tcp", "spark"):
            assert sorted(fits[transport, "on"].metrics["worker_cpus"]) == [[cpus[0]], [cpus[1]]]
    assert fits["tcp", "off"].metrics.worker_cpus is None
    # Spark reuses its Python workers: the next tasks run on every core again
    after = spark.sparkContext.parallelize(range(2), 2).map(
        lambda _: sorted(os.sched_getaffinity(0))).collect()
    assert after == [cpus, cpus]


def test_dense_baseline_and_predict(spark, digits_shards, model_for):
    tm = DenseTrainingMaster(batch_size_per_worker=32, num_workers=2)
    spark_model = SparkModel(spark, model_for(digits_shards["train"]), tm)
    fit = spark_model.fit(digits_shards["train"], epochs=3)
    assert fit.metrics["replicas_identical"] is True
    predictions = spark_model.predict(digits_shards["test"]).toPandas()
    assert len(predictions) == digits_shards["test_rows"]
    assert (predictions["prediction"] == predictions["label"]).mean() > 0.8
    assert len(predictions["probability"][0]) == 10


def test_predict_normalizes_raw_features_as_the_etl_did(spark, digits_shards, model_for):
    """predict(raw, normalizer=train shards) gives the scores of predicting on rows the ETL's
    Spark normalizer transformed: the same math on the executors."""
    import numpy as np
    from sklearn.datasets import load_digits

    from sparkdl.etl.normalizers import StandardizeNormalizer, normalizer_from_config

    train = digits_shards["train"]
    meta = read_metadata(train)
    assert meta.normalizer and meta.normalizer["class_name"] == "StandardizeNormalizer"
    rows = [(i, x.tolist()) for i, x in enumerate(load_digits().data[:300])]
    raw = spark.createDataFrame(rows, "id long, features array<float>")
    by_etl = normalizer_from_config(meta.normalizer).transform(raw)
    spark_model = SparkModel(spark, model_for(train), SharedTrainingMaster())

    def scores(df):
        frame = df.toPandas().sort_values("id")
        probabilities = [v.toArray() for v in frame["probability"]]
        return np.stack(probabilities), frame["prediction"].to_numpy()

    got, got_classes = scores(spark_model.predict(raw, normalizer=train))
    want, want_classes = scores(spark_model.predict(by_etl))
    np.testing.assert_array_equal(got, want)
    assert (got_classes == want_classes).all()
    unnormalized, _ = scores(spark_model.predict(raw))
    assert not np.allclose(unnormalized, want)
    with pytest.raises(ConfigurationError, match="StandardizeNormalizer is not fitted"):
        spark_model.predict(raw, normalizer=StandardizeNormalizer())
    with pytest.raises(ConfigurationError, match="got int"):
        spark_model.predict(raw, normalizer=3)  # type: ignore[arg-type]


def test_missing_shard_path_is_one_clear_error(spark, tmp_path, make_mlp):
    spark_model = SparkModel(spark, make_mlp([8, 8, 1], 10), SharedTrainingMaster())
    missing = (tmp_path / "nope").as_uri()
    with pytest.raises(DataError, match="does not exist"):
        spark_model.fit(missing, epochs=1)
    assert not (tmp_path / "nope").exists()


def test_directory_without_metadata_is_one_clear_error(spark, tmp_path, make_mlp):
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "part-0.parquet").write_bytes(b"not really")
    spark_model = SparkModel(spark, make_mlp([8, 8, 1], 10), SharedTrainingMaster())
    with pytest.raises(DataError, match=r"_sparkdl\.json"):
        spark_model.fit((tmp_path / "raw").as_uri(), epochs=1)
    assert sorted(p.name for p in (tmp_path / "raw").iterdir()) == ["part-0.parquet"]


def test_more_workers_than_slots_is_refused_before_launch(spark, digits_shards, model_for):
    tm = SharedTrainingMaster(batch_size_per_worker=8, num_workers=3)
    spark_model = SparkModel(spark, model_for(digits_shards["train"]), tm)
    with pytest.raises(ConfigurationError, match=r"num_workers=3 but Spark has only 2 task slots"):
        spark_model.fit(digits_shards["train"], epochs=1)
