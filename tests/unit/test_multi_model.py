"""The built-in mlp for shards with several named inputs and outputs (no Spark)."""

from __future__ import annotations

import numpy as np
import pytest

from sparkdl.config import ModelConfig
from sparkdl.data.metadata import TensorSpec
from sparkdl.errors import ConfigurationError
from sparkdl.models import build_model

INPUTS = [TensorSpec("top", [4, 8, 1]), TensorSpec("bottom", [4, 8, 1])]
OUTPUTS = [TensorSpec("digit", [], "class", [str(i) for i in range(10)]),
           TensorSpec("ink", [1], "regression")]


def test_mlp_becomes_a_two_head_model_named_after_the_data():
    config = ModelConfig(params={"hidden": [8]})
    model = build_model(config, [64], 0, inputs=INPUTS, outputs=OUTPUTS)
    assert sorted(model.output_names) == ["digit", "ink"]
    rng = np.random.default_rng(0)
    x = {"top": rng.random((6, 4, 8, 1), np.float32),
         "bottom": rng.random((6, 4, 8, 1), np.float32)}
    y = {"digit": rng.integers(0, 10, 6), "ink": rng.random((6, 1), np.float32)}
    pred = model.predict(x, verbose=0)
    assert pred["digit"].shape == (6, 10) and pred["ink"].shape == (6, 1)
    np.testing.assert_allclose(pred["digit"].sum(axis=1), 1.0, rtol=1e-5)
    losses = model.train_on_batch(x, y, return_dict=True)
    assert np.isfinite(losses["loss"])


def test_other_models_refuse_several_inputs_by_name():
    with pytest.raises(ConfigurationError, match="'lenet' takes one input"):
        build_model(ModelConfig(name="lenet"), [64], 0, inputs=INPUTS, outputs=OUTPUTS)
