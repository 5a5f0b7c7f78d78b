"""KerasEstimator's Params refuse a value of the wrong kind when it is set, naming the Param
(no Spark session needed: Params are checked on the driver)."""

from __future__ import annotations

import keras
import pytest

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
