"""ShardMetadata round trips and read_metadata errors (no Spark)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkdl.data.files import read_metadata
from sparkdl.data.metadata import (
    FORMAT_VERSION,
    METADATA_FILE,
    ShardFile,
    ShardMetadata,
    write_metadata,
)
from sparkdl.errors import DataError


def _meta(**kw: object) -> ShardMetadata:
    base = dict(
        format_version=FORMAT_VERSION, feature_shape=[2, 3], feature_dtype="float32",
        label_kind="class", classes=["a", "b", "c"], label_shape=[], num_rows=5,
        files=[ShardFile("part-00000.parquet", 5, [3, 2])],
        normalizer={"class_name": "StandardizeNormalizer", "mean": [0.5]}, transform=None,
        extra={"seed": 1},
    )
    base.update(kw)
    return ShardMetadata(**base)  # type: ignore[arg-type]


def _shard_dir(tmp_path: Path, meta: ShardMetadata | None = None) -> Path:
    d = tmp_path / "train"
    d.mkdir()
    meta = meta or _meta()
    for f in meta.files:
        (d / f.path).write_bytes(b"")
    write_metadata(str(d), meta)
    return d


def test_round_trip() -> None:
    meta = _meta()
    again = ShardMetadata.from_json(meta.to_json())
    assert again == meta
    assert again.num_classes == 3
    assert again.feature_size == 6
    assert again.num_row_groups == 2
    assert json.loads(meta.to_json())["format_version"] == FORMAT_VERSION


def test_read_metadata(tmp_path: Path) -> None:
    d = _shard_dir(tmp_path)  # placeholder (empty) files: only the listing is checked
    assert read_metadata(str(d), verify=False) == _meta()
    assert read_metadata(f"file://{d}", verify=False) == _meta()
    with pytest.raises(DataError, match=r"part-00000\.parquet is not a readable Parquet file"):
        read_metadata(str(d))


def test_class_index_mapping(tmp_path: Path) -> None:
    meta = _meta()
    data = json.loads(meta.to_json())
    assert meta.class_index == data["class_index"] == {"a": 0, "b": 1, "c": 2}
    data["class_index"] = {"a": 1, "b": 0, "c": 2}
    with pytest.raises(DataError, match=r"'class_index' .* does not match 'classes'"):
        ShardMetadata.from_json(json.dumps(data))


def test_hdfs_without_libhdfs_is_one_clear_error(monkeypatch) -> None:
    monkeypatch.setenv("ARROW_LIBHDFS_DIR", "/nonexistent")
    monkeypatch.delenv("HADOOP_HOME", raising=False)
    with pytest.raises(DataError, match=r"hdfs:// needs libhdfs"):
        read_metadata("hdfs://namenode:8020/data/train")


def test_fsspec_filesystem(tmp_path: Path) -> None:
    fsspec = pytest.importorskip("fsspec")
    from sparkdl.data.metadata import resolve

    mem = fsspec.filesystem("memory")
    meta = _meta(files=[], num_rows=0)
    mem.pipe("/sparkdl-test/train/_sparkdl.json", meta.to_json().encode())
    try:
        fs, _ = resolve("memory://sparkdl-test/train")
        assert type(fs).__name__ == "PyFileSystem"
        assert read_metadata("memory://sparkdl-test/train") == meta
    finally:
        mem.rm("/sparkdl-test", recursive=True)


def test_missing_directory(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}/nothing/train"
    with pytest.raises(DataError, match=f"shard directory {uri} does not exist"):
        read_metadata(uri)


def test_not_a_shard_directory(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"is not a sparkdl shard directory: _sparkdl\.json is"):
        read_metadata(str(tmp_path))


def test_bad_json(tmp_path: Path) -> None:
    d = _shard_dir(tmp_path)
    (d / METADATA_FILE).write_text("{not json")
    with pytest.raises(DataError, match="invalid JSON"):
        read_metadata(str(d))


@pytest.mark.parametrize("key", ["format_version", "feature_shape", "files", "label_kind"])
def test_missing_key(tmp_path: Path, key: str) -> None:
    d = _shard_dir(tmp_path)
    data = json.loads((d / METADATA_FILE).read_text())
    del data[key]
    (d / METADATA_FILE).write_text(json.dumps(data))
    with pytest.raises(DataError, match=f"missing key '{key}'"):
        read_metadata(str(d))


def test_wrong_format_version(tmp_path: Path) -> None:
    d = _shard_dir(tmp_path)
    data = json.loads((d / METADATA_FILE).read_text())
    data["format_version"] = 99
    (d / METADATA_FILE).write_text(json.dumps(data))
    with pytest.raises(DataError, match="unsupported format_version 99"):
        read_metadata(str(d))


def test_listed_file_missing(tmp_path: Path) -> None:
    d = _shard_dir(tmp_path)
    (d / "part-00000.parquet").unlink()
    with pytest.raises(DataError, match=r"part-00000\.parquet listed in _sparkdl\.json does not"):
        read_metadata(str(d))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_rows": 7}, "files hold 5 rows, but num_rows is 7"),
        ({"files": [ShardFile("p.parquet", 5, [4])]}, "row_groups sum to 4"),
        ({"label_kind": "ordinal"}, "label_kind must be one of"),
        ({"classes": []}, "needs a non-empty 'classes'"),
        ({"feature_dtype": "float64"}, "feature_dtype must be 'float32'"),
    ],
)
def test_inconsistent_metadata(change: dict, message: str) -> None:
    with pytest.raises(DataError, match=message):
        ShardMetadata.from_json(_meta(**change).to_json())
