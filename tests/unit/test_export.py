"""output.export: savedmodel — a TensorFlow SavedModel whose serving signature gives the
Keras model's outputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sparkdl.errors import ConfigurationError


def test_export_key_is_strict() -> None:
    from sparkdl.config import load_config

    assert load_config(None).output.export == "none"
    assert load_config(None, ["output.export=savedmodel"]).output.export == "savedmodel"
    with pytest.raises(ConfigurationError, match=r"output\.export"):
        load_config(None, ["output.export=onnx"])


def test_savedmodel_serves_the_keras_outputs(tmp_path: Path, make_mlp) -> None:
    import tensorflow as tf

    from sparkdl.stages import SAVEDMODEL_DIR, export_savedmodel

    model = make_mlp((8, 8), 10)
    target = tmp_path / SAVEDMODEL_DIR
    target.mkdir()
    (target / "stale.txt").write_text("from an earlier export")
    export_savedmodel(model, target)  # replaces an earlier export whole
    assert not (target / "stale.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [SAVEDMODEL_DIR]
    assert (target / "saved_model.pb").is_file()
    loaded = tf.saved_model.load(str(target))
    serving = loaded.signatures["serving_default"]
    x = np.random.default_rng(0).random((5, 8, 8), dtype=np.float32)
    (served,) = serving(tf.constant(x)).values()
    np.testing.assert_allclose(served.numpy(), model.predict(x, verbose=0), rtol=1e-5,
                               atol=1e-6)
