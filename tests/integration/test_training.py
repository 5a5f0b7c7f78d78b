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


def test_the_model_travels_as_a_file_never_in_a_task_or_a_result_row(
    spark, digits_shards, tmp_path
):
    """A 5.8 MB model (weights and Adam's slots): the tasks carry its file's reference, rank
    0's result row the trained model's; the model to train is deleted once the fit is over;
    evaluate and predict read rank 0's file while the model is unchanged, and write the
    model again once it changed."""
    import pickle

    import keras
    import numpy as np

    from sparkdl.models import mlp
    from sparkdl.training.model_files import MODELS_DIR, load_model

    meta = read_metadata(digits_shards["train"])
    keras.utils.set_random_seed(3)
    net = mlp(tuple(meta.feature_shape), meta.num_classes, hidden=(2048, 640))
    net.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    store = tmp_path / "store"
    tm = DenseTrainingMaster(batch_size_per_worker=64, num_workers=2)
    spark_model = SparkModel(spark, net, tm, store=str(store))
    fit = spark_model.fit(digits_shards["train"], epochs=1, verbose=0)

    row_bytes = [len(pickle.dumps(worker)) for worker in fit.workers]  # a row's content
    assert max(row_bytes) < 64 << 10, row_bytes
    assert fit.model_file.size > 5_000_000 and fit.workers[0].model == fit.model_file
    models = store / MODELS_DIR
    assert sorted(p.name for p in models.iterdir()) == [f"{fit.model_file.sha256}.keras"]
    for ours, theirs in zip(spark_model.model.weights, load_model(fit.model_file).weights,
                            strict=True):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())

    assert spark_model.evaluate(digits_shards["test"]).accuracy() > 0.5
    assert len(list(models.iterdir())) == 1  # rank 0's file served
    kernel = spark_model.model.layers[-1].kernel
    kernel.assign(kernel.numpy() * 0.5)
    assert spark_model.predict(digits_shards["test"]).count() == digits_shards["test_rows"]
    assert len(list(models.iterdir())) == 2  # the changed model, written once


def test_a_model_distributed_by_spark_loads_on_the_executors(spark, make_mlp):
    """Where no storage is shared (a cluster, no store, a DataFrame to predict on), Spark
    distributes the model's file itself: each task loads it from its local copy, checked."""
    from sparkdl.spark.model_store import SPARK_FILES, distribute_model_file
    from sparkdl.spark.task_model import load_task_model
    from sparkdl.training.exchanges.variables import weights_checksum

    model = make_mlp([6], 3)
    ref = distribute_model_file(spark, model)
    assert ref.uri.startswith(SPARK_FILES) and distribute_model_file(spark, model) == ref

    def checksums(frames):
        import pandas as pd

        loaded = load_task_model(ref, None, 1)
        for frame in frames:
            yield pd.DataFrame({"sum": [weights_checksum(loaded.trainable_variables)]
                                * len(frame)})

    found = spark.range(0, 4, 1, 4).mapInPandas(checksums, "sum string").collect()
    assert {row["sum"] for row in found} == {weights_checksum(model.trainable_variables)}
