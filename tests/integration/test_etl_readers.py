"""Record readers on a real local Spark: CSV, image folders, IDX, Parquet, samples."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _etl_fixtures import digits_28, write_image_folder, write_mnist

from sparkdl.errors import ConfigurationError, DataError
from sparkdl.etl.readers import (
    read_csv,
    read_idx,
    read_images,
    read_parquet,
    read_sample,
    read_source,
    shape_of,
)

pytestmark = pytest.mark.spark


def test_csv_header_delimiter_quoting_types(spark, tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text('id;name;score\n1;"semi;colon";2.5\n2;plain;\n3;"say ""hi""";-1e3\n')
    df = read_csv(spark, str(path), columns="id int, name string, score double", header=True,
                  delimiter=";", escape='"')
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
        ("id", "int"), ("name", "string"), ("score", "double")]
    rows = sorted(tuple(r) for r in df.collect())
    assert rows == [(1, "semi;colon", 2.5), (2, "plain", None), (3, 'say "hi"', -1000.0)]


def test_csv_without_header_and_column_forms(spark, tmp_path: Path) -> None:
    path = tmp_path / "b.csv"
    path.write_text("1,x\n2,y\n")
    for columns in ({"n": "long", "s": "string"}, [["n", "long"], ["s", "string"]],
                    [{"name": "n", "type": "long"}, {"name": "s", "type": "string"}]):
        df = read_csv(spark, f"file://{path}", columns=columns)
        assert sorted(tuple(r) for r in df.collect()) == [(1, "x"), (2, "y")]
    with pytest.raises(ConfigurationError, match="column 'n': unknown type 'decimal'"):
        read_csv(spark, str(path), columns={"n": "decimal"})


@pytest.mark.parametrize(
    ("line", "columns"),
    [("3,4.5", ["a"]), ("3,4.5,z,extra", ["a"]), ("3,notanumber,z", ["a", "b", "c"])],
)
def test_csv_malformed_record_names_file_and_record(
    spark, tmp_path: Path, line: str, columns: list[str]
) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(f"a,b,c\n1,2.5,x\n{line}\n")
    df = read_csv(spark, str(path), columns="a int, b double, c string", header=True)
    from sparkdl.data.spark_errors import spark_data_errors

    with pytest.raises(DataError) as info, spark_data_errors():
        # A wrong field count is found even when only column 'a' is read.
        df.select(*columns).collect()
    message = str(info.value)
    assert message.startswith(f"CSV file file://{path}: malformed record (expected 3 fields")
    assert message.endswith(line) and "\n" not in message


def test_csv_missing_path(spark, tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"cannot read CSV .*nothing\.csv"):
        read_csv(spark, str(tmp_path / "nothing.csv"), columns="a int")


def test_image_folder(spark, tmp_path: Path) -> None:
    colours = write_image_folder(tmp_path / "img", per_class=4)
    df = read_images(spark, str(tmp_path / "img"), height=6, width=8, channels=3)
    assert shape_of(df, "image") == [6, 8, 3]
    rows = df.collect()
    assert len(rows) == 12 and {r["label"] for r in rows} == set(colours)
    assert {Path(r["path"]).suffix for r in rows} == {".png", ".jpg"}
    for r in rows:
        x = np.array(r["image"], np.float32).reshape(6, 8, 3)
        np.testing.assert_allclose(x.mean((0, 1)), colours[r["label"]][0, 0], atol=6)
    gray = read_images(spark, str(tmp_path / "img"), height=4, width=4, channels=1)
    assert shape_of(gray, "image") == [4, 4, 1] and len(gray.first()["image"]) == 16


def test_image_that_does_not_decode(spark, tmp_path: Path) -> None:
    write_image_folder(tmp_path / "img", per_class=2)
    bad = tmp_path / "img" / "red" / "broken.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n this is not an image")
    df = read_images(spark, str(tmp_path / "img"), height=4, width=4)
    from sparkdl.data.spark_errors import spark_data_errors

    with pytest.raises(DataError, match=r"^image file file:.*/red/broken\.png cannot be decoded"), \
            spark_data_errors():
        df.collect()
    with pytest.raises(ConfigurationError, match="channels must be 1"):
        read_images(spark, str(tmp_path / "img"), height=4, width=4, channels=2)


@pytest.mark.parametrize("gz", [False, True])
def test_idx(spark, tmp_path: Path, gz: bool) -> None:
    root = write_mnist(tmp_path / "mnist", n_train=50, n_test=10, gz=gz)
    sfx = ".gz" if gz else ""
    df = read_idx(spark, str(root / f"train-images-idx3-ubyte{sfx}"),
                  f"file://{root}/train-labels-idx1-ubyte{sfx}", chunk_rows=16)
    assert shape_of(df, "image") == [28, 28, 1]
    assert df.rdd.getNumPartitions() >= 2 if not gz else True
    rows = sorted(df.collect(), key=lambda r: r["index"])
    x, y = digits_28(50)
    assert [r["index"] for r in rows] == list(range(50))
    np.testing.assert_array_equal(np.array([r["image"] for r in rows]), x.reshape(50, -1))
    assert [r["label"] for r in rows] == y.tolist()


def test_idx_count_mismatch(spark, tmp_path: Path) -> None:
    root = write_mnist(tmp_path / "mnist", n_train=20, n_test=10)
    with pytest.raises(DataError, match=r"IDX files disagree: .*t10k-images.* has 10 records, "
                                        r".*train-labels-idx1-ubyte has 20"):
        read_idx(spark, str(root / "t10k-images-idx3-ubyte"),
                 str(root / "train-labels-idx1-ubyte"))


def test_parquet_and_samples(spark, tmp_path: Path) -> None:
    iris = read_sample(spark, "iris")
    assert iris.count() == 150 and iris.columns == ["features", "label"]
    iris.write.parquet(str(tmp_path / "p"))
    again = read_parquet(spark, f"file://{tmp_path}/p", columns=["label"])
    assert again.columns == ["label"] and again.count() == 150
    via = read_source(spark, {"format": "sample", "name": "digits"})
    assert via.count() == 1797
    with pytest.raises(DataError, match="has no columns"):
        read_parquet(spark, str(tmp_path / "p"), columns=["nope"])
    with pytest.raises(DataError, match="cannot read Parquet"):
        read_parquet(spark, str(tmp_path / "missing"))
    with pytest.raises(ConfigurationError, match=r"source.format: unknown format 'xls'"):
        read_source(spark, {"format": "xls"})
