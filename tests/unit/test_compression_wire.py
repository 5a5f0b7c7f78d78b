"""Wire format v1: round trip, per-field rejection, and a fuzz of hostile frames."""

from __future__ import annotations

import contextlib
import struct
import zlib

import numpy as np
import pytest

from sparkdl.compression.encoding import (
    EncodedUpdate,
    Encoding,
    bitmap_nbytes,
    decode_into,
    threshold_encode,
)
from sparkdl.compression.wire import FORMAT_VERSION, HEADER, pack_frame, unpack_frame
from sparkdl.errors import CommunicationError, ConfigurationError

N = 103
JOB = 0xDEADBEEF_01234567


def encoded(density: float, n: int = N, seed: int = 0) -> EncodedUpdate:
    rng = np.random.default_rng(seed)
    r = rng.standard_normal(n).astype(np.float32)
    tau = float(np.quantile(np.abs(r), 1 - density)) if density else 100.0
    return threshold_encode(r, tau)


@pytest.mark.parametrize("density", [0.0, 0.03, 0.5, 1.0])
def test_round_trip(density: float) -> None:
    update = encoded(density)
    frame = pack_frame(update, job_id=JOB, rank=3, step=2**40 + 5)
    assert len(frame) == HEADER.size + len(update.payload)
    header, payload = unpack_frame(frame, job_id=JOB, num_elements=N, world_size=4, step=2**40 + 5)
    assert (header.magic, header.version, header.reserved) == (b"SDLU", FORMAT_VERSION, 0)
    assert (header.encoding, header.rank, header.step) == (update.encoding, 3, 2**40 + 5)
    assert (header.job_id, header.num_elements, header.tau) == (JOB, N, update.tau)
    assert header.payload_nbytes == len(update.payload)
    assert header.crc32 == zlib.crc32(update.payload)
    assert bytes(payload) == update.payload
    # memoryview input, and world_size / step left unchecked
    header2, _ = unpack_frame(memoryview(frame), job_id=JOB, num_elements=N)
    assert header2 == header


def test_zero_length_vector() -> None:
    update = threshold_encode(np.zeros(0, np.float32), 1.0)
    frame = pack_frame(update, job_id=0, rank=0, step=0)
    header, payload = unpack_frame(frame, job_id=0, num_elements=0, world_size=1, step=0)
    assert header.payload_nbytes == 0 and len(payload) == 0


def test_pack_rejects_out_of_range_fields() -> None:
    update = encoded(0.03)
    for kwargs in ({"job_id": -1}, {"job_id": 2**64}, {"rank": 2**32}, {"step": -1}):
        args = {"job_id": 0, "rank": 0, "step": 0, **kwargs}
        with pytest.raises(ConfigurationError):
            pack_frame(update, **args)


FIELDS = [
    "magic",
    "version",
    "encoding",
    "reserved",
    "job_id",
    "rank",
    "step",
    "num_elements",
    "payload_nbytes",
    "tau",
    "crc32",
]
BAD_VALUES = {
    "magic": [b"SDLV", b"\0\0\0\0"],
    "version": [0, 2, 255],
    "encoding": [0, 3, 255],
    "reserved": [1, 0x8000],
    "job_id": [JOB + 1, 0],
    "rank": [4, 2**32 - 1],
    "step": [6, 4, 2**64 - 1],
    "num_elements": [N - 1, N + 1, 0, 2**32 - 1],
    "payload_nbytes": [0, 4, 2**32 - 1],
    "tau": [0.0, -1.0, float("inf"), float("nan")],
    "crc32": [1, 0xFFFFFFFF],
}
MESSAGE_KEY = {"version": "format version", "num_elements": "num_elements"}


@pytest.mark.parametrize("density", [0.03, 0.5])
@pytest.mark.parametrize("field", FIELDS)
def test_each_corrupted_header_field_is_rejected(field: str, density: float) -> None:
    update = encoded(density)
    frame = pack_frame(update, job_id=JOB, rank=2, step=5)
    good = list(HEADER.unpack_from(frame))
    index = FIELDS.index(field)
    for value in BAD_VALUES[field]:
        if value == good[index]:
            continue
        fields = list(good)
        fields[index] = value
        bad = HEADER.pack(*fields) + frame[HEADER.size :]
        with pytest.raises(CommunicationError) as info:
            unpack_frame(bad, job_id=JOB, num_elements=N, world_size=4, step=5)
        assert MESSAGE_KEY.get(field, field) in str(info.value)


def test_length_checks() -> None:
    update = encoded(0.03)  # sparse, 12 bytes
    frame = pack_frame(update, job_id=JOB, rank=0, step=0)
    for cut in (0, 1, HEADER.size - 1):
        with pytest.raises(CommunicationError, match="too short"):
            unpack_frame(frame[:cut], job_id=JOB, num_elements=N)
    with pytest.raises(CommunicationError, match="payload_nbytes"):
        unpack_frame(frame[:-1], job_id=JOB, num_elements=N)
    with pytest.raises(CommunicationError, match="payload_nbytes"):
        unpack_frame(frame + b"\0", job_id=JOB, num_elements=N)


def lying_frame(encoding: int, payload: bytes, n: int, declared: int | None = None) -> bytes:
    nbytes = len(payload) if declared is None else declared
    header = HEADER.pack(b"SDLU", 1, encoding, 0, JOB, 0, 0, n, nbytes, 1.0, zlib.crc32(payload))
    return header + payload


def test_payload_size_must_fit_the_encoding() -> None:
    # A sparse message larger than the bitmap would be, a bitmap of the wrong size, and a
    # sparse payload that is not a multiple of 4 are all rejected even with a valid CRC.
    cases = [
        (Encoding.SPARSE, np.arange(1, 10, dtype="<i4").tobytes()),  # 36 > 26 bytes
        (Encoding.SPARSE, b"\x01\0\0\0\x02"),
        (Encoding.BITMAP, bytes(bitmap_nbytes(N) - 1)),
        (Encoding.BITMAP, bytes(bitmap_nbytes(N) + 1)),
    ]
    for encoding, payload in cases:
        with pytest.raises(CommunicationError, match="payload_nbytes"):
            unpack_frame(lying_frame(encoding, payload, N), job_id=JOB, num_elements=N)


def test_no_pickle_eval_tensorflow_or_spark_in_the_package() -> None:
    import ast
    import pathlib

    import sparkdl.compression as package

    for path in pathlib.Path(package.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in ("eval", "exec"), path.name
                continue
            else:
                continue
            for name in names:
                root = name.split(".")[0]
                assert root in (
                    "__future__",
                    "abc",
                    "bisect",
                    "copy",
                    "enum",
                    "math",
                    "struct",
                    "zlib",
                    "time",
                    "dataclasses",
                    "collections",
                    "typing",
                    "numpy",
                    "sparkdl",
                ), (path.name, name)


def _check(frame: bytes, counter: dict[str, int]) -> None:
    """unpack + decode one frame: only CommunicationError may escape."""
    out = np.zeros(N, np.float32)
    try:
        header, payload = unpack_frame(frame, job_id=JOB, num_elements=N, world_size=4, step=0)
        decode_into(header.encoding, payload, N, header.tau, out)
        counter["accepted"] += 1
    except CommunicationError:
        counter["rejected"] += 1


def test_fuzz_unpack_and_decode_only_raise_communication_error() -> None:
    rng = np.random.default_rng(2024)
    bases = [
        pack_frame(encoded(d, seed=s), job_id=JOB, rank=s % 4, step=0)
        for s, d in enumerate([0.0, 0.01, 0.03, 0.06, 0.2, 0.5, 1.0])
    ]
    counter = {"accepted": 0, "rejected": 0}
    total = 0
    per_kind = 25_000

    # 1. bit flips (1-8 bits) anywhere in valid frames
    for base in bases:
        arr = np.frombuffer(base, np.uint8)
        count = per_kind // len(bases)
        frames = np.tile(arr, (count, 1))
        flips = rng.integers(1, 9, count)
        for j in range(8):
            rows = np.flatnonzero(flips > j)
            pos = rng.integers(0, arr.size * 8, rows.size)
            frames[rows, pos // 8] ^= (1 << (pos % 8)).astype(np.uint8)
        for row in frames:
            _check(row.tobytes(), counter)
        total += count

    # 2. truncations and extensions of valid frames
    for _ in range(per_kind // 2):
        base = bases[int(rng.integers(len(bases)))]
        cut = int(rng.integers(0, len(base) + 1))
        _check(base[:cut], counter)
        _check(base + rng.bytes(int(rng.integers(1, 9))), counter)
        total += 2

    # 3. random bytes, with and without a valid magic/version prefix
    lengths = rng.integers(0, 200, per_kind)
    blob = rng.bytes(int(lengths.sum()))
    offset = 0
    for i, length in enumerate(lengths):
        chunk = blob[offset : offset + length]
        offset += length
        if i % 2:
            chunk = b"SDLU\x01" + chunk[5:]
        _check(chunk, counter)
        total += 1

    # 4. valid magic/version/job/step with random encodings, lying lengths, random tau,
    #    random payloads, and a correct CRC (so the decoder sees hostile payloads)
    limit = bitmap_nbytes(N)
    encodings = rng.choice([1, 2, 0, 3], per_kind, p=[0.45, 0.45, 0.05, 0.05])
    plausible = np.where(
        encodings == Encoding.SPARSE, 4 * rng.integers(0, limit // 4 + 1, per_kind), limit
    )
    odd_sizes = rng.choice([0, 4, 8, limit - 1, limit, limit + 1, 40, 100], per_kind)
    sizes = np.where(rng.random(per_kind) < 0.85, plausible, odd_sizes)
    declared_n = rng.choice([N] * 12 + [N - 1, N + 1, 2**32 - 1], per_kind)
    taus = rng.choice([1.0, 1e-30, 3e38, 0.0, -1.0, np.inf, np.nan], per_kind, p=[0.7] + [0.05] * 6)
    lies = rng.integers(-2, 3, per_kind) * (rng.random(per_kind) < 0.1)
    payload_blob = rng.integers(0, 256, int(sizes.sum()), dtype=np.uint8)
    # make many sparse payloads plausible: small in-range, sometimes sorted
    offset = 0
    for i in range(per_kind):
        size = int(sizes[i])
        raw = payload_blob[offset : offset + size]
        offset += size
        if encodings[i] == Encoding.SPARSE and size % 4 == 0 and i % 2:
            codes = rng.integers(-N - 2, N + 3, size // 4).astype("<i4")
            if i % 4 == 1:
                codes = np.sort(np.abs(codes)) * rng.choice([-1, 1], codes.size).astype("<i4")
            payload = codes.tobytes()
        elif encodings[i] == Encoding.BITMAP and i % 2:
            payload = (raw & 0x55 if i % 4 == 1 else raw).tobytes()
        else:
            payload = raw.tobytes()
        header = struct.pack(
            "<4sBBHQIQIIfI",
            b"SDLU",
            1,
            int(encodings[i]),
            0,
            JOB,
            int(rng.integers(0, 5)) if i % 10 == 0 else i % 4,
            0,
            int(declared_n[i]),
            max(0, size + int(lies[i])),
            float(taus[i]),
            zlib.crc32(payload),
        )
        _check(header + payload, counter)
        total += 1

    # 5. decode_into alone with random payloads (no wire checks in front of it)
    out = np.zeros(N, np.float32)
    for _ in range(per_kind):
        payload = rng.bytes(int(rng.integers(0, 40)))
        with contextlib.suppress(CommunicationError):
            decode_into(int(rng.integers(0, 4)), payload, N, 1.0, out)  # type: ignore[arg-type]
        total += 1

    assert total >= 100_000, total
    assert counter["accepted"] > 0 and counter["rejected"] > 0
