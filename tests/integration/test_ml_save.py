"""KerasModel.write().overwrite().save(path): the old stage stays whole until the new one is."""

from __future__ import annotations

import numpy as np
import pytest
from _frame_fixtures import classifier

pytestmark = pytest.mark.spark


def _unsavable(num_inputs: int):
    """A compiled model whose serialization fails half-way (a layer's get_config raises)."""
    import keras

    class Broken(keras.layers.Layer):
        def call(self, x):
            return x

        def get_config(self):
            raise RuntimeError("this layer cannot be saved")

    model = keras.Sequential([keras.Input(shape=(num_inputs,)), Broken(),
                              keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def test_a_failed_overwrite_keeps_the_old_saved_model_and_leaves_no_temporary(spark, tmp_path):
    from sparkdl.ml import KerasModel

    path = tmp_path / "stage"
    old = classifier(4, 3)
    KerasModel(old, classes=["a", "b", "c"]).write().save(str(path))
    with pytest.raises(RuntimeError, match="cannot be saved"):
        KerasModel(_unsavable(4)).write().overwrite().save(str(path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stage"]
    loaded = KerasModel.load(str(path))
    assert loaded.getClasses() == ["a", "b", "c"]
    np.testing.assert_array_equal(loaded.model.get_weights()[0], old.get_weights()[0])


def test_an_overwrite_replaces_the_saved_model_whole(spark, tmp_path):
    from sparkdl.ml import KerasModel

    path = tmp_path / "stage"
    KerasModel(classifier(4, 3), classes=["a", "b", "c"]).write().save(str(path))
    new = classifier(4, 2, seed=5)
    KerasModel(new, classes=["x", "y"]).write().overwrite().save(path.as_uri())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stage"]
    loaded = KerasModel.load(str(path))
    assert loaded.getClasses() == ["x", "y"]
    np.testing.assert_array_equal(loaded.model.get_weights()[0], new.get_weights()[0])
    with pytest.raises(Exception, match="already exists"):  # Spark ML's refusal, unchanged
        KerasModel(new).write().save(str(path))


class _Planted:
    """Unpickling this writes a marker file: what a planted pickle could do."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (open, (self.marker, "w"))


def test_loading_a_stage_never_unpickles_a_file_its_metadata_does_not_declare(spark, tmp_path):
    import pickle

    from sparkdl.errors import DataError
    from sparkdl.ml import CUSTOM_OBJECTS_FILE, KerasModel

    path = tmp_path / "stage"
    KerasModel(classifier(4, 3)).write().save(str(path))  # no customObjects
    marker = tmp_path / "ran"
    (path / CUSTOM_OBJECTS_FILE).write_bytes(pickle.dumps(_Planted(str(marker))))
    with pytest.raises(DataError, match=f"{CUSTOM_OBJECTS_FILE}.*declares no custom objects"):
        KerasModel.load(str(path))
    assert not marker.exists(), "the planted pickle ran"


def test_loading_the_wrong_kind_of_stage_or_a_truncated_model_says_which_file(spark, tmp_path):
    from sparkdl.errors import DataError
    from sparkdl.ml import KerasEstimator, KerasModel

    estimator = tmp_path / "estimator"
    KerasEstimator(model=classifier(4, 3), epochs=2).save(str(estimator))
    with pytest.raises(DataError, match=r"holds a KerasEstimator, not a KerasModel"):
        KerasModel.load(str(estimator))
    stage = tmp_path / "stage"
    KerasModel(classifier(4, 3)).write().save(str(stage))
    model_file = stage / "model.keras"
    model_file.write_bytes(model_file.read_bytes()[:100])
    with pytest.raises(DataError, match=f"{model_file}: not a Keras model"):
        KerasModel.load(str(stage))
