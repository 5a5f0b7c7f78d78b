"""IDX (MNIST format) files: write, header, record ranges, bad files (no Spark)."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from sparkdl.errors import DataError
from sparkdl.etl.readers.idx import read_idx_header, read_records, write_idx


@pytest.mark.parametrize("name", ["images-idx3-ubyte", "images-idx3-ubyte.gz"])
def test_round_trip(tmp_path: Path, name: str) -> None:
    x = np.arange(5 * 4 * 3, dtype=np.uint8).reshape(5, 4, 3)
    path = str(tmp_path / name)
    write_idx(path, x)
    assert (Path(path).read_bytes()[:2] == b"\x1f\x8b") == name.endswith(".gz")
    h = read_idx_header(path)
    assert h.dims == (5, 4, 3) and h.count == 5 and h.record_shape == (4, 3)
    assert h.gzipped == name.endswith(".gz") and h.offset == 16 and h.record_bytes == 12
    np.testing.assert_array_equal(read_records(h, 1, 4), x[1:4])
    np.testing.assert_array_equal(read_records(h, 0, 5), x)


def test_other_dtypes(tmp_path: Path) -> None:
    for arr in (np.arange(6, dtype=np.int32) - 3, np.linspace(0, 1, 6).astype(np.float32)):
        path = str(tmp_path / f"a-{arr.dtype}.idx")
        write_idx(path, arr)
        np.testing.assert_array_equal(read_records(read_idx_header(path), 0, 6), arr)


def test_bad_magic_names_file(tmp_path: Path) -> None:
    path = tmp_path / "bad-idx3-ubyte"
    path.write_bytes(b"\x89PNG not idx")
    with pytest.raises(DataError, match=r"IDX file .*bad-idx3-ubyte has no valid IDX header"):
        read_idx_header(str(path))
    gz = tmp_path / "bad.gz"
    gz.write_bytes(gzip.compress(b"\x00\x00\x08"))
    with pytest.raises(DataError, match=r"bad.gz has no valid IDX header"):
        read_idx_header(str(gz))


def test_truncated_names_file_and_records(tmp_path: Path) -> None:
    path = tmp_path / "t-idx1-ubyte"
    write_idx(str(path), np.arange(10, dtype=np.uint8))
    path.write_bytes(path.read_bytes()[:-3])
    h = read_idx_header(str(path))
    np.testing.assert_array_equal(read_records(h, 0, 7), np.arange(7))
    with pytest.raises(DataError, match=r"t-idx1-ubyte is truncated: records 5..9 need 5 bytes"):
        read_records(h, 5, 10)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"cannot open IDX file .*nothing"):
        read_idx_header(str(tmp_path / "nothing"))
