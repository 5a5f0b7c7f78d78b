"""Shard files: a Parquet shard opened and checked against ``_sparkdl.json``, decoded to numpy.

:func:`read_metadata` reads the metadata and (by default) checks every listed file's footer
against it; the reader and the writer use the same checks.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sparkdl.data.metadata import ShardFile, ShardMetadata, join, load_metadata, resolve
from sparkdl.errors import DataError

FEATURES = "features"
LABEL = "label"
WEIGHT = "sample_weight"  # the sample-weight column of weighted shards written by sparkdl
#: At most this many footers are read at once by :func:`verify_files`.
_FOOTER_THREADS = 8


def read_metadata(uri: str, *, verify: bool = True) -> ShardMetadata:
    """Read and validate ``_sparkdl.json`` of the shard directory at ``uri``.

    Checks that every listed file exists and, with ``verify`` (the default), that every file's
    Parquet footer matches the metadata: readable, the expected columns and types, the same
    schema in every file, the listed row groups. Only footers are read, never data.
    Raises :class:`DataError` naming the file on any problem.
    """
    metadata = load_metadata(uri)
    if verify:
        verify_files(uri, metadata)
    return metadata




def _list_to_numpy(
    column: pa.ChunkedArray | pa.Array, size: int, *, name: str, source: str, first_row: int
) -> np.ndarray:
    """Convert a list<float> column to a (rows, size) float32 array without per-element Python."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    n = len(arr)
    if arr.null_count:
        bad = int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
        raise DataError(f"{source}: column {name!r} is null at row {first_row + bad}")
    if pa.types.is_fixed_size_list(arr.type):
        if arr.type.list_size != size:
            raise DataError(
                f"{source}: column {name!r} has fixed length {arr.type.list_size}, "
                f"expected {size}"
            )
        values = arr.flatten()
    else:
        offsets = arr.offsets.to_numpy()
        lengths = np.diff(offsets)
        wrong = np.flatnonzero(lengths != size)
        if wrong.size:
            r = int(wrong[0])
            raise DataError(
                f"{source}: column {name!r} row {first_row + r} has {int(lengths[r])} values, "
                f"expected {size} ({wrong.size} rows of this row group have the wrong length)"
            )
        values = arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    out = values.to_numpy(zero_copy_only=False)
    if out.dtype != np.float32:
        out = out.astype(np.float32)
    return out.reshape(n, size)


def _is_float_list(t: pa.DataType) -> bool:
    return (
        (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))
        and pa.types.is_floating(t.value_type)
    )


def validate_schema(schema: pa.Schema, metadata: ShardMetadata, source: str) -> None:
    weight = metadata.weight_column
    if weight is not None:
        if schema.get_field_index(weight) < 0:
            raise DataError(f"{source}: missing sample-weight column {weight!r} (columns: "
                            f"{', '.join(schema.names)})")
        if not pa.types.is_floating(schema.field(weight).type):
            raise DataError(f"{source}: column {weight!r} must be float sample weights, got "
                            f"{schema.field(weight).type}")
    if metadata.multi:
        _validate_multi_schema(schema, metadata, source)
        return
    for name in (FEATURES, LABEL):
        if schema.get_field_index(name) < 0:
            raise DataError(
                f"{source}: missing column {name!r} (columns: {', '.join(schema.names)})"
            )
    ftype = schema.field(FEATURES).type
    if not _is_float_list(ftype):
        raise DataError(f"{source}: column 'features' must be list<float32>, got {ftype}")
    ltype = schema.field(LABEL).type
    if metadata.label_kind == "class":
        if not pa.types.is_integer(ltype):
            raise DataError(f"{source}: column 'label' must be int64 class indices, got {ltype}")
    elif not _is_float_list(ltype):
        raise DataError(
            f"{source}: column 'label' must be list<float32> for regression, got {ltype}"
        )


def _validate_multi_schema(schema: pa.Schema, metadata: ShardMetadata, source: str) -> None:
    for spec in (*metadata.inputs, *metadata.outputs):
        if schema.get_field_index(spec.name) < 0:
            raise DataError(
                f"{source}: missing column {spec.name!r} (columns: {', '.join(schema.names)})"
            )
        got = schema.field(spec.name).type
        if spec.kind == "class" and not pa.types.is_integer(got):
            raise DataError(f"{source}: column {spec.name!r} must be int64 class indices, "
                            f"got {got}")
        if spec.kind != "class" and not _is_float_list(got):
            raise DataError(f"{source}: column {spec.name!r} must be list<float32>, got {got}")


def listed_file(uri: str, metadata: ShardMetadata, path: str) -> ShardFile:
    """The metadata entry of shard file ``path``; an error naming the file if it has none."""
    entry = next((f for f in metadata.files if f.path == path), None)
    if entry is None:
        raise DataError(f"{join(uri, path)} is not listed in the shard metadata")
    return entry


class ShardFileHandle:
    """An open Parquet file, validated against the metadata when first opened.

    Every data page's CRC (written by the shard writer) is verified as it is read, so
    corrupted bytes are a :class:`DataError` naming the file instead of different values.
    With ``check_values`` (the default) every row group read is also checked for labels
    outside the declared classes and for NaN or infinite values (a sum per row group; for
    shards not written by sparkdl's ETL, which checks them before writing).
    """

    def __init__(
        self, uri: str, path: str, metadata: ShardMetadata, *, check_values: bool = True
    ) -> None:
        self.source = join(uri, path)
        self.check_values = check_values
        fs, base = resolve(uri)
        entry = listed_file(uri, metadata, path)
        try:
            self._stream = fs.open_input_file(join(base, path))
        except (OSError, pa.ArrowException) as exc:
            raise DataError(f"cannot open shard file {self.source}: {exc}") from None
        try:
            self._file = pq.ParquetFile(self._stream, page_checksum_verification=True)
        except (OSError, pa.ArrowException) as exc:
            self._stream.close()
            raise DataError(
                f"shard file {self.source} is not a readable Parquet file: {exc}"
            ) from None
        validate_schema(self._file.schema_arrow, metadata, self.source)
        md = self._file.metadata
        groups = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
        if groups != entry.row_groups:
            raise DataError(
                f"{self.source}: row groups {groups} differ from the metadata "
                f"{entry.row_groups}; the file changed after the shards were written"
            )
        self.starts = np.concatenate([[0], np.cumsum(groups)]).astype(np.int64).tolist()
        self.metadata = metadata

    def read_group(self, index: int) -> tuple[np.ndarray, ...]:
        try:
            table = self._file.read_row_group(
                index, columns=self.metadata.columns, use_threads=False  # decoded in parallel
            )
        except (OSError, pa.ArrowException) as exc:
            raise DataError(
                f"cannot read row group {index} of shard file {self.source} (corrupt or "
                f"changed bytes): {exc}"
            ) from None
        return _convert(table, self.metadata, self.source, self.starts[index],
                        check=self.check_values)

    def read_all(self) -> tuple[np.ndarray, ...]:
        try:
            table = self._file.read(columns=self.metadata.columns)
        except (OSError, pa.ArrowException) as exc:
            raise DataError(
                f"cannot read shard file {self.source} (corrupt or changed bytes): {exc}"
            ) from None
        return _convert(table, self.metadata, self.source, 0, check=self.check_values)

    def close(self) -> None:
        self._file.close()
        self._stream.close()


def verify_files(uri: str, metadata: ShardMetadata) -> None:
    """Check every listed file's footer against the metadata, before any data is read.

    Raises :class:`DataError` naming the file for an unreadable (corrupt) file, a missing
    column, a wrong type, row groups that differ from the metadata, or schema drift (a file
    whose ``features`` / ``label`` types differ from the first file's).
    """
    def types_of(path: str) -> tuple[str, list[pa.DataType]]:
        handle = ShardFileHandle(uri, path, metadata)
        try:
            schema = handle._file.schema_arrow
            return handle.source, [schema.field(name).type for name in metadata.columns]
        finally:
            handle.close()

    paths = [entry.path for entry in metadata.files]
    if len(paths) < 2:
        _check_drift(metadata, map(types_of, paths))
        return
    # The footers are read on threads (one round trip each on an object store), and checked
    # in the listed order: the error raised is the one a serial check meets first.
    with ThreadPoolExecutor(min(len(paths), _FOOTER_THREADS)) as pool:
        futures = [pool.submit(types_of, p) for p in paths]
        try:
            _check_drift(metadata, (f.result() for f in futures))
        finally:
            for f in futures:
                f.cancel()


def _check_drift(metadata: ShardMetadata,
                 footers: Iterator[tuple[str, list[pa.DataType]]]) -> None:
    """Each file's column types (``(source, types)`` in listed order) equal the first's."""
    first: tuple[str, list[pa.DataType]] | None = None
    for source, types in footers:
        if first is None:
            first = (source, types)
            continue
        for name, want, got in zip(metadata.columns, first[1], types):
            if want != got:
                raise DataError(
                    f"schema drift: shard file {source} has column {name!r} of type "
                    f"{got}, but {first[0]} has {want}"
                )


def _convert(
    table: pa.Table, metadata: ShardMetadata, source: str, first_row: int, *, check: bool = True
) -> tuple[np.ndarray, ...]:
    """A row group's ``(x, y)``, plus its sample weights when the shards are weighted."""
    xy = (_convert_multi(table, metadata, source, first_row, check=check) if metadata.multi
          else _convert_single(table, metadata, source, first_row, check=check))
    if metadata.weight_column is None:
        return xy
    return (*xy, _weights(table, metadata.weight_column, source, first_row))


def _weights(table: pa.Table, name: str, source: str, first_row: int) -> np.ndarray:
    """The sample-weight column as float32; null, negative or non-finite weights name a row."""
    column = table.column(name)
    if column.null_count:
        raise DataError(f"{source}: column {name!r} has {column.null_count} null values")
    w = column.to_numpy().astype(np.float32, copy=False)
    bad = np.flatnonzero(~np.isfinite(w) | (w < 0))
    if bad.size:
        raise DataError(f"{source}: column {name!r} row {first_row + int(bad[0])} holds "
                        f"{w[bad[0]]}: sample weights must be finite and >= 0")
    return w


def _convert_single(
    table: pa.Table, metadata: ShardMetadata, source: str, first_row: int, *, check: bool
) -> tuple[np.ndarray, np.ndarray]:
    x = _list_to_numpy(
        table.column(FEATURES), metadata.feature_size,
        name=FEATURES, source=source, first_row=first_row,
    )
    x = x.reshape(len(x), *metadata.feature_shape)
    label = table.column(LABEL)
    if metadata.label_kind == "class":
        if label.null_count:
            raise DataError(f"{source}: column 'label' has {label.null_count} null values")
        y = label.to_numpy().astype(np.int64, copy=False)
    else:
        y = _list_to_numpy(
            label, metadata.label_size, name=LABEL, source=source, first_row=first_row
        ).reshape(len(x), *metadata.label_shape)
    if check:
        check_values(x, y, metadata, source, first_row)
    return x, y


def _convert_multi(
    table: pa.Table, metadata: ShardMetadata, source: str, first_row: int, *, check: bool
) -> tuple[np.ndarray, np.ndarray]:
    """The packed rows of a multi-input/output row group (see :mod:`sparkdl.data.metadata`)."""
    packed = []
    for specs in (metadata.inputs, metadata.outputs):
        parts = []
        for spec in specs:
            column = table.column(spec.name)
            if spec.kind != "class":
                parts.append(_list_to_numpy(column, spec.size, name=spec.name, source=source,
                                            first_row=first_row))
                continue
            if column.null_count:
                raise DataError(f"{source}: column {spec.name!r} has {column.null_count} "
                                f"null values")
            index = column.to_numpy().astype(np.int64, copy=False)
            if check and len(index):
                bad = np.flatnonzero((index < 0) | (index >= len(spec.classes)))
                if bad.size:
                    raise DataError(
                        f"{source}: column {spec.name!r} row {first_row + int(bad[0])} holds "
                        f"{int(index[bad[0]])}, outside its {len(spec.classes)} classes"
                    )
            parts.append(index.astype(np.float32)[:, None])
        packed.append(np.concatenate(parts, axis=1) if parts else
                      np.empty((table.num_rows, 0), np.float32))
    x, y = packed
    if check and len(x):
        _check_finite(x, "inputs", source, first_row)
        _check_finite(y, "outputs", source, first_row)
    return x, y


def check_values(
    x: np.ndarray, y: np.ndarray, metadata: ShardMetadata, source: str, first_row: int = 0
) -> None:
    """Raise :class:`DataError` naming ``source`` and the row for a label outside the declared
    classes or a NaN / infinite feature or target. Cheap: a sum and a min/max per array; the
    row is looked for only when one is found."""
    if not len(x):
        return
    _check_finite(x, FEATURES, source, first_row)
    if metadata.label_kind == "class":
        lo, hi = int(y.min()), int(y.max())
        if lo < 0 or hi >= metadata.num_classes:
            bad = np.flatnonzero((y < 0) | (y >= metadata.num_classes))
            raise DataError(
                f"{source}: column 'label' row {first_row + int(bad[0])} holds "
                f"{int(y[bad[0]])}, outside the {metadata.num_classes} declared classes "
                f"[0, {metadata.num_classes}) ({bad.size} such rows in this row group)"
            )
    else:
        _check_finite(y, LABEL, source, first_row)


def _check_finite(a: np.ndarray, name: str, source: str, first_row: int) -> None:
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(a.sum()):  # NaN and inf propagate into the sum (overflow: look)
            return
    rows = np.flatnonzero(~np.isfinite(a.reshape(len(a), -1)).all(axis=1))
    if rows.size:
        raise DataError(
            f"{source}: column {name!r} row {first_row + int(rows[0])} holds NaN or infinite "
            f"values ({rows.size} such rows in this row group)"
        )


def empty_arrays(metadata: ShardMetadata) -> tuple[np.ndarray, ...]:
    x = np.empty((0, *metadata.feature_shape), np.float32)
    y = (np.empty((0,), np.int64) if metadata.label_kind == "class"
         else np.empty((0, *metadata.label_shape), np.float32))
    return (x, y) if metadata.weight_column is None else (x, y, np.empty((0,), np.float32))
