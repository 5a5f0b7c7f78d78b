"""TransformProcess serialization and config validation (no Spark)."""

from __future__ import annotations

import pytest

from sparkdl.errors import ConfigurationError
from sparkdl.etl.transform import STEPS, Assemble, CategoricalToInteger, TransformProcess

CONFIG = {
    "steps": [
        {"op": "remove_columns", "columns": ["id"]},
        {"op": "rename_columns", "mapping": {"a": "x"}},
        {"op": "reorder_columns", "columns": ["x"]},
        {"op": "filter_missing", "columns": None},
        {"op": "filter_non_finite", "columns": ["x"]},
        {"op": "filter", "column": "x", "condition": ">", "value": 0},
        {"op": "categorical_to_integer", "column": "c", "categories": ["u", "v"]},
        {"op": "categorical_to_one_hot", "column": "d", "categories": None},
        {"op": "math", "columns": ["x"], "fn": "clip", "value": None, "min": 0.0, "max": 5.0},
        {"op": "image_resize", "column": "image", "height": 14, "width": 14},
        {"op": "image_grayscale", "column": "image"},
        {"op": "image_scale", "column": "image", "max_value": 255.0},
        {"op": "assemble", "features": ["x", "image"], "label": "c", "shape": None,
         "weight": None},
    ]
}


def test_round_trip_json_and_yaml() -> None:
    tp = TransformProcess.from_config(CONFIG)
    assert [s.op for s in tp.steps] == [s["op"] for s in CONFIG["steps"]]
    assert set(STEPS) == {s["op"] for s in CONFIG["steps"]}  # every step is covered here
    assert TransformProcess.from_json(tp.to_json()).to_config() == CONFIG
    assert TransformProcess.from_yaml(tp.to_yaml()).to_config() == CONFIG
    assert tp.to_config() == CONFIG
    assert isinstance(tp.assemble, Assemble)
    assert tp.classes() == ["u", "v"] and tp.mapping("d") is None


def test_bare_list_and_fitted_state() -> None:
    tp = TransformProcess.from_config([{"op": "categorical_to_integer", "column": "c"}])
    step = tp.steps[0]
    assert isinstance(step, CategoricalToInteger) and not step.fitted
    step.categories = ["a", "b"]  # what fit() learns is part of the config
    assert TransformProcess.from_json(tp.to_json()).mapping("c") == ["a", "b"]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ([{"op": "explode"}], r"transform.steps\[0\].op: unknown step 'explode'"),
        ([{"columns": ["a"]}], r"transform.steps\[0\]: expected a mapping with an 'op' key"),
        ([{"op": "remove_columns", "cols": ["a"]}],
         r"transform.steps\[0\]: unknown key\(s\) \['cols'\] for step 'remove_columns'"),
        ([{"op": "math", "columns": ["a"], "fn": "pow", "value": 2}], r"fn must be one of"),
        ([{"op": "math", "columns": ["a"], "fn": "add"}], r"\(add\) needs a 'value'"),
        ([{"op": "filter", "column": "a", "condition": "~"}], r"condition must be one of"),
        ({"steps": [], "extra": 1}, r"transform: unknown key\(s\) \['extra'\]"),
        ("steps", r"transform: expected a list of steps"),
    ],
)
def test_bad_config_names_the_key(config: object, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        TransformProcess.from_config(config)


def test_invalid_json_yaml() -> None:
    with pytest.raises(ConfigurationError, match="invalid JSON"):
        TransformProcess.from_json("{nope")
    with pytest.raises(ConfigurationError, match="invalid YAML"):
        TransformProcess.from_yaml("steps: [")
