"""KerasEstimator's fit Params (callbacks, validation, sample and class weights, learning
rate) and tuning with Spark ML's CrossValidator / TrainValidationSplit on iris, real local
Spark and TensorFlow."""

from __future__ import annotations

import numpy as np
import pytest
from _frame_fixtures import classifier, iris_frame
from _log_capture import sparkdl_log

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def iris(spark):  # type: ignore[no-untyped-def]
    """Iris with ``features`` (a vector), ``label`` (StringIndexer's) and a weight ``w``."""
    from pyspark.ml.feature import StringIndexer, VectorAssembler
    from pyspark.sql import functions as F

    df = iris_frame(spark)
    df = StringIndexer(inputCol="species", outputCol="label").fit(df).transform(df)
    df = VectorAssembler(inputCols=["a", "b", "c", "d"], outputCol="features").transform(df)
    return df.withColumn("w", F.lit(0.0)).withColumn("held", F.col("a") > 6.5)


def _writes(messages: list[str]) -> int:
    return sum(m.startswith("writing shards") for m in messages)


@pytest.mark.slow  # three fits on 2 cores
def test_estimator_threads_callbacks_validation_weights_and_learning_rate(spark, iris,
                                                                         tmp_path):
    import keras

    from sparkdl.ml import KerasEstimator

    class Epochs(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.logs: list[dict] = []

        def on_epoch_end(self, epoch, logs=None):  # type: ignore[no-untyped-def]
            self.logs.append(dict(logs or {}))

    seen = Epochs()
    model = classifier(4, 3)
    estimator = KerasEstimator(
        model=model, epochs=2, batchSize=16, callbacks=[seen], validation=0.25,
        classWeight={0: 0.0, 1: 0.0, 2: 0.0}, learningRate=0.02,
        trainingConfig={"mode": "dense", "num_workers": 2, "store": str(tmp_path / "store")},
    )
    fitted = estimator.fit(iris)
    assert len(seen.logs) == 2 and all("val_loss" in logs for logs in seen.logs), seen.logs
    history = fitted.history.history
    # every class weighs 0: the training loss is 0 and the weights never move ...
    assert history["loss"] == [0.0, 0.0]
    for before, after in zip(model.get_weights(), fitted.model.get_weights(), strict=True):
        np.testing.assert_array_equal(before, after)
    assert all(v > 0 for v in history["val_loss"])  # ... while validation is unweighted
    rate = float(fitted.model.optimizer.learning_rate.numpy())
    assert rate == pytest.approx(0.02)

    weighted = estimator.copy({estimator.classWeight: {}, estimator.sampleWeightCol: "w",
                               estimator.validation: "held", estimator.callbacks: []})
    history = weighted.fit(iris).history.history
    assert history["loss"] == [0.0, 0.0]  # every row weighs 0
    assert len(history["val_loss"]) == 2

    unweighted = estimator.copy({estimator.classWeight: {}, estimator.callbacks: []})
    assert unweighted.fit(iris).history.history["loss"][0] > 0


def test_estimator_refuses_a_validation_column_that_is_not_boolean(spark, iris):
    from sparkdl.errors import ConfigurationError
    from sparkdl.ml import KerasEstimator

    estimator = KerasEstimator(model=classifier(4, 3), validation="species")
    with pytest.raises(ConfigurationError, match="'species' must name a boolean column"):
        estimator.fit(iris)
    with pytest.raises(TypeError, match="fraction in"):
        KerasEstimator(model=classifier(4, 3), validation=1.5)


def test_estimator_params_round_trip_through_save_and_load(spark, tmp_path):
    import keras

    from sparkdl.ml import KerasEstimator

    estimator = KerasEstimator(model=classifier(4, 3), classWeight={0: 1.0, 2: 3.0},
                               validation="held", sampleWeightCol="w", learningRate=0.01,
                               callbacks=[keras.callbacks.Callback()])
    estimator.save(str(tmp_path / "estimator"))
    loaded = KerasEstimator.load(str(tmp_path / "estimator"))
    assert loaded.getOrDefault("classWeight") == {0: 1.0, 2: 3.0}
    assert loaded.getOrDefault("validation") == "held"
    assert loaded.getOrDefault("sampleWeightCol") == "w"
    assert loaded.getOrDefault("learningRate") == 0.01
    assert loaded.getOrDefault("callbacks") == []  # driver objects are not saved


@pytest.mark.slow  # five fits (2 settings, 2 folds, and the best model) on 2 cores
def test_cross_validator_grid_fits_reuse_one_copy_of_each_folds_rows(spark, iris, tmp_path):
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.tuning import CrossValidator

    from sparkdl.ml import KerasEstimator, KerasModel

    estimator = KerasEstimator(
        model=classifier(4, 3), batchSize=16,
        trainingConfig={"mode": "dense", "num_workers": 2, "store": str(tmp_path / "store")},
    )
    # two points of the 2 x 2 grid: the weakest setting and the strongest
    grid = [{estimator.epochs: 1, estimator.learningRate: 0.001},
            {estimator.epochs: 4, estimator.learningRate: 0.05}]
    validator = CrossValidator(
        estimator=estimator, estimatorParamMaps=grid, numFolds=2, seed=7,
        evaluator=MulticlassClassificationEvaluator(metricName="accuracy"),
    )
    with sparkdl_log() as messages:
        tuned = validator.fit(iris.select("features", "label"))
    # five fits: each fold's training rows written once for the grid's two fits, and the
    # best model's final fit on all rows writes them once more
    assert _writes(messages) == 3, messages
    assert len(tuned.avgMetrics) == 2
    assert tuned.avgMetrics[1] > tuned.avgMetrics[0], tuned.avgMetrics  # (4, 0.05) > (1, 0.001)
    best = grid[int(np.argmax(tuned.avgMetrics))]
    assert isinstance(tuned.bestModel, KerasModel)
    assert len(tuned.bestModel.history.history["loss"]) == best[estimator.epochs]
    rate = float(tuned.bestModel.model.optimizer.learning_rate.numpy())
    assert rate == pytest.approx(best[estimator.learningRate])
    rows = tuned.transform(iris).select("label", "prediction").collect()
    assert np.mean([r.label == r.prediction for r in rows]) > 0.6


@pytest.mark.slow  # five fits on 2 cores
def test_train_validation_split_tunes_the_training_config(spark, iris, tmp_path):
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.tuning import ParamGridBuilder, TrainValidationSplit

    from sparkdl.ml import KerasEstimator

    store = str(tmp_path / "store")
    estimator = KerasEstimator(model=classifier(4, 3), batchSize=16, learningRate=0.05)
    configs = [{"mode": "dense", "num_workers": 2, "store": store},
               {"mode": "averaging", "num_workers": 2, "store": store}]
    grid = (ParamGridBuilder().addGrid(estimator.trainingConfig, configs)
            .addGrid(estimator.epochs, [1, 3]).build())
    validator = TrainValidationSplit(
        estimator=estimator, estimatorParamMaps=grid, trainRatio=0.75, seed=7,
        evaluator=MulticlassClassificationEvaluator(metricName="accuracy"),
    )
    with sparkdl_log() as messages:
        tuned = validator.fit(iris.select("features", "label"))
    assert _writes(messages) == 2, messages  # five fits: the training split's and the final
    assert len(tuned.validationMetrics) == 4
    best = grid[int(np.argmax(tuned.validationMetrics))]
    metrics = tuned.bestModel.history.metrics
    assert metrics["mode"] == best[estimator.trainingConfig]["mode"]
    assert metrics["epochs"] == best[estimator.epochs]
