"""Multi-input/output shard metadata (format version 2): round trip, packing, reading
version 1, and one clear error per inconsistency. No Spark."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sparkdl.data.metadata import (
    ShardFile,
    ShardMetadata,
    TensorSpec,
    packed_metadata_fields,
)
from sparkdl.errors import DataError

INPUTS = [TensorSpec("top", [2, 2]), TensorSpec("bottom", [3])]
OUTPUTS = [TensorSpec("digit", [], "class", ["a", "b", "c"]), TensorSpec("ink", [2], "regression")]


def _multi(**kw: object) -> ShardMetadata:
    fields = {**packed_metadata_fields(INPUTS, OUTPUTS), **kw}
    return ShardMetadata(format_version=2, num_rows=4,
                         files=[ShardFile("part-00000.parquet", 4, [4])], **fields)


def test_round_trip_and_columns():
    meta = _multi()
    meta.validate()
    again = ShardMetadata.from_json(meta.to_json())
    assert again == meta and again.multi
    assert again.columns == ["top", "bottom", "digit", "ink"]
    assert again.feature_shape == [7] and again.label_shape == [3]


def test_unpack_splits_packed_rows_by_name():
    meta = _multi()
    x = np.arange(14, dtype=np.float32).reshape(2, 7)
    y = np.array([[2, 0.5, 1.5], [0, 1.0, 2.0]], dtype=np.float32)
    inputs, outputs = meta.unpack(x, y)
    np.testing.assert_array_equal(inputs["top"], [[[0, 1], [2, 3]], [[7, 8], [9, 10]]])
    np.testing.assert_array_equal(inputs["bottom"], [[4, 5, 6], [11, 12, 13]])
    assert outputs["digit"].dtype == np.int64 and outputs["digit"].tolist() == [2, 0]
    np.testing.assert_array_equal(outputs["ink"], [[0.5, 1.5], [1.0, 2.0]])


def test_version_1_is_still_read():
    data = json.loads(_multi().to_json())
    single = {**data, "format_version": 1, "inputs": [], "outputs": [], "feature_shape": [7],
              "label_kind": "class", "classes": ["a", "b"], "label_shape": []}
    single.pop("class_index")
    meta = ShardMetadata.from_dict(single)
    assert meta.format_version == 1 and not meta.multi
    assert meta.columns == ["features", "label"]
    with pytest.raises(DataError, match="'inputs' and 'outputs' need format_version 2"):
        ShardMetadata.from_dict({**data, "format_version": 1})


@pytest.mark.parametrize("change, message", [
    ({"outputs": []}, "'inputs' and 'outputs' go together"),
    ({"label_shape": [4]}, "must describe the packed row: \\[7\\], \\[3\\]"),
    ({"outputs": [{"name": "top", "shape": [1], "kind": "regression"}]},
     "names must be unique"),
    ({"outputs": [{"name": "digit", "shape": [], "kind": "class", "classes": []}]},
     "digit: a class output needs 'classes'"),
    ({"inputs": [{"name": "top", "shape": [7], "kind": "class"}]},
     "top: kind must be one of \\('features',\\)"),
    ({"inputs": [{"name": "a b", "shape": [7]}]}, "name 'a b' must be letters"),
])
def test_inconsistent_multi_metadata_names_the_problem(change, message):
    data = {**json.loads(_multi().to_json()), **change}
    with pytest.raises(DataError, match=message):
        ShardMetadata.from_dict(data, source="x/_sparkdl.json")
