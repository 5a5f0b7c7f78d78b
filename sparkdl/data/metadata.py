"""The ``_sparkdl.json`` metadata of a DataSet shard directory.

A shard directory holds plain Parquet files (columns ``features``: ``list<float32>``, the
flattened feature tensor, and ``label``: ``int64`` class index or ``list<float32>`` for
regression) plus ``_sparkdl.json``, described by :class:`ShardMetadata`.

Format version 2 adds *multi-input / multi-output* shards (DL4J's MultiDataSet): ``inputs``
and ``outputs`` list named columns (:class:`TensorSpec`: name, shape, kind, classes), each
stored as its own Parquet column named after it (inputs and regression outputs
``list<float32>``, class outputs ``int64``). For those shards the single-tensor fields
describe the *packed row* the reader works with internally (all inputs' values
concatenated in order as ``feature_shape``; all outputs' values as a ``regression`` label of
``label_shape``), and readers yield dicts keyed by input and output names. Version 1 files
are still read.

``weight_column`` (optional) names a ``float32`` Parquet column of per-row sample weights
(Keras's ``sample_weight``, Horovod's ``sample_weight_col``); readers then yield
``(x, y, sample_weight)``.

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
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
LABEL_KINDS = ("class", "regression")
INPUT_KIND = "features"


@dataclass
class TensorSpec:
    """One named input or output column of a multi-input/output shard directory.

    ``kind`` is ``features`` for inputs, ``class`` (an ``int64`` class index, ``classes``
    names them) or ``regression`` (``list<float32>`` of ``shape``) for outputs.
    """

    name: str
    shape: list[int]
    kind: str = INPUT_KIND
    classes: list[str] = field(default_factory=list)

    @property
    def size(self) -> int:
        """Values per row: 1 for a class index, else ``prod(shape)``."""
        return 1 if self.kind == "class" else math.prod(self.shape)

    @classmethod
    def from_dict(cls, data: Any, source: str) -> TensorSpec:
        if not isinstance(data, dict) or "name" not in data:
            raise DataError(f"{source}: expected an object with a 'name', got {data!r}")
        try:
            return cls(name=str(data["name"]), shape=[int(d) for d in data.get("shape", [])],
                       kind=str(data.get("kind", INPUT_KIND)),
                       classes=[str(c) for c in data.get("classes", [])])
        except (TypeError, ValueError) as exc:
            raise DataError(f"{source}: bad value in {data!r}: {exc}") from None

    def validate(self, source: str, *, output: bool) -> None:
        kinds = LABEL_KINDS if output else (INPUT_KIND,)
        if not self.name or not self.name.replace("_", "").isalnum():
            raise DataError(f"{source}: name {self.name!r} must be letters, digits and '_'")
        if self.kind not in kinds:
            raise DataError(f"{source}: {self.name}: kind must be one of {kinds}, "
                            f"got {self.kind!r}")
        if self.kind == "class":
            if not self.classes or self.shape:
                raise DataError(f"{source}: {self.name}: a class output needs 'classes' and "
                                f"an empty 'shape', got {self.classes} and {self.shape}")
        elif not self.shape or any(d <= 0 for d in self.shape) or self.classes:
            raise DataError(f"{source}: {self.name}: needs positive 'shape' dims and no "
                            f"'classes', got {self.shape} and {self.classes}")


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
    inputs: list[TensorSpec] = field(default_factory=list)
    outputs: list[TensorSpec] = field(default_factory=list)
    weight_column: str | None = None

    @property
    def multi(self) -> bool:
        """Whether the shards hold several named inputs and outputs (a MultiDataSet)."""
        return bool(self.inputs)

    @property
    def columns(self) -> list[str]:
        """The Parquet columns a reader reads, in packing order."""
        names = ([t.name for t in (*self.inputs, *self.outputs)] if self.multi
                 else ["features", "label"])
        return [*names, self.weight_column] if self.weight_column else names

    def unpack(self, x: Any, y: Any, *weight: Any) -> tuple[Any, ...]:
        """A batch as the model takes it: packed rows of multi shards split into dicts keyed
        by input and output names (class outputs as ``int64``); single shards unchanged. The
        sample weights (weighted shards) follow unchanged."""
        if not self.multi:
            return (x, y, *weight)
        return (_split(x, self.inputs), _split(y, self.outputs), *weight)

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
        if version not in READABLE_VERSIONS:
            raise DataError(
                f"{source}: unsupported format_version {version!r} "
                f"(this sparkdl reads format_version {', '.join(map(str, READABLE_VERSIONS))})"
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
                inputs=[TensorSpec.from_dict(t, f"{source}: inputs")
                        for t in data.get("inputs") or []],
                outputs=[TensorSpec.from_dict(t, f"{source}: outputs")
                         for t in data.get("outputs") or []],
                weight_column=(None if data.get("weight_column") is None
                               else str(data["weight_column"])),
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
        self._validate_multi(source)
        if self.weight_column is not None and (
            not self.weight_column or self.weight_column in self.columns[:-1]
        ):
            raise DataError(f"{source}: weight_column {self.weight_column!r} must be a column "
                            f"name other than {self.columns[:-1]}")
        total = sum(f.rows for f in self.files)
        if total != self.num_rows:
            raise DataError(f"{source}: files hold {total} rows, but num_rows is {self.num_rows}")

    def _validate_multi(self, source: str) -> None:
        if bool(self.inputs) != bool(self.outputs):
            raise DataError(f"{source}: 'inputs' and 'outputs' go together; got "
                            f"{len(self.inputs)} inputs and {len(self.outputs)} outputs")
        if not self.multi:
            return
        if self.format_version < 2:
            raise DataError(f"{source}: 'inputs' and 'outputs' need format_version 2")
        names = [t.name for t in (*self.inputs, *self.outputs)]
        if len(set(names)) != len(names):
            raise DataError(f"{source}: input and output names must be unique, got {names}")
        for spec in self.inputs:
            spec.validate(f"{source}: inputs", output=False)
        for spec in self.outputs:
            spec.validate(f"{source}: outputs", output=True)
        packed = ([sum(t.size for t in self.inputs)], [sum(t.size for t in self.outputs)])
        if (self.feature_shape, self.label_shape) != packed or self.label_kind != "regression":
            raise DataError(
                f"{source}: a multi-input/output shard's feature_shape, label_shape and "
                f"label_kind must describe the packed row: {packed[0]}, {packed[1]} and "
                f"'regression', got {self.feature_shape}, {self.label_shape} and "
                f"{self.label_kind!r}"
            )


def packed_metadata_fields(inputs: list[TensorSpec], outputs: list[TensorSpec]
                           ) -> dict[str, Any]:
    """The single-tensor fields of a multi-input/output :class:`ShardMetadata`."""
    return {"feature_shape": [sum(t.size for t in inputs)], "feature_dtype": "float32",
            "label_kind": "regression", "classes": [],
            "label_shape": [sum(t.size for t in outputs)], "inputs": list(inputs),
            "outputs": list(outputs)}


def _split(packed: Any, specs: list[TensorSpec]) -> dict[str, Any]:
    import numpy as np

    out, start = {}, 0
    rows = len(packed)
    for spec in specs:
        part = packed[:, start : start + spec.size]
        start += spec.size
        out[spec.name] = (part[:, 0].astype(np.int64) if spec.kind == "class"
                          else part.reshape(rows, *spec.shape))
    return out


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
