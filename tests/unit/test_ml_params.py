"""KerasEstimator's Params refuse a value of the wrong kind when it is set, naming the Param
(no Spark session needed: Params are checked on the driver)."""

from __future__ import annotations

import keras
import pytest

from sparkdl.config import TrainingConfig
from sparkdl.ml import KerasEstimator


def _model() -> keras.Model:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, "softmax")])
    model.compile("adam", "sparse_categorical_crossentropy")
    return model


@pytest.mark.parametrize(("params", "message"), [
    ({"trainingConfig": "dense"}, r'"trainingConfig".*a dict \(the training section of a job '
                                  r"configuration\), got 'dense'"),
    ({"callbacks": "x"}, r'"callbacks".*a list of keras\.callbacks\.Callback, got \'x\''),
    ({"callbacks": [object()]}, r'"callbacks".*a list of keras\.callbacks\.Callback, got '
                                r"a object in it"),
    ({"customObjects": 5}, r'"customObjects".*a dict \{name: class or function\}, got 5'),
    ({"customObjects": {1: int}}, r'"customObjects".*names must be strings, got 1'),
])
def test_a_param_of_the_wrong_kind_is_refused_when_set(params: dict, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        KerasEstimator(model=_model(), **params)


def test_params_of_the_right_kind_are_kept() -> None:
    stop = keras.callbacks.EarlyStopping()
    estimator = KerasEstimator(model=_model(), trainingConfig={"mode": "dense"},
                               callbacks=(stop,), customObjects={"Dense": keras.layers.Dense})
    assert estimator.getOrDefault("callbacks") == [stop]
    assert estimator.getCustomObjects() == {"Dense": keras.layers.Dense}
    assert estimator.getOrDefault("trainingConfig") == {"mode": "dense"}


def test_the_fit_options_of_training_config_reach_the_fit(tmp_path) -> None:
    """Every fit option ``trainingConfig`` holds reaches ``fit`` (they are one list,
    ``sparkdl.fit_options.YAML_KEYS``); the Params ``epochs``, ``verbose``,
    ``classWeight`` and ``callbacks`` win where set."""
    from sparkdl.fit_options import YAML_KEYS
    from sparkdl.training.driver.keras_fit import FIT_OPTIONS

    config = {"mode": "dense", "epochs": 3, "prefetch": 7, "decode_threads": 3,
              "shuffle": "none", "accumulate_steps": 2, "checkpoint_every": 2,
              "checkpoint_dir": str(tmp_path / "ckpt"), "class_weight": {0: 2.0},
              "validation_freq": 2, "log_every_steps": 5}
    estimator = KerasEstimator(model=_model(), trainingConfig=config)
    keywords = estimator.fit_options(estimator.training_config())
    assert set(keywords) == {*YAML_KEYS, "callbacks"} and set(keywords) <= set(FIT_OPTIONS)
    assert {k: keywords[k] for k in config if k not in ("mode", "checkpoint_dir")} == {
        k: v for k, v in config.items() if k not in ("mode", "checkpoint_dir")}
    assert keywords["checkpoint_dir"] == (tmp_path / "ckpt").as_uri()
    assert keywords["verbose"] == 0 and keywords["callbacks"] is None  # an estimator is quiet

    stop = keras.callbacks.EarlyStopping()
    estimator = KerasEstimator(model=_model(), trainingConfig={**config, "verbose": 2},
                               epochs=5, classWeight={1: 3.0}, callbacks=[stop])
    keywords = estimator.fit_options(estimator.training_config())
    assert keywords["epochs"] == 5 and keywords["class_weight"] == {1: 3.0}
    assert keywords["verbose"] == 2 and keywords["callbacks"] == [stop]
    assert KerasEstimator(model=_model(), trainingConfig={"verbose": 2}, verbose=1).fit_options(
        TrainingConfig.model_validate({"verbose": 2}))["verbose"] == 1
