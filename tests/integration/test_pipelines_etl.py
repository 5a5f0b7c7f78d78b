"""The iris, csv, mnist and images pipelines on a real local Spark (plus one job run)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _etl_fixtures import digits_28, write_image_folder, write_mnist

from sparkdl.data import read_all, read_metadata
from sparkdl.errors import ConfigurationError
from sparkdl.etl.normalizers import normalizer_from_config
from sparkdl.etl.transform import TransformProcess
from sparkdl.pipelines import PIPELINES, get_pipeline

pytestmark = pytest.mark.spark
REPO = Path(__file__).resolve().parents[2]


def test_registry_and_confs() -> None:
    assert {"digits", "iris", "mnist", "csv", "images"} <= set(PIPELINES)
    from sparkdl.config import load_config

    for name in ("iris", "mnist", "csv", "images"):
        config = load_config(REPO / "conf" / f"{name}.yaml")
        assert config.data.pipeline == name
        assert callable(get_pipeline(name))


def test_iris_pipeline(spark, tmp_path: Path) -> None:
    out = f"file://{tmp_path}/iris"
    result = get_pipeline("iris")(spark, out, num_workers=2, analysis=True)
    assert result["train_rows"] + result["test_rows"] == 150
    meta = read_metadata(result["train"])
    assert meta.classes == ["setosa", "versicolor", "virginica"] and meta.feature_shape == [4]
    assert meta.class_index == {"setosa": 0, "versicolor": 1, "virginica": 2}
    assert len(meta.files) >= 8  # num_workers x 4
    tp = TransformProcess.from_config(meta.transform)
    assert tp.classes() == meta.classes and meta.extra["pipeline"] == "iris"
    x, y = read_all(result["train"])
    assert np.abs(x.mean(0)).max() < 1e-4 and set(np.unique(y)) == {0, 1, 2}
    analysis = json.loads((tmp_path / "iris" / "analysis.json").read_text())
    assert analysis["rows"] == 150 and analysis["columns"]["species"]["distinct"] == 3
    assert analysis["columns"]["petal_length"]["min"] == pytest.approx(1.0)


def test_csv_pipeline_learns_classes_and_validates_options(spark, tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    rng = np.random.default_rng(0)
    lines = [f"{a:.3f}|{b:.3f}|{'yes' if a > b else 'no'}" for a, b in rng.normal(size=(120, 2))]
    path.write_text("\n".join(lines) + "\n")
    options = dict(path=str(path), delimiter="|", columns="a double, b double, y string",
                   transform=[{"op": "categorical_to_integer", "column": "y"},
                              {"op": "assemble", "features": ["a", "b"], "label": "y"}],
                   normalizer="minmax", rows_per_group=8)
    result = get_pipeline("csv")(spark, f"file://{tmp_path}/o", **options)
    meta = read_metadata(result["test"])
    assert meta.classes == ["no", "yes"] and meta.normalizer["class_name"] == "MinMaxNormalizer"
    for key, value, message in [
        ("bogus", 1, r"data.options.bogus: unknown option for the csv pipeline"),
        ("nan_policy", "ignore", r"data.options.nan_policy: must be one of"),
        ("num_workers", "two", r"data.options.num_workers: expected int"),
        ("transform", [{"op": "assemble", "features": []}, {"op": "nope"}],
         r"data.options.transform.steps\[1\].op: unknown step 'nope'"),
        ("test_fraction", 1.0, r"data.options.test_fraction: must be in \(0, 1\)"),
    ]:
        with pytest.raises(ConfigurationError, match=message):
            get_pipeline("csv")(spark, f"file://{tmp_path}/bad", **{**options, key: value})
    with pytest.raises(ConfigurationError, match=r"data\.options\.path"):
        get_pipeline("csv")(spark, f"file://{tmp_path}/bad")
    assert not (tmp_path / "bad").exists()


def test_mnist_pipeline_gz(spark, tmp_path: Path) -> None:
    root = write_mnist(tmp_path / "idx", n_train=120, n_test=40, gz=True)
    result = get_pipeline("mnist")(spark, f"file://{tmp_path}/m", path=str(root),
                                   num_workers=2, rows_per_group=16, chunk_rows=32)
    meta = read_metadata(result["train"])
    assert meta.feature_shape == [28, 28, 1] and meta.num_rows == 120 and len(meta.files) >= 8
    assert meta.normalizer["class_name"] == "ImageScaler"
    x, y = read_all(result["test"])
    images, labels = digits_28(160)
    assert x.shape == (40, 28, 28, 1) and x.max() <= 1.0
    order = np.lexsort(x.reshape(40, -1).T)
    expected = normalizer_from_config(meta.normalizer).apply_numpy(
        images[120:].reshape(40, 28, 28, 1).astype(np.float32))
    exp_order = np.lexsort(expected.reshape(40, -1).T)
    np.testing.assert_array_equal(x[order], expected[exp_order])
    np.testing.assert_array_equal(y[order], labels[120:][exp_order])
    with pytest.raises(Exception, match=r"t10k-images-idx3-ubyte\[\.gz\] \(test_images\) does "
                                        r"not exist"):
        (root / "t10k-images-idx3-ubyte.gz").unlink()
        get_pipeline("mnist")(spark, f"file://{tmp_path}/m2", path=str(root))


def test_images_pipeline(spark, tmp_path: Path) -> None:
    write_image_folder(tmp_path / "img", per_class=6)
    result = get_pipeline("images")(
        spark, f"file://{tmp_path}/o", path=str(tmp_path / "img"), height=8, width=8,
        channels=3, transform=[{"op": "image_grayscale"}], test_fraction=0.3, rows_per_group=4)
    meta = read_metadata(result["train"])
    assert meta.classes == ["blue", "green", "red"] and meta.feature_shape == [8, 8, 1]
    assert result["train_rows"] + result["test_rows"] == 18
    x, y = read_all(result["train"])
    assert x.min() >= 0.0 and x.max() <= 1.0
    red = x[y == 2].mean()
    assert red == pytest.approx(0.299 * 250 / 255 + (0.587 + 0.114) * 10 / 255, abs=0.03)


@pytest.mark.slow  # default suite under 20 minutes
def test_samples_command_feeds_every_conf(spark, tmp_path: Path) -> None:
    """``sparkdl samples DIR`` writes inputs for the mnist, csv, diabetes and images confs, and each
    conf's ETL stage runs on them as a user would run it."""
    from sparkdl.cli import main
    from sparkdl.config import load_config
    from sparkdl.stages import run_etl

    assert main(["samples", str(tmp_path / "data")]) == 0
    expected = {"mnist": (10, [28, 28, 1]), "csv": (3, [4]), "images": (10, [28, 28, 1]),
                "diabetes": (0, [10])}
    paths = {"mnist": "mnist", "csv": "records.csv", "images": "images",
             "diabetes": "diabetes.csv"}
    for name, (classes, shape) in expected.items():
        config = load_config(REPO / "conf" / f"{name}.yaml", [
            f"data.options.path={tmp_path / 'data' / paths[name]}",
            f"data.dir={tmp_path / 'out' / name}",
        ])
        result = run_etl(config, spark)
        meta = read_metadata(result["train"])
        assert meta.num_classes == classes and meta.feature_shape == shape, name
        training = config.training  # enough rows for the conf's own training run
        assert result["train_rows"] >= training.num_workers * training.batch_size_per_worker, name


def test_data_sample_weight_column_writes_the_csv_rows_weights(spark, tmp_path: Path) -> None:
    from sparkdl.config import load_config
    from sparkdl.stages import run_etl

    path = tmp_path / "w.csv"
    rng = np.random.default_rng(1)
    rows = rng.normal(size=(80, 4))
    path.write_text("".join(f"{a:.3f},{b:.3f},{c:.3f},{d:.3f},{'yes' if a > b else 'no'},"
                            f"{1 + (a > b)}\n" for a, b, c, d in rows))
    overrides = [f"data.options.path={path}", f"data.dir={tmp_path / 'out'}",
                 "data.options.header=false", "data.options.rows_per_group=8",
                 "data.options.columns={x0: double, x1: double, x2: double, x3: double, "
                 "label: string, w: double}", "data.sample_weight_column=w"]
    result = run_etl(load_config(REPO / "conf" / "csv.yaml", overrides), spark)
    meta = read_metadata(result["train"])
    assert meta.weight_column == "sample_weight"
    _, y, w = read_all(result["train"])
    assert sorted(set(w.tolist())) == [1.0, 2.0]
    assert (w == 2.0).tolist() == (y == meta.classes.index("yes")).tolist()
    config = load_config(REPO / "conf" / "digits.yaml",
                         [f"data.dir={tmp_path / 'd'}", "data.sample_weight_column=w"])
    with pytest.raises(ConfigurationError, match=r"data\.sample_weight_column: the digits "
                       "pipeline writes no sample weights"):
        run_etl(config, spark)
