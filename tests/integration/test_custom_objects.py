"""A custom Keras layer defined in a script's ``__main__`` (as in a notebook) trains with
``fit`` on Spark, evaluates, and travels through ``KerasEstimator(customObjects=...)`` and its
save/load into a new process that never defined it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.spark

COMMON = '''
import json, sys
import numpy as np
from pyspark.sql import SparkSession

spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.driver.memory", "1g").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
rng = np.random.default_rng(0)
rows = [(rng.normal(size=4).astype("float32").tolist(), i % 3) for i in range(96)]
df = spark.createDataFrame(rows, "features array<float>, label int")
'''

TRAIN = COMMON + '''
import keras
from sparkdl.ml import KerasEstimator
from sparkdl.spark_model import SparkModel
from sparkdl.training.masters import DenseTrainingMaster


class Halve(keras.layers.Layer):  # defined here, in __main__, as a notebook cell would
    def call(self, x):
        return x * 0.5


def model():
    keras.utils.set_random_seed(1)
    m = keras.Sequential([keras.Input((4,)), Halve(), keras.layers.Dense(3, activation="softmax")])
    m.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return m


master = DenseTrainingMaster(num_workers=2, batch_size_per_worker=16)
spark_model = SparkModel(spark, model(), master, custom_objects={"Halve": Halve})
history = spark_model.fit(df, epochs=1, verbose=0)
evaluation = spark_model.evaluate(df)
estimator = KerasEstimator(model(), epochs=1, trainingConfig={"mode": "dense", "num_workers": 2},
                           customObjects={"Halve": Halve})
fitted = estimator.fit(df)
estimator.write().save(sys.argv[1] + "/estimator")
fitted.write().save(sys.argv[1] + "/model")
print(json.dumps({"fit_loss": history.history["loss"][-1], "evaluated": evaluation.count,
                  "predicted": fitted.transform(df).count()}))
'''

LOAD = COMMON + '''
from sparkdl.ml import KerasEstimator, KerasModel

assert "Halve" not in globals()
model = KerasModel.load(sys.argv[1] + "/model")
estimator = KerasEstimator.load(sys.argv[1] + "/estimator")
layer = type(model.model.layers[0])
print(json.dumps({"layer": layer.__name__, "objects": sorted(model.getCustomObjects()),
                  "estimator_objects": sorted(estimator.getCustomObjects()),
                  "predicted": model.transform(df).count(),
                  "refit": estimator.fit(df).transform(df).count()}))
'''


def _script(tmp_path: Path, name: str, text: str) -> dict:
    path = tmp_path / name
    path.write_text(text)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(path), str(tmp_path / "saved")], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=500, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # two Spark processes
def test_a_custom_layer_from_a_script_trains_evaluates_and_round_trips(tmp_path: Path) -> None:
    trained = _script(tmp_path, "notebook.py", TRAIN)
    assert trained["evaluated"] == 96 and trained["predicted"] == 96
    assert trained["fit_loss"] > 0
    loaded = _script(tmp_path, "later.py", LOAD)  # a new process: Halve is defined nowhere
    assert loaded == {"layer": "Halve", "objects": ["Halve"], "estimator_objects": ["Halve"],
                      "predicted": 96, "refit": 96}


def _notebook_layer():
    """A layer class as a notebook defines it: its module is ``__main__``, which on an
    executor is a different script, so only a class shipped by value is found there."""
    import keras

    class Double(keras.layers.Layer):
        def call(self, x):
            return x * 2.0

    Double.__module__, Double.__qualname__ = "__main__", "Double"
    return Double


def test_a_notebook_layer_trains_with_fit_and_the_estimator_saves_it(spark, tmp_path) -> None:
    import keras

    from sparkdl.ml import KerasEstimator
    from sparkdl.spark_model import SparkModel
    from sparkdl.training.masters import DenseTrainingMaster

    double = _notebook_layer()
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((4,)), double(),
                              keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    df = spark.createDataFrame([(rng.normal(size=4).tolist(), i % 3) for i in range(64)],
                               "features array<float>, label int")
    spark_model = SparkModel(spark, model, DenseTrainingMaster(num_workers=2,
                                                               batch_size_per_worker=16),
                             custom_objects={"Double": double})
    history = spark_model.fit(df, epochs=1, verbose=0, store=str(tmp_path / "store"))
    assert len(history.history["loss"]) == 1
    assert type(spark_model.model.layers[0]).__name__ == "Double"

    estimator = KerasEstimator(model, epochs=1, customObjects={"Double": double})
    estimator.write().save(str(tmp_path / "estimator"))
    loaded = KerasEstimator.load(str(tmp_path / "estimator"))
    assert sorted(loaded.getCustomObjects()) == ["Double"]
    assert type(loaded.model.layers[0]).__name__ == "Double"
    assert loaded.getOrDefault("epochs") == 1
