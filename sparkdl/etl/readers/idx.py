"""IDX record reader (the MNIST file format), gzipped or not.

The driver reads only the headers; the records are read by the executors in chunks of
``chunk_rows`` (a ``mapInPandas`` over a DataFrame of row ranges), each task opening the files
through pyarrow's filesystems. :func:`write_idx` writes the format (for tests and samples).
"""

from __future__ import annotations

import gzip
import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from sparkdl.data.metadata import resolve
from sparkdl.data.spark_errors import executor_error, spark_data_errors
from sparkdl.errors import DataError
from sparkdl.etl.readers.images import with_shape

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession

DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
CODES = {np.dtype(v).newbyteorder("="): k for k, v in DTYPES.items()}


@dataclass(frozen=True)
class IdxHeader:
    """What the first bytes of an IDX file say."""

    uri: str
    dtype: str
    dims: tuple[int, ...]
    offset: int  # bytes before the first record
    gzipped: bool

    @property
    def count(self) -> int:
        return self.dims[0]

    @property
    def record_shape(self) -> tuple[int, ...]:
        return self.dims[1:]

    @property
    def record_bytes(self) -> int:
        return math.prod(self.record_shape) * np.dtype(self.dtype).itemsize


def _open(uri: str) -> tuple[BinaryIO, bool]:
    fs, path = resolve(uri)
    try:
        raw = fs.open_input_file(path)
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot open IDX file {uri}: {exc}") from None
    head = raw.read(2)
    raw.seek(0)
    if head == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=raw), True  # type: ignore[arg-type]
    return raw, False  # type: ignore[return-value]


def read_idx_header(uri: str) -> IdxHeader:
    """Parse the header of the IDX file at ``uri``; :class:`DataError` naming it if invalid."""
    stream, gz = _open(uri)
    try:
        try:
            magic = stream.read(4)
        except (OSError, EOFError) as exc:
            raise DataError(f"IDX file {uri} cannot be read: {exc}") from None
        if len(magic) < 4 or magic[:2] != b"\x00\x00" or magic[2] not in DTYPES:
            raise DataError(
                f"IDX file {uri} has no valid IDX header (magic bytes {magic.hex() or 'none'}; "
                f"expected 0000 + a type code in {sorted(DTYPES)} + the number of dimensions)"
            )
        ndim = magic[3]
        raw_dims = stream.read(4 * ndim)
        if ndim < 1 or len(raw_dims) != 4 * ndim:
            raise DataError(f"IDX file {uri}: truncated header ({ndim} dimensions declared)")
        dims = struct.unpack(f">{ndim}I", raw_dims)
    finally:
        stream.close()
    return IdxHeader(uri, DTYPES[magic[2]], tuple(int(d) for d in dims), 4 + 4 * ndim, gz)


def read_records(header: IdxHeader, start: int, stop: int) -> np.ndarray:
    """Records ``[start, stop)`` of an IDX file as a native-endian array."""
    stream, _ = _open(header.uri)
    want = (stop - start) * header.record_bytes
    try:
        skip = header.offset + start * header.record_bytes
        if header.gzipped:
            while skip > 0:
                got = len(stream.read(min(skip, 1 << 24)))
                if got == 0:
                    break
                skip -= got
        else:
            stream.seek(skip)
        data = stream.read(want)
    except (OSError, EOFError) as exc:
        raise executor_error(f"IDX file {header.uri} cannot be read: {exc}") from None
    finally:
        stream.close()
    if len(data) != want:
        raise executor_error(
            f"IDX file {header.uri} is truncated: records {start}..{stop - 1} need {want} bytes, "
            f"got {len(data)} (header declares {header.count} records of {header.record_shape})"
        )
    arr = np.frombuffer(data, dtype=header.dtype).astype(np.dtype(header.dtype).newbyteorder("="))
    return arr.reshape(stop - start, *header.record_shape)


def _reader(images: IdxHeader, labels: IdxHeader | None) -> Any:
    def read(chunks: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        import pandas as pd

        for chunk in chunks:
            for start, stop in zip(chunk["start"], chunk["stop"]):
                x = read_records(images, int(start), int(stop)).astype(np.float32)
                out = {"index": np.arange(start, stop, dtype=np.int64),
                       "image": list(x.reshape(len(x), -1))}
                if labels is not None:
                    out["label"] = read_records(labels, int(start), int(stop)).astype(np.int64)
                yield pd.DataFrame(out)

    return read


def read_idx(
    spark: SparkSession,
    images_uri: str,
    labels_uri: str | None = None,
    *,
    chunk_rows: int = 10_000,
) -> DataFrame:
    """An IDX images file (and optional labels file) as columns ``index`` (record number),
    ``image`` (``array<float>``, the record's values flattened, e.g. 784 pixels in [0, 255])
    and ``label`` (``long``). The image shape is recorded in the column metadata (a 2-D
    record gets one channel: ``[28, 28, 1]``)."""
    images = read_idx_header(images_uri)
    labels = read_idx_header(labels_uri) if labels_uri else None
    if labels is not None:
        if labels.record_shape != ():
            raise DataError(
                f"IDX labels file {labels_uri} holds records of shape {labels.record_shape}, "
                f"expected one value per record"
            )
        if labels.count != images.count:
            raise DataError(
                f"IDX files disagree: {images_uri} has {images.count} records, {labels_uri} "
                f"has {labels.count}"
            )
    if images.count == 0:
        raise DataError(f"IDX file {images_uri} holds no records")
    if chunk_rows < 1:
        raise DataError(f"chunk_rows must be >= 1, got {chunk_rows}")
    if images.gzipped:  # every gzipped chunk decompresses from the start: fewer, larger chunks
        chunk_rows = max(chunk_rows, math.ceil(images.count / 8))
    bounds = [(s, min(s + chunk_rows, images.count)) for s in range(0, images.count, chunk_rows)]
    ranges = spark.createDataFrame(bounds, "start long, stop long").repartition(len(bounds))
    schema = "index long, image array<float>" + (", label long" if labels else "")
    with spark_data_errors():
        df = ranges.mapInPandas(_reader(images, labels), schema)
    shape = list(images.record_shape) + ([1] if len(images.record_shape) == 2 else [])
    return with_shape(df, "image", shape)


def write_idx(path: str, array: np.ndarray, *, compress: bool | None = None) -> None:
    """Write ``array`` (first axis = records) as an IDX file; gzipped if ``path`` ends in .gz
    (or ``compress``)."""
    arr = np.asarray(array)
    code = CODES.get(arr.dtype.newbyteorder("="))
    if code is None:
        raise DataError(f"IDX cannot hold dtype {arr.dtype}")
    payload = (
        bytes([0, 0, code, arr.ndim])
        + struct.pack(f">{arr.ndim}I", *arr.shape)
        + arr.astype(DTYPES[code]).tobytes()
    )
    gz = path.endswith(".gz") if compress is None else compress
    with open(path, "wb") as f:
        f.write(gzip.compress(payload, compresslevel=1) if gz else payload)
