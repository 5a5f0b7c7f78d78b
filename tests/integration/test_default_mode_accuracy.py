"""The default exchange is safe on every model size.

* Iris (the 4→16→3 MLP, 131 parameters) through ``KerasEstimator`` with its default training
  config (``mode: auto``, which resolves to dense for so small a model) trains dense's very
  model, bit for bit, on each seed, in 40 epochs, and reaches over 0.8 held-out accuracy.
* Gradient sharing reaches dense allreduce's test accuracy in the same epochs (Strom's and
  DL4J's claim: no accuracy loss) on the digits MLP (17,226 parameters) and the LeNet of
  ``conf/mnist.yaml`` (431,080 parameters). One seed differs by a few test rows either way
  (the digits test set has 374 rows, one row is 0.27 pp), so a seed is held to 3 pp; the mean
  over 3 seeds within 1 pp is measured by ``python jobs/benchmark.py accuracy``.

The parity fits run on the tests' local Spark session (``SparkModel``): its Python workers
are reused from fit to fit, so TensorFlow is imported once, not once per fit and worker.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sparkdl.data.files import read_metadata
from sparkdl.spark_model import SparkModel
from sparkdl.training.masters import DenseTrainingMaster, SharedTrainingMaster

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SEEDS = (1,)  # the seeds' mean: benchmarks/accuracy.py
SEED_TOLERANCE = 0.03  # one seed: a handful of test rows
# The conf's 2 epochs (44 steps on 1,400 rows) stop LeNet at 0.87-0.91, where the curves are
# steep and sharing, its tau still ramping up, lags dense by 1.2 pp on the mean; 5 epochs
# train it to the end of the steep part, as the digits MLP's 6 epochs (120 steps) do.
LENET_EPOCHS = 5


def _iris_split(spark):  # type: ignore[no-untyped-def]
    from sklearn.datasets import load_iris
    from sklearn.model_selection import train_test_split

    data = load_iris()
    x_train, x_test, y_train, y_test = train_test_split(
        data.data, data.target, test_size=0.3, random_state=0, stratify=data.target)
    rows = [([float(v) for v in x], float(y)) for x, y in zip(x_train, y_train, strict=True)]
    train = spark.createDataFrame(rows, "features array<double>, label double")
    return train, x_test.astype(np.float32), y_test


def test_iris_in_the_default_mode_reaches_dense_accuracy_on_every_seed(spark, tmp_path):
    """On so small a model the default (``auto``) resolves to dense with dense's settings: on
    every seed it trains exactly dense's model (the same predictions, bit for bit), so it
    reaches dense's accuracy on each seed, and none is starved (a sharing default on so
    small a model fell to 0.71 on some seeds)."""
    from _frame_fixtures import classifier

    from sparkdl.ml import KerasEstimator

    train, x_test, y_test = _iris_split(spark)
    store = str(tmp_path / "store")

    def fit(seed: int, config: dict) -> np.ndarray:
        estimator = KerasEstimator(model=classifier(4, 3, seed=seed), epochs=40,
                                   trainingConfig=config, store=store)
        assert estimator.training_config().mode == config.get("mode", "auto")
        fitted = estimator.fit(train)
        assert fitted.history.metrics["mode"] == "dense"  # what auto resolved to
        return fitted.model.predict(x_test, verbose=0)

    accuracy = {}
    for seed in (1, 2):
        default, dense = fit(seed, {}), fit(seed, {"mode": "dense"})
        assert default.tobytes() == dense.tobytes(), seed  # the default is dense: same model
        accuracy[seed] = float(np.mean(default.argmax(axis=1) == y_test))
    print("iris held-out accuracy by seed (default = dense):", accuracy)
    assert all(a > 0.8 for a in accuracy.values()), accuracy


def _parity(fit_one) -> None:  # type: ignore[no-untyped-def]
    """Fit sharing and dense on every seed; hold each seed to the tolerance."""
    results = {seed: {mode: fit_one(mode, seed) for mode in ("sharing", "dense")}
               for seed in SEEDS}
    for seed, accuracy in results.items():
        assert accuracy["sharing"] >= accuracy["dense"] - SEED_TOLERANCE, (seed, results)
    print("accuracy by seed and mode:", results)


def _master(mode: str, seed: int):  # type: ignore[no-untyped-def]
    cls = SharedTrainingMaster if mode == "sharing" else DenseTrainingMaster
    return cls(32, 2, seed=seed)


def _val_accuracy(spark, model, master, shards: dict, epochs: int) -> float:  # type: ignore[no-untyped-def]
    fit = SparkModel(spark, model, master).fit(
        shards["train"], epochs=epochs, validation_data=shards["test"],
        validation_freq=epochs, verbose=0)
    assert fit.metrics["mode"] == master.mode and fit.metrics["replicas_identical"] is True
    return float(fit.history["val_accuracy"][-1])


def test_sharing_matches_dense_accuracy_on_the_digits_mlp(spark, digits_shards, make_mlp):
    meta = read_metadata(digits_shards["train"])

    def fit_one(mode: str, seed: int) -> float:
        model = make_mlp(meta.feature_shape, meta.num_classes, seed=seed)
        assert model.count_params() == 17_226
        return _val_accuracy(spark, model, _master(mode, seed), digits_shards, epochs=6)

    _parity(fit_one)


def test_sharing_matches_dense_accuracy_on_the_lenet_conf(spark, tmp_path):
    import keras

    from sparkdl.config import load_config
    from sparkdl.etl.samples import write_mnist_sample
    from sparkdl.models import build_model
    from sparkdl.pipelines import mnist

    conf = load_config(REPO / "conf" / "mnist.yaml")
    assert conf.model.name == "lenet" and conf.training.mode == "sharing"
    idx = write_mnist_sample(str(tmp_path / "idx"))
    shards = mnist.run(spark, (tmp_path / "data").as_uri(), path=idx, num_workers=2,
                       num_files=4, rows_per_group=64)
    meta = read_metadata(shards["train"])

    def fit_one(mode: str, seed: int) -> float:
        keras.utils.set_random_seed(seed)
        model = build_model(conf.model, meta.feature_shape, meta.num_classes)
        return _val_accuracy(spark, model, _master(mode, seed), shards, epochs=LENET_EPOCHS)

    _parity(fit_one)
