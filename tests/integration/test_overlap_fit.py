"""training.overlap on digits: ParallelWrapper and SparkModel (local[2]) against synchronous
sharing. Tolerance: the digits test set has 374 rows (one row is 0.27 pp); measured with the
``overlap`` benchmark's runs (2 workers x 32, 6 epochs), overlap minus sync was -0.80 pp
(seed 1: 0.9599 vs 0.9679) and 0.00 pp (seed 2: 0.9679 both), mean -0.40 pp. One seed's
difference is a few rows of noise, so a single seed is held to 1.5 pp (0.5 pp is the target
for the mean over seeds, which the benchmark reports)."""

from __future__ import annotations

import pytest

from sparkdl import SharedTrainingMaster, SparkModel
from sparkdl.data.files import read_metadata
from sparkdl.parallel import ParallelWrapper

pytestmark = pytest.mark.spark

EPOCHS = 6
TOLERANCE = 0.015


def _fit_parallel(shards, make_mlp, overlap: bool):
    meta = read_metadata(shards["train"])
    master = SharedTrainingMaster(32, 2, overlap=overlap)
    wrapper = ParallelWrapper(make_mlp(meta.feature_shape, meta.num_classes), master,
                              timeout_s=60)
    return wrapper.fit(shards["train"], epochs=EPOCHS, validation_data=shards["test"], verbose=0)


def test_parallel_wrapper_overlap_matches_sync_accuracy(digits_shards, make_mlp):
    sync = _fit_parallel(digits_shards, make_mlp, overlap=False)
    overlap = _fit_parallel(digits_shards, make_mlp, overlap=True)
    assert overlap.metrics["replicas_identical"] is True
    assert overlap.workers[0].checksum != sync.workers[0].checksum  # it did train differently
    accuracy = overlap.history["val_accuracy"][-1]
    assert accuracy > 0.9
    assert abs(accuracy - sync.history["val_accuracy"][-1]) <= TOLERANCE, (
        accuracy, sync.history["val_accuracy"][-1])


@pytest.mark.slow  # default suite under 20 minutes
def test_spark_model_overlap_trains_like_parallel_wrapper(spark, digits_shards, make_mlp):
    meta = read_metadata(digits_shards["train"])
    spark_model = SparkModel(spark, make_mlp(meta.feature_shape, meta.num_classes),
                             SharedTrainingMaster(32, 2, overlap=True))
    fit = spark_model.fit(digits_shards["train"], epochs=EPOCHS,
                          validation_data=digits_shards["test"], verbose=0)
    assert fit.metrics["replicas_identical"] is True
    # the same worker loop on the same slices: the same model as the local processes'
    local = _fit_parallel(digits_shards, make_mlp, overlap=True)
    assert fit.workers[0].checksum == local.workers[0].checksum
    assert spark_model.evaluate(digits_shards["test"]).accuracy() > 0.9
