"""What sparkdl.data.frames reads off a Keras model (no Spark)."""

from __future__ import annotations

import keras
import pytest

from sparkdl.data.frames import infer_model_kind, model_feature_shape, model_output_width
from sparkdl.errors import ConfigurationError


def _model(*layers, inputs=(4,)):
    return keras.Sequential([keras.Input(shape=inputs), *layers])


def test_softmax_and_one_unit_sigmoid_are_classifiers_the_rest_regressors():
    assert infer_model_kind(_model(keras.layers.Dense(3, activation="softmax"))) == "class"
    assert infer_model_kind(_model(keras.layers.Dense(3), keras.layers.Softmax())) == "class"
    assert infer_model_kind(_model(keras.layers.Dense(1, activation="sigmoid"))) == "class"
    assert infer_model_kind(_model(keras.layers.Dense(3, activation="sigmoid"))) == "regression"
    assert infer_model_kind(_model(keras.layers.Dense(2))) == "regression"


def test_shapes_come_from_the_model():
    model = _model(keras.layers.Flatten(), keras.layers.Dense(5), inputs=(8, 8, 1))
    assert model_feature_shape(model) == [8, 8, 1]
    assert model_output_width(model) == 5
    with pytest.raises(ConfigurationError, match="known dimensions"):
        model_feature_shape(_model(keras.layers.GlobalAveragePooling1D(), inputs=(None, 3)))
