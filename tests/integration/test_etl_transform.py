"""Transform process, analysis, image scaler and the NaN policy on a real local Spark."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from sparkdl.data.spark_errors import spark_data_errors
from sparkdl.errors import ConfigurationError, DataError
from sparkdl.etl.analysis import analyze, write_analysis
from sparkdl.etl.clean import handle_non_finite
from sparkdl.etl.normalizers import ImageScaler, get_normalizer, normalizer_from_config
from sparkdl.etl.readers import shape_of, with_shape
from sparkdl.etl.transform import TransformProcess

pytestmark = pytest.mark.spark

NAN = float("nan")


@pytest.fixture(scope="module")
def table(spark):
    rows = [
        (1, "a", 2.0, "red", "cat"), (2, "b", NAN, "blue", "dog"), (3, None, 4.0, "red", "dog"),
        (4, "d", -1.0, "green", "cat"), (5, "e", 8.0, "blue", "bird"), (6, " ", 1.0, "red", "cat"),
    ]
    return spark.createDataFrame(rows, "id int, name string, x double, colour string, pet string")


def _rows(df) -> list[tuple]:
    return sorted(tuple(r) for r in df.collect())


def test_column_steps_and_filters(table) -> None:
    tp = TransformProcess.from_config([
        {"op": "filter_missing"},
        {"op": "remove_columns", "columns": ["name"]},
        {"op": "rename_columns", "mapping": {"x": "value"}},
        {"op": "reorder_columns", "columns": ["pet", "value"]},
        {"op": "filter", "column": "value", "condition": ">=", "value": 0},
        {"op": "filter", "column": "colour", "condition": "not_in", "value": ["blue"]},
    ])
    out = tp.execute(table)
    assert out.columns == ["pet", "value", "id", "colour"]
    assert _rows(out) == [("cat", 2.0, 1, "red")]  # 2 NaN, 3 null, 6 blank, 4 < 0, 5 blue


def test_categorical_math_and_assemble(table) -> None:
    tp = TransformProcess.from_config([
        {"op": "filter_non_finite", "columns": ["x"]},
        {"op": "categorical_to_one_hot", "column": "colour",
         "categories": ["red", "green", "blue"]},
        {"op": "categorical_to_integer", "column": "pet"},  # learned on Spark
        {"op": "math", "columns": ["x"], "fn": "clip", "min": 0.0, "max": 5.0},
        {"op": "math", "columns": ["id"], "fn": "multiply", "value": 10},
        {"op": "assemble", "features": ["x", "colour_red", "colour_green", "colour_blue", "id"],
         "label": "pet"},
    ])
    out = tp.execute(table)
    assert out.columns == ["features", "label"] and tp.feature_shape == [5]
    assert tp.classes() == ["bird", "cat", "dog"]
    got = {int(r["features"][4]) // 10: (list(r["features"]), r["label"]) for r in out.collect()}
    assert got[1] == ([2.0, 1.0, 0.0, 0.0, 10.0], 1)
    assert got[4] == ([0.0, 0.0, 1.0, 0.0, 40.0], 1)
    assert got[5] == ([5.0, 0.0, 0.0, 1.0, 50.0], 0)
    assert 2 not in got  # NaN row filtered
    # The fitted mapping is part of the config: the replay gives identical rows.
    again = TransformProcess.from_json(tp.to_json()).execute(table)
    assert _rows(again) == _rows(out)


def test_unknown_category_is_one_error_naming_column_and_value(table) -> None:
    tp = TransformProcess.from_config([
        {"op": "categorical_to_integer", "column": "pet", "categories": ["cat", "dog"]},
    ])
    with pytest.raises(DataError, match=r"^column 'pet': value 'bird' is not one of the declared "
                                        r"categories \[cat, dog\]$"), spark_data_errors():
        tp.execute(table).collect()


def test_missing_column_names_step(table) -> None:
    tp = TransformProcess.from_config([{"op": "remove_columns", "columns": ["nope"]}])
    with pytest.raises(ConfigurationError, match=r"transform.steps\[0\] \(remove_columns\): "
                                                 r".*no column\(s\) \['nope'\]"):
        tp.execute(table)


def test_math_functions(spark) -> None:
    df = spark.createDataFrame([(1.0, [1.0, 4.0])], "v double, arr array<float>")
    for fn, kw, want in [("add", {"value": 2}, 3.0), ("subtract", {"value": 1}, 0.0),
                         ("divide", {"value": 4}, 0.25), ("log", {}, 0.0),
                         ("log1p", {}, math.log(2)), ("exp", {}, math.e), ("sqrt", {}, 1.0),
                         ("abs", {}, 1.0), ("clip", {"min": 2.0}, 2.0)]:
        tp = TransformProcess.from_config([{"op": "math", "columns": ["v", "arr"], "fn": fn, **kw}])
        row = tp.execute(df).first()
        assert row["v"] == pytest.approx(want), fn
        assert row["arr"][0] == pytest.approx(want, rel=1e-6), fn
    tp = TransformProcess.from_config([{"op": "math", "columns": ["arr"], "fn": "log"}])
    assert tp.execute(df).first()["arr"][1] == pytest.approx(math.log(4), rel=1e-6)


def test_image_steps(spark) -> None:
    rgb = np.zeros((4, 6, 3), np.float32)
    rgb[..., 0], rgb[..., 1], rgb[..., 2] = 200.0, 100.0, 50.0
    df = with_shape(spark.createDataFrame([(rgb.reshape(-1).tolist(), 1)],
                                          "image array<float>, label long"), "image", (4, 6, 3))
    tp = TransformProcess.from_config([
        {"op": "image_grayscale"}, {"op": "image_resize", "height": 2, "width": 3},
        {"op": "image_scale", "max_value": 255.0},
        {"op": "assemble", "features": ["image"], "label": "label"},
    ])
    out = tp.execute(df)
    assert tp.feature_shape == [2, 3, 1]
    x = np.array(out.first()["features"])
    luma = (0.299 * 200 + 0.587 * 100 + 0.114 * 50) / 255
    np.testing.assert_allclose(x, np.full(6, luma), rtol=1e-5)
    plain = spark.createDataFrame([([1.0], 1)], "image array<float>, label long")
    assert shape_of(plain, "image") is None
    with pytest.raises(ConfigurationError, match="not an image column"):
        TransformProcess.from_config([{"op": "image_scale"}]).execute(plain)


def test_analysis(spark, table, tmp_path: Path) -> None:
    arr = spark.createDataFrame([([1.0, 2.0], "u"), ([3.0, NAN], "v"), (None, "u")],
                                "a array<double>, s string")
    result = analyze(table, ["x", "colour", "name"], bins=4)
    x = result["columns"]["x"]
    finite = [2.0, 4.0, -1.0, 8.0, 1.0]
    assert result["rows"] == 6 and x["type"] == "numeric"
    assert (x["count"], x["missing"], x["min"], x["max"]) == (5, 1, -1.0, 8.0)
    assert x["mean"] == pytest.approx(np.mean(finite))
    assert x["std"] == pytest.approx(np.std(finite, ddof=1))
    assert x["histogram"]["counts"] == [2, 1, 1, 1] and len(x["histogram"]["edges"]) == 5
    colour = result["columns"]["colour"]
    assert colour["distinct"] == 3 and colour["top"][0] == ["red", 3]
    assert result["columns"]["name"]["missing"] == 2  # null and blank
    a = analyze(arr, bins=2)["columns"]["a"]
    assert (a["count"], a["missing"], a["min"], a["max"]) == (3, 2, 1.0, 3.0)
    assert a["mean"] == pytest.approx(2.0) and a["histogram"]["counts"] == [1, 2]
    write_analysis(result, str(tmp_path / "out" / "analysis.json"))
    assert json.loads((tmp_path / "out" / "analysis.json").read_text()) == result


def test_image_scaler(spark) -> None:
    df = spark.createDataFrame([([0.0, 255.0, 51.0],)], "features array<float>")
    norm = get_normalizer("image").fit(df)
    assert isinstance(norm, ImageScaler) and norm.count == 1
    out = np.array(norm.transform(df).first()["features"], np.float32)
    np.testing.assert_array_equal(out, norm.apply_numpy(np.array([0.0, 255.0, 51.0])))
    np.testing.assert_allclose(out, [0.0, 1.0, 0.2], rtol=1e-6)
    again = normalizer_from_config(json.loads(json.dumps(norm.to_config())))
    np.testing.assert_array_equal(again.apply_numpy(out), norm.apply_numpy(out))
    bad = spark.createDataFrame([([300.0],)], "features array<float>")
    with pytest.raises(DataError, match=r"values from 300.0 to 300.0, outside the ImageScaler"):
        ImageScaler().fit(bad)


def test_nan_policy(spark) -> None:
    df = spark.createDataFrame([([1.0, 2.0], 0), ([NAN, 1.0], 1), ([float("inf"), 0.0], 1),
                                ([3.0, 4.0], 0)], "features array<float>, label long")
    with pytest.raises(DataError, match=r"column 'features' has NaN or infinite values in 2 of "
                                        r"4 rows \(nan_policy 'fail'"):
        handle_non_finite(df, "fail")
    kept, dropped = handle_non_finite(df, "drop")
    assert dropped == 2 and sorted(r["label"] for r in kept.collect()) == [0, 0]
    with pytest.raises(ConfigurationError, match="nan_policy must be one of"):
        handle_non_finite(df, "ignore")
