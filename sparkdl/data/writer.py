"""Write a Spark DataFrame as DataSet shards: plain Parquet files plus ``_sparkdl.json``.

The write is atomic: Spark writes into a hidden temporary sibling directory
(``<parent>/.<name>.tmp-<uuid>``); the driver then reads each file's Parquet footer (never the
data) to list files, rows and row groups, writes and re-reads the metadata, and only then renames
the temporary directory to ``uri``. On any failure the temporary directory is removed and nothing
appears at ``uri``.

Row groups hold exactly ``rows_per_group`` rows (the last one of a file may hold fewer), using
parquet-mr's ``parquet.block.row.count.limit``; a row group is also closed early if it reaches
``parquet.block.size`` bytes (128 MiB), so the metadata always records the actual sizes.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from sparkdl.data.files import FEATURES, LABEL, WEIGHT, read_metadata, validate_schema
from sparkdl.data.metadata import (
    FORMAT_VERSION,
    METADATA_FILE,
    ShardFile,
    ShardMetadata,
    TensorSpec,
    join,
    packed_metadata_fields,
    resolve,
    write_metadata,
)
from sparkdl.data.spark_errors import spark_data_errors
from sparkdl.data.write_progress import files_progress
from sparkdl.errors import ConfigurationError, DataError, SparkDLError
from sparkdl.logs import interactive
from sparkdl.storage import spark_uri

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

_HASH_COL = "__sparkdl_key"


def _spark_uri(uri: str, fs: pafs.FileSystem, path: str) -> str:
    """The URI Spark (Hadoop) should write to for a pyarrow (fs, path)."""
    if isinstance(fs, pafs.LocalFileSystem):
        return "file://" + path
    return spark_uri(uri)


def _sibling(uri: str, path: str, tag: str) -> tuple[str, str]:
    """A hidden sibling of ``uri``/``path``: returns (uri, path) of ``.<name>.<tag>-<uuid>``."""
    name = path.rstrip("/").rsplit("/", 1)[-1]
    suffix = f".{name}.{tag}-{uuid.uuid4().hex[:12]}"
    return _replace_last(uri, suffix), _replace_last(path, suffix)


def _replace_last(p: str, last: str) -> str:
    p = p.rstrip("/")
    head = p.rsplit("/", 1)[0] if "/" in p else ""
    return f"{head}/{last}" if head or p.startswith("/") else last


def check_replaceable(uri: str, *, marker: str = METADATA_FILE) -> None:
    """Refuse to replace ``uri`` unless sparkdl wrote it: it is absent, an empty directory, or
    a directory holding ``marker`` (``_sparkdl.json``). Raises one :class:`DataError` otherwise.
    """
    fs, path = resolve(uri)
    _check_replaceable(fs, path, uri, marker)


def _check_replaceable(fs: pafs.FileSystem, path: str, uri: str, marker: str) -> None:
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        return
    if info.type != pafs.FileType.Directory:
        raise DataError(
            f"{uri} exists and is not a directory; sparkdl replaces only directories it wrote "
            f"(holding {marker}): move or delete it yourself"
        )
    entries = fs.get_file_info(pafs.FileSelector(path, recursive=False))
    if entries and not any(
        e.base_name == marker and e.type == pafs.FileType.File for e in entries
    ):
        names = sorted(e.base_name for e in entries)
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        raise DataError(
            f"{uri} holds files sparkdl did not write ({shown}; no {marker}): refusing to "
            "replace it; move or delete it yourself, or choose another directory"
        )


def _validate_args(
    feature_shape: Sequence[int], label_kind: str, classes: Sequence[str],
    num_files: int | None, rows_per_group: int,
) -> None:
    if not feature_shape or any(int(d) <= 0 for d in feature_shape):
        raise ConfigurationError(f"feature_shape must be positive dims, got {list(feature_shape)}")
    if label_kind not in ("class", "regression"):
        raise ConfigurationError(
            f"label_kind must be 'class' or 'regression', got {label_kind!r}"
        )
    if label_kind == "class" and not classes:
        raise ConfigurationError("label_kind 'class' needs the class names in 'classes'")
    if label_kind == "regression" and classes:
        raise ConfigurationError("label_kind 'regression' takes no 'classes'")
    if len(set(classes)) != len(classes):
        raise ConfigurationError(f"classes must be unique, got {list(classes)}")
    if num_files is not None and num_files < 1:
        raise ConfigurationError(f"num_files must be >= 1, got {num_files}")
    if rows_per_group < 1:
        raise ConfigurationError(f"rows_per_group must be >= 1, got {rows_per_group}")


def _prepare(df: DataFrame, label_kind: str, weighted: bool = False) -> DataFrame:
    """Select and cast ``features`` to array<float> and ``label`` to long / array<float>
    (and ``sample_weight`` to float when ``weighted``)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    fields = {f.name: f.dataType for f in df.schema.fields}
    for name in (FEATURES, LABEL):
        if name not in fields:
            raise DataError(
                f"DataFrame has no column {name!r} (columns: {', '.join(df.columns)})"
            )
    ftype = fields[FEATURES]
    if not (isinstance(ftype, T.ArrayType) and isinstance(ftype.elementType, T.NumericType)):
        raise DataError(f"column 'features' must be array<float> or array<double>, got {ftype}")
    ltype = fields[LABEL]
    features = F.col(FEATURES).cast("array<float>").alias(FEATURES)
    if label_kind == "class":
        if not isinstance(ltype, T.NumericType):
            raise DataError(f"column 'label' must hold integer class indices, got {ltype}")
        label = F.col(LABEL)
    elif isinstance(ltype, T.NumericType):
        label = F.array(F.col(LABEL)).cast("array<float>")
    elif isinstance(ltype, T.ArrayType) and isinstance(ltype.elementType, T.NumericType):
        label = F.col(LABEL).cast("array<float>")
    else:
        raise DataError(f"column 'label' must be numeric or array<numeric>, got {ltype}")
    if not weighted:
        return df.select(features, label.alias(LABEL))
    if WEIGHT not in fields:
        raise DataError(f"DataFrame has no column {WEIGHT!r} (columns: {', '.join(df.columns)})")
    if not isinstance(fields[WEIGHT], T.NumericType):
        raise DataError(f"column {WEIGHT!r} must hold numeric sample weights, got "
                        f"{fields[WEIGHT]}")
    return df.select(features, label.alias(LABEL), F.col(WEIGHT).cast("float").alias(WEIGHT))


def _check(
    df: DataFrame, raw_label_type: Any, feature_size: int, label_kind: str, num_classes: int
) -> tuple[int, int | None]:
    """One Spark aggregation over the data; raises DataError on bad rows.

    Returns the row count and, for regression, the label length.
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    def finite(c: str) -> Any:
        return F.forall(F.col(c), lambda x: ~(F.isnan(x) | (F.abs(x) == F.lit(float("inf")))))

    def count_if(cond: Any) -> Any:
        return F.sum(F.when(cond, 1).otherwise(0))

    feats = F.col(FEATURES)
    aggs = [
        F.count(F.lit(1)).alias("rows"),
        count_if(feats.isNull()).alias("null_features"),
        count_if(feats.isNotNull() & (F.size(feats) != feature_size)).alias("bad_length"),
        F.min(F.when(F.size(feats) != feature_size, F.size(feats))).alias("bad_length_example"),
        count_if(F.exists(feats, lambda x: F.isnull(x))).alias("null_elements"),
        count_if(~finite(FEATURES)).alias("non_finite"),
        count_if(F.col(LABEL).isNull()).alias("null_labels"),
    ]
    weighted = WEIGHT in df.columns
    if weighted:
        w = F.col(WEIGHT)
        aggs.append(count_if(w.isNull() | F.isnan(w) | (F.abs(w) == F.lit(float("inf")))
                             | (w < 0)).alias("bad_weights"))
    if label_kind == "class":
        lab = F.col(LABEL)
        bad = (lab < 0) | (lab >= num_classes)
        if isinstance(raw_label_type, T.FractionalType):
            bad = bad | (lab != F.floor(lab)) | F.isnan(lab)
        aggs += [
            count_if(bad).alias("bad_labels"),
            F.min(F.when(bad, lab)).alias("bad_label_min"),
            F.max(F.when(bad, lab)).alias("bad_label_max"),
        ]
    else:
        aggs += [
            F.min(F.size(LABEL)).alias("label_len_min"),
            F.max(F.size(LABEL)).alias("label_len_max"),
            count_if(~finite(LABEL)).alias("bad_labels"),
        ]
    r = df.agg(*aggs).collect()[0].asDict()
    rows = int(r["rows"])
    if rows == 0:
        raise DataError("the DataFrame is empty: no rows to write")
    if r["null_features"]:
        raise DataError(f"column 'features' is null in {r['null_features']} of {rows} rows")
    if r["bad_length"]:
        raise DataError(
            f"column 'features': {r['bad_length']} of {rows} rows do not have "
            f"prod(feature_shape) = {feature_size} values (e.g. a row with "
            f"{r['bad_length_example']})"
        )
    if r["null_elements"]:
        raise DataError(f"column 'features' has null values in {r['null_elements']} rows")
    if r["non_finite"]:
        raise DataError(
            f"column 'features' has NaN or infinite values in {r['non_finite']} of {rows} rows"
        )
    if r["null_labels"]:
        raise DataError(f"column 'label' is null in {r['null_labels']} of {rows} rows")
    if weighted and r["bad_weights"]:
        raise DataError(f"column {WEIGHT!r}: {r['bad_weights']} of {rows} rows hold a null, "
                        "NaN, infinite or negative sample weight")
    if label_kind == "class":
        if r["bad_labels"]:
            raise DataError(
                f"column 'label': {r['bad_labels']} rows hold values outside the "
                f"{num_classes} classes [0, {num_classes}) (bad values from "
                f"{r['bad_label_min']} to {r['bad_label_max']})"
            )
        return rows, None
    if r["label_len_min"] != r["label_len_max"]:
        raise DataError(
            f"column 'label': regression targets have different lengths, from "
            f"{r['label_len_min']} to {r['label_len_max']}"
        )
    if r["bad_labels"]:
        raise DataError(
            f"column 'label' has NaN or infinite values in {r['bad_labels']} of {rows} rows"
        )
    return rows, int(r["label_len_min"])


def _collect_files(
    fs: pafs.FileSystem, tmp_path: str, tmp_uri: str, meta: ShardMetadata
) -> list[ShardFile]:
    """Rename Spark's part files to part-NNNNN.parquet, drop markers, read footers."""
    infos = fs.get_file_info(pafs.FileSelector(tmp_path, recursive=False))
    parts = sorted(
        i.path for i in infos
        if i.type == pafs.FileType.File and i.base_name.startswith("part-")
        and i.base_name.endswith(".parquet")
    )
    for i in infos:  # Spark's _SUCCESS marker and Hadoop .crc checksums
        if i.type == pafs.FileType.File and (
            i.base_name == "_SUCCESS" or i.base_name.endswith(".crc")
        ):
            fs.delete_file(i.path)
    files = []
    for src in parts:
        try:
            with fs.open_input_file(src) as stream:
                pf = pq.ParquetFile(stream)
                md = pf.metadata
                groups = [md.row_group(k).num_rows for k in range(md.num_row_groups)]
                validate_schema(pf.schema_arrow, meta, join(tmp_uri, src.rsplit("/", 1)[-1]))
        except (OSError, ValueError) as exc:
            raise DataError(f"cannot read the footer of written file {src}: {exc}") from None
        if sum(groups) == 0:
            fs.delete_file(src)
            continue
        name = f"part-{len(files):05d}.parquet"
        fs.move(src, join(tmp_path, name))
        files.append(ShardFile(path=name, rows=sum(groups), row_groups=groups))
    return files


def write_shards(
    df: DataFrame,
    uri: str,
    *,
    feature_shape: Sequence[int] = (),
    label_kind: str = "class",
    classes: Sequence[str] = (),
    num_files: int | None = None,
    rows_per_group: int = 256,
    normalizer: dict[str, Any] | None = None,
    transform: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    overwrite: bool = False,
    seed: int = 0,
    label_shape: Sequence[int] | None = None,
    num_workers: int | None = None,
    row_group_bytes: int | None = None,
    inputs: Sequence[TensorSpec | dict[str, Any]] | None = None,
    outputs: Sequence[TensorSpec | dict[str, Any]] | None = None,
    sample_weight: bool = False,
    show_progress: bool | None = None,
) -> ShardMetadata:
    """Validate ``df`` (columns ``features``, ``label``); write it atomically as shards at ``uri``.

    Rows are spread over ``num_files`` files (default: one per ``rows_per_group`` rows, at most
    Spark's default parallelism) by a hash of their content and ``seed``, and sorted by that
    hash within each file, so the output is the same for the same data and seed whatever the
    input partitioning. ``label_shape`` (regression only) defaults to the label length.
    With ``num_workers``, at least ``4 × num_workers`` files are written (and the row-group size
    is lowered if needed so every file holds row groups), so that every worker's slice is
    balanced. ``row_group_bytes`` caps a row group's size in bytes (parquet.block.size).
    ``overwrite=True`` replaces an existing ``uri`` only if sparkdl wrote it (it holds
    ``_sparkdl.json``) or it is empty; anything else is a :class:`DataError`, untouched.
    Every data page carries a CRC that the reader verifies.
    Executor-side data errors (e.g. from a CSV or image reader upstream) surface as one
    :class:`DataError`. Returns the metadata written to ``_sparkdl.json``.

    Several named inputs and outputs (a MultiDataSet): pass ``inputs`` and ``outputs``, lists
    of :class:`~sparkdl.data.metadata.TensorSpec` (or their dicts: ``name``, ``shape``,
    ``kind``, ``classes``) naming columns of ``df``, instead of ``feature_shape``,
    ``label_kind``, ``classes`` and ``label_shape``; each column is written under its name.

    ``sample_weight=True``: ``df``'s numeric column ``sample_weight`` (finite, >= 0) is
    written too, and ``_sparkdl.json`` names it (``weight_column``); single-input shards only.

    ``show_progress``: draw a bar of the files written while a write runs longer than 2 s
    (:mod:`sparkdl.data.write_progress`); ``None``: in a terminal or a notebook.
    """
    from pyspark.sql import functions as F

    from sparkdl.data.multi import as_specs, prepare_multi

    multi = inputs is not None or outputs is not None
    classes = [str(c) for c in classes]
    if multi and sample_weight:
        raise ConfigurationError("sample_weight is not supported for multi-input/output "
                                 "shards yet")
    if multi:
        inputs, outputs = as_specs(inputs or [], output=False), as_specs(outputs or [],
                                                                         output=True)
        _validate_args([1], "regression", [], num_files, rows_per_group)
    else:
        _validate_args(feature_shape, label_kind, classes, num_files, rows_per_group)
    feature_shape = [int(d) for d in feature_shape]
    feature_size = math.prod(feature_shape)

    fs, path = resolve(uri)
    existing = fs.get_file_info(path)
    if existing.type != pafs.FileType.NotFound and not overwrite:
        raise DataError(f"{uri} already exists; pass overwrite=True to replace it")
    if overwrite:
        _check_replaceable(fs, path, uri, METADATA_FILE)

    if num_workers is not None and num_workers < 1:
        raise ConfigurationError(f"num_workers must be >= 1, got {num_workers}")
    if row_group_bytes is not None and row_group_bytes < 1024:
        raise ConfigurationError(f"row_group_bytes must be >= 1024, got {row_group_bytes}")
    raw_label_type = next((f.dataType for f in df.schema.fields if f.name == LABEL), None)
    if multi:
        with spark_data_errors():
            data, rows = prepare_multi(df, inputs, outputs)
        packed = packed_metadata_fields(inputs, outputs)
    else:
        data = _prepare(df, label_kind, sample_weight)
        with spark_data_errors():
            rows, label_len = _check(data, raw_label_type, feature_size, label_kind,
                                     len(classes))
        packed = {}
    if multi:
        label_shape = []  # the packed row's, from ``packed``
    elif label_kind == "class":
        data = data.withColumn(LABEL, F.col(LABEL).cast("long"))
        label_shape = []
    else:
        label_shape = [int(d) for d in label_shape] if label_shape else [label_len]
        if math.prod(label_shape) != label_len:
            raise ConfigurationError(
                f"label_shape {label_shape} does not match the label length {label_len}"
            )
    if num_files is None:
        from sparkdl.session import default_parallelism

        parallelism = default_parallelism(df.sparkSession)
        num_files = max(1, min(parallelism, math.ceil(rows / rows_per_group)))
    if num_workers is not None:
        num_files = max(num_files, 4 * num_workers)
        # Several row groups per file, so the planner can balance workers to within a group.
        rows_per_group = max(1, min(rows_per_group, rows // (2 * num_files) or 1))

    tmp_uri, tmp_path = _sibling(uri, path, "tmp")
    fields: dict[str, Any] = {
        "feature_shape": feature_shape, "feature_dtype": "float32", "label_kind": label_kind,
        "classes": classes, "label_shape": label_shape, **packed,
    }
    meta = ShardMetadata(
        format_version=FORMAT_VERSION, num_rows=rows, files=[], normalizer=normalizer,
        transform=transform, extra=dict(extra or {}),
        weight_column=WEIGHT if sample_weight else None, **fields,
    )
    try:
        key = F.xxhash64(F.lit(int(seed)), *(F.col(c) for c in meta.columns))
        shuffled = (
            data.withColumn(_HASH_COL, key)
            .repartition(num_files, F.col(_HASH_COL))
            .sortWithinPartitions(_HASH_COL, meta.columns[0])
            .drop(_HASH_COL)
        )
        writer = (
            shuffled.write.mode("error")  # "errorifexists" (Spark Connect knows only "error")
            .option("parquet.block.row.count.limit", int(rows_per_group))
            .option("parquet.page.write-checksum.enabled", "true")  # the reader verifies them
        )
        if row_group_bytes is not None:
            writer = writer.option("parquet.block.size", int(row_group_bytes))
        show = interactive() if show_progress is None else show_progress
        with spark_data_errors(), files_progress(fs, tmp_path, num_files, f"writing {uri}",
                                                 show=show):
            writer.parquet(_spark_uri(tmp_uri, fs, tmp_path))
        meta.files = _collect_files(fs, tmp_path, tmp_uri, meta)
        written = sum(f.rows for f in meta.files)
        if written != rows:
            raise DataError(f"wrote {written} rows to {uri}, but the DataFrame has {rows}")
        write_metadata(tmp_uri, meta)
        read_metadata(tmp_uri)
        _publish(fs, path, uri, tmp_path, overwrite=overwrite)
    except BaseException as exc:
        if fs.get_file_info(tmp_path).type != pafs.FileType.NotFound:
            fs.delete_dir(tmp_path)
        if isinstance(exc, Exception) and not isinstance(exc, SparkDLError):
            raise DataError(f"writing shards to {uri} failed: {exc}") from exc
        raise
    return meta


def _publish(fs: pafs.FileSystem, path: str, uri: str, tmp_path: str, *, overwrite: bool) -> None:
    """Rename the finished temporary directory to ``path``, replacing an old one if allowed
    (only a directory sparkdl wrote, or an empty one)."""
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        fs.move(tmp_path, path)
        return
    if not overwrite:
        raise DataError(f"{uri} appeared while the shards were being written")
    _check_replaceable(fs, path, uri, METADATA_FILE)
    _, old_path = _sibling(uri, path, "old")
    fs.move(path, old_path)
    try:
        fs.move(tmp_path, path)
    except BaseException:
        fs.move(old_path, path)
        raise
    fs.delete_dir(old_path)
