"""sparkdl.ml in a real pyspark.ml Pipeline: StringIndexer → VectorAssembler → KerasEstimator."""

from __future__ import annotations

import numpy as np
import pytest
from _frame_fixtures import classifier, iris_frame

from sparkdl.errors import ConfigurationError

pytestmark = pytest.mark.spark


@pytest.mark.slow  # a fit, three transforms, two saves and loads: over 30 s on 2 cores
def test_pipeline_fits_transforms_saves_and_loads(spark, tmp_path):
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import StringIndexer, VectorAssembler

    from sparkdl.ml import KerasEstimator, KerasModel

    iris = iris_frame(spark)
    estimator = KerasEstimator(
        model=classifier(4, 3), epochs=3, batchSize=16,
        trainingConfig={"mode": "dense", "num_workers": 2, "store": str(tmp_path / "store")},
    )
    pipeline = Pipeline(stages=[
        StringIndexer(inputCol="species", outputCol="label"),
        VectorAssembler(inputCols=["a", "b", "c", "d"], outputCol="features"),
        estimator,
    ])
    fitted = pipeline.fit(iris)
    keras_stage = fitted.stages[-1]
    assert isinstance(keras_stage, KerasModel)
    assert sorted(keras_stage.getClasses()) == ["setosa", "versicolor", "virginica"]
    history = keras_stage.history.history["loss"]
    assert history[-1] < history[0]

    out = fitted.transform(iris)
    assert dict(out.dtypes)["prediction"] == "double"
    assert dict(out.dtypes)["probability"] == "vector"
    rows = out.select("label", "prediction", "probability").collect()
    accuracy = np.mean([r.label == r.prediction for r in rows])
    assert accuracy > 0.6, accuracy

    fitted.write().overwrite().save(str(tmp_path / "pipeline"))
    loaded = PipelineModel.load(str(tmp_path / "pipeline"))
    assert isinstance(loaded.stages[-1], KerasModel)
    assert loaded.stages[-1].getClasses() == keras_stage.getClasses()
    again = loaded.transform(iris).select("prediction", "probability").collect()
    assert [r.prediction for r in again] == [r.prediction for r in rows]
    np.testing.assert_allclose([r.probability.toArray() for r in again],
                               [r.probability.toArray() for r in rows], rtol=1e-6)

    pipeline.write().save(str(tmp_path / "unfitted"))  # the estimator round-trips too
    estimator_again = Pipeline.load(str(tmp_path / "unfitted")).getStages()[-1]
    assert isinstance(estimator_again, KerasEstimator)
    assert estimator_again.getOrDefault("epochs") == 3
    assert estimator_again.training_config().mode == "dense"
    np.testing.assert_array_equal(estimator_again.model.get_weights()[0],
                                  estimator.model.get_weights()[0])


def test_estimator_rejects_bad_arguments():
    from sparkdl.ml import KerasEstimator

    with pytest.raises(ConfigurationError, match=r"needs a compiled keras\.Model"):
        KerasEstimator(model="not a model")
    bad = KerasEstimator(model=classifier(4, 3), trainingConfig={"mode": "fast"})
    with pytest.raises(ConfigurationError, match="trainingConfig: mode"):
        bad.training_config()
