"""The ``_sparkdl.json`` metadata of a DataSet shard directory.

A shard directory holds plain Parquet files (columns ``features``: ``list<float32>``, the
flattened feature tensor, and ``label``: ``int64`` class index or ``list<float32>`` for
regression) plus ``_sparkdl.json``, described by :class:`ShardMetadata`.

This module runs inside training workers: it imports pyarrow only, never Spark or TensorFlow.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow.fs as pafs

from sparkdl.errors import DataError
from sparkdl.storage import resolve  # also imported from here by readers and writers

METADATA_FILE = "_sparkdl.json"
FORMAT_VERSION = 1
LABEL_KINDS = ("class", "regression")


@dataclass
class ShardFile:
    """One Parquet file of a shard directory."""

    path: str  # relative to the shard directory
    rows: int
    row_groups: list[int]  # rows per row group, in file order


@dataclass
class ShardMetadata:
    """Everything a reader needs to know about a shard directory without opening its files."""

    format_version: int
    feature_shape: list[int]
    feature_dtype: str
    label_kind: str
    classes: list[str]
    label_shape: list[int]
    num_rows: int
    files: list[ShardFile]
    normalizer: dict[str, Any] | None = None
    transform: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        """Number of classes (0 for regression)."""
        return len(self.classes)

    @property
    def feature_size(self) -> int:
        """Number of float32 values per row in the flattened ``features`` column."""
        return math.prod(self.feature_shape)

    @property
    def label_size(self) -> int:
        """Number of float32 values per row of a regression ``label`` column."""
        return math.prod(self.label_shape)

    @property
    def num_row_groups(self) -> int:
        """Total number of row groups over all files."""
        return sum(len(f.row_groups) for f in self.files)

    @property
    def class_index(self) -> dict[str, int]:
        """The class name → label index mapping (empty for regression)."""
        return {name: i for i, name in enumerate(self.classes)}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (with the derived ``class_index`` mapping, for readers' benefit)."""
        return {**asdict(self), "class_index": self.class_index}

    def to_json(self) -> str:
        """Serialize to the ``_sparkdl.json`` text."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "metadata") -> ShardMetadata:
        """Build from a dict, validating keys, types and consistency."""
        if not isinstance(data, dict):
            raise DataError(f"{source}: expected a JSON object, got {type(data).__name__}")
        if "format_version" not in data:
            raise DataError(f"{source}: missing key 'format_version'")
        version = data["format_version"]
        if version != FORMAT_VERSION:
            raise DataError(
                f"{source}: unsupported format_version {version!r} "
                f"(this sparkdl reads format_version {FORMAT_VERSION})"
            )
        required = (
            "feature_shape", "feature_dtype", "label_kind", "classes",
            "label_shape", "num_rows", "files",
        )
        for key in required:
            if key not in data:
                raise DataError(f"{source}: missing key {key!r}")
        try:
            files = [
                ShardFile(path=str(f["path"]), rows=int(f["rows"]),
                          row_groups=[int(n) for n in f["row_groups"]])
                for f in data["files"]
            ]
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"{source}: bad entry in 'files': {exc!r}") from None
        try:
            meta = cls(
                format_version=int(version),
                feature_shape=[int(d) for d in data["feature_shape"]],
                feature_dtype=str(data["feature_dtype"]),
                label_kind=str(data["label_kind"]),
                classes=[str(c) for c in data["classes"]],
                label_shape=[int(d) for d in data["label_shape"]],
                num_rows=int(data["num_rows"]),
                files=files,
                normalizer=data.get("normalizer"),
                transform=data.get("transform"),
                extra=dict(data.get("extra") or {}),
            )
        except (TypeError, ValueError) as exc:
            raise DataError(f"{source}: bad value: {exc}") from None
        meta.validate(source=source)
        if "class_index" in data and data["class_index"] != meta.class_index:
            raise DataError(
                f"{source}: 'class_index' {data['class_index']} does not match 'classes' "
                f"{meta.classes}"
            )
        return meta

    @classmethod
    def from_json(cls, text: str, *, source: str = "metadata") -> ShardMetadata:
        """Parse ``_sparkdl.json`` text."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{source}: invalid JSON: {exc}") from None
        return cls.from_dict(data, source=source)

    def validate(self, *, source: str = "metadata") -> None:
        """Raise :class:`DataError` if the fields are inconsistent."""
        if self.feature_dtype != "float32":
            raise DataError(
                f"{source}: feature_dtype must be 'float32', got {self.feature_dtype!r}"
            )
        if not self.feature_shape or any(d <= 0 for d in self.feature_shape):
            raise DataError(
                f"{source}: feature_shape must be positive dims, got {self.feature_shape}"
            )
        if self.label_kind not in LABEL_KINDS:
            raise DataError(
                f"{source}: label_kind must be one of {LABEL_KINDS}, got {self.label_kind!r}"
            )
        if self.label_kind == "class" and not self.classes:
            raise DataError(f"{source}: label_kind 'class' needs a non-empty 'classes' list")
        if self.label_kind == "regression" and self.classes:
            raise DataError(f"{source}: label_kind 'regression' must have empty 'classes'")
        if any(d <= 0 for d in self.label_shape):
            raise DataError(f"{source}: label_shape must be positive dims, got {self.label_shape}")
        for f in self.files:
            if sum(f.row_groups) != f.rows:
                raise DataError(
                    f"{source}: file {f.path}: row_groups sum to {sum(f.row_groups)}, "
                    f"but rows is {f.rows}"
                )
        total = sum(f.rows for f in self.files)
        if total != self.num_rows:
            raise DataError(f"{source}: files hold {total} rows, but num_rows is {self.num_rows}")


def join(base: str, *parts: str) -> str:
    """Join path components with '/' (pyarrow filesystem paths always use '/')."""
    out = base.rstrip("/")
    for p in parts:
        out = f"{out}/{p.lstrip('/')}"
    return out


def load_metadata(uri: str) -> ShardMetadata:
    """Read and validate ``_sparkdl.json`` of the shard directory at ``uri`` and check that
    every listed file exists (``sparkdl.data.files.read_metadata`` also checks the footers).
    Raises :class:`DataError` naming the file on any problem."""
    fs, path = resolve(uri)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise DataError(f"shard directory {uri} does not exist")
    if info.type != pafs.FileType.Directory:
        raise DataError(f"shard directory {uri} is not a directory")
    meta_path = join(path, METADATA_FILE)
    if fs.get_file_info(meta_path).type != pafs.FileType.File:
        raise DataError(f"{uri} is not a sparkdl shard directory: {METADATA_FILE} is missing")
    try:
        with fs.open_input_stream(meta_path) as stream:
            text = stream.read().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read {join(uri, METADATA_FILE)}: {exc}") from None
    meta = ShardMetadata.from_json(text, source=join(uri, METADATA_FILE))
    infos = fs.get_file_info([join(path, f.path) for f in meta.files])
    for f, finfo in zip(meta.files, infos, strict=True):
        if finfo.type != pafs.FileType.File:
            raise DataError(
                f"shard file {join(uri, f.path)} listed in {METADATA_FILE} does not exist"
            )
    return meta


def write_metadata(uri: str, metadata: ShardMetadata) -> None:
    """Write ``_sparkdl.json`` into the directory at ``uri`` (used by the writer)."""
    metadata.validate(source=join(uri, METADATA_FILE))
    fs, path = resolve(uri)
    with fs.open_output_stream(join(path, METADATA_FILE)) as stream:
        stream.write(metadata.to_json().encode("utf-8"))
