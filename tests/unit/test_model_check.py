"""A model that does not fit the shards is refused on the driver, in one line naming both
sides, before any task runs: ``SparkModel`` is given no Spark session at all here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkdl.data.metadata import FORMAT_VERSION, ShardFile, ShardMetadata, write_metadata
from sparkdl.errors import ConfigurationError

ROWS = 8


def _shards(root: Path, feature_shape: list[int], label_kind: str = "class",
            classes: int = 10, label_shape: list[int] | None = None) -> str:
    """A real one-file shard directory (Parquet and ``_sparkdl.json``)."""
    root.mkdir(parents=True)
    size = int(np.prod(feature_shape))
    offsets = pa.array(np.arange(ROWS + 1) * size, pa.int32())
    features = pa.ListArray.from_arrays(offsets, pa.array(np.zeros(ROWS * size, np.float32)))
    label_shape = label_shape if label_shape is not None else ([] if label_kind == "class"
                                                               else [1])
    if label_kind == "class":
        label = pa.array(np.arange(ROWS) % classes, pa.int64())
    else:
        width = int(np.prod(label_shape))
        label = pa.ListArray.from_arrays(pa.array(np.arange(ROWS + 1) * width, pa.int32()),
                                         pa.array(np.zeros(ROWS * width, np.float32)))
    pq.write_table(pa.table({"features": features, "label": label}), root / "part-0.parquet",
                   row_group_size=ROWS)
    write_metadata(str(root), ShardMetadata(
        format_version=FORMAT_VERSION, feature_shape=feature_shape, feature_dtype="float32",
        label_kind=label_kind, classes=[str(c) for c in range(classes)]
        if label_kind == "class" else [], label_shape=label_shape, num_rows=ROWS,
        files=[ShardFile("part-0.parquet", ROWS, [ROWS])]))
    return root.as_uri()


def _model(input_shape: tuple[int, ...], units: int, loss: object,
           activation: str = "softmax"):
    import keras

    model = keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(),
                              keras.layers.Dense(units, activation=activation)])
    model.compile(optimizer="sgd", loss=loss)
    return model


def _fit(model, uri: str, **kwargs) -> None:
    from sparkdl.spark_model import SparkModel
    from sparkdl.training.masters import DenseTrainingMaster

    SparkModel(None, model, DenseTrainingMaster(num_workers=2)).fit(uri, **kwargs)


@pytest.fixture(scope="module")
def digits_like(tmp_path_factory) -> str:
    return _shards(tmp_path_factory.mktemp("model-check") / "digits", [8, 8, 1])


def test_a_flat_input_on_image_shards_is_one_line_naming_both_shapes(digits_like):
    with pytest.raises(ConfigurationError) as info:
        _fit(_model((64,), 10, "sparse_categorical_crossentropy"), digits_like)
    message = str(info.value)
    assert message == (f"model input (64,) does not match the shards' features (8, 8, 1) in "
                       f"{digits_like}/_sparkdl.json")


def test_output_units_that_are_not_the_number_of_classes_are_refused(digits_like):
    with pytest.raises(ConfigurationError,
                       match=r"^model output has 3 units, but the shards' label has 10 classes "
                             r"in .*/_sparkdl\.json$"):
        _fit(_model((8, 8, 1), 3, "sparse_categorical_crossentropy"), digits_like)


def test_a_one_hot_loss_on_class_index_labels_is_refused(digits_like):
    import keras

    for loss in ("categorical_crossentropy", keras.losses.CategoricalCrossentropy()):
        with pytest.raises(ConfigurationError,
                           match=r"^model loss categorical_crossentropy expects one-hot labels, "
                                 r"but the shards' label holds class indices \(10 classes\)"):
            _fit(_model((8, 8, 1), 10, loss), digits_like)


def test_a_class_index_loss_on_regression_targets_is_refused(tmp_path):
    uri = _shards(tmp_path / "reg", [4], label_kind="regression", label_shape=[3])
    with pytest.raises(ConfigurationError,
                       match=r"^model loss sparse_categorical_crossentropy expects class "
                             r"indices, but the shards' label holds regression targets \(3,\)"):
        _fit(_model((4,), 3, "sparse_categorical_crossentropy"), uri)
    with pytest.raises(ConfigurationError,
                       match=r"^model output has 1 units, but the shards' regression label "
                             r"has 3 value\(s\) \(3,\)"):
        _fit(_model((4,), 1, "mse", activation="linear"), uri)


def test_validation_shards_are_checked_too(digits_like, tmp_path):
    other = _shards(tmp_path / "other", [8, 8, 1], classes=3)
    with pytest.raises(ConfigurationError, match=r"has 3 classes in .*other/_sparkdl\.json"):
        _fit(_model((8, 8, 1), 10, "sparse_categorical_crossentropy"), digits_like,
             validation_data=other)


def test_a_model_that_fits_passes_the_check(digits_like, tmp_path):
    from sparkdl.data.metadata import load_metadata
    from sparkdl.training.model_check import check_model_fits_shards

    meta = load_metadata(digits_like)
    check_model_fits_shards(_model((8, 8, 1), 10, "sparse_categorical_crossentropy"), meta,
                            digits_like)
    binary = _shards(tmp_path / "binary", [8, 8, 1], classes=2)
    check_model_fits_shards(_model((8, 8, 1), 1, "binary_crossentropy", "sigmoid"),
                            load_metadata(binary), binary)
    # scoring does not look at the loss
    check_model_fits_shards(_model((8, 8, 1), 10, "categorical_crossentropy"), meta,
                            digits_like, training=False)
