"""Threshold encoding: exactness property, encoding switch, decoding validation."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from sparkdl.compression.encoding import (
    CHUNK_ELEMENTS,
    Encoding,
    bitmap_nbytes,
    decode_into,
    sparse_entries,
    threshold_encode,
)
from sparkdl.errors import CommunicationError, ConfigurationError, NonFiniteError

F32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
TAU = st.floats(
    min_value=float(np.finfo(np.float32).smallest_subnormal),
    max_value=float(np.finfo(np.float32).max),
    width=32,
    allow_subnormal=True,
)


def roundtrip(residual: np.ndarray, tau: float) -> tuple[np.ndarray, np.ndarray, object]:
    snapshot = residual.copy()
    encoded = threshold_encode(residual, tau)
    decoded = np.zeros(residual.size, np.float32)
    decode_into(encoded.encoding, encoded.payload, encoded.num_elements, encoded.tau, decoded)
    return snapshot, decoded, encoded


def assert_exact(snapshot: np.ndarray, decoded: np.ndarray, residual: np.ndarray) -> None:
    with np.errstate(over="ignore", invalid="ignore"):
        total = decoded + residual
    # Equality as float32 numbers (so +0.0 == -0.0); inf == inf where the sum overflowed.
    assert np.array_equal(total, snapshot)
    # Bitwise too, except for the sign of zero.
    same_bits = total.view(np.int32) == snapshot.view(np.int32)
    assert np.all(same_bits | (snapshot == 0))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    n=st.integers(min_value=0, max_value=300),
    tau=TAU,
)
def test_decoded_plus_residual_is_exact(data: st.DataObject, n: int, tau: float) -> None:
    r0 = data.draw(hnp.arrays(np.float32, n, elements=F32))
    u = data.draw(hnp.arrays(np.float32, n, elements=F32))
    with np.errstate(over="ignore"):
        r = r0 + u
    snapshot, decoded, encoded = roundtrip(r, tau)
    assert_exact(snapshot, decoded, r)
    t = np.float32(tau)
    sent = decoded != 0
    assert int(np.count_nonzero(sent)) == encoded.nnz
    assert np.all(np.abs(decoded[sent]) == t)
    assert np.all(np.abs(snapshot[sent]) >= t)
    assert np.all(np.sign(decoded[sent]) == np.sign(snapshot[sent]))
    # Elements below tau are never touched.
    below = np.abs(snapshot) < t
    assert np.array_equal(r[below], snapshot[below])


@settings(max_examples=60, deadline=None)
@given(
    scale=st.sampled_from([1e-30, 1e-6, 1.0, 1e6, 1e30]),
    density=st.floats(min_value=0.0, max_value=1.0),
    n=st.integers(min_value=1, max_value=3 * CHUNK_ELEMENTS + 7),
    seed=st.integers(0, 2**32 - 1),
)
def test_exact_on_large_vectors_both_encodings(
    scale: float, density: float, n: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    r = (rng.standard_normal(n) * scale).astype(np.float32)
    tau = float(np.quantile(np.abs(r), 1 - density)) if density > 0 else float(scale) * 100
    tau = max(tau, 1e-38)
    snapshot, decoded, encoded = roundtrip(r, tau)
    assert_exact(snapshot, decoded, r)
    expected = Encoding.SPARSE if 4 * encoded.nnz <= bitmap_nbytes(n) else Encoding.BITMAP
    # The choice is made on candidates (|r| >= tau); rejections are rare ties only.
    candidates = int(np.count_nonzero(np.abs(snapshot) >= np.float32(tau)))
    chosen = Encoding.SPARSE if 4 * candidates <= bitmap_nbytes(n) else Encoding.BITMAP
    assert encoded.encoding == chosen
    if candidates == encoded.nnz:
        assert encoded.encoding == expected


def test_huge_residual_relative_to_tau_is_still_sent() -> None:
    r = np.array([1e10, -1e10, 3.0, 1e-3], np.float32)
    snapshot, decoded, encoded = roundtrip(r, 1e-4)
    assert encoded.nnz == 4
    assert np.array_equal(r[:2], snapshot[:2])  # fl(s - tau) == s: residual cannot shrink
    assert_exact(snapshot, decoded, r)


def test_rounding_tie_is_not_encoded() -> None:
    # s = 1 + 2**-23 (odd mantissa), tau = 2**-24: s - tau is a tie, and no float32 residual
    # r satisfies fl(tau + r) == s, so the element must wait.
    s = np.float32(1 + 2**-23)
    r = np.array([s, 1.0], np.float32)
    snapshot, decoded, encoded = roundtrip(r, 2**-24)
    assert encoded.nnz == 1
    assert decoded[0] == 0 and r[0] == s
    assert_exact(snapshot, decoded, r)


def test_sparse_layout_and_sign_of_index_zero() -> None:
    r = np.array([-2.0, 0.5, 3.0, 0.0, -1.0] + [0.0] * 75, np.float32)
    encoded = threshold_encode(r, 1.0)
    assert encoded.encoding is Encoding.SPARSE
    assert np.frombuffer(encoded.payload, "<i4").tolist() == [-1, 3, -5]
    assert r[:5].tolist() == [-1.0, 0.5, 2.0, 0.0, 0.0]
    assert encoded.nnz == 3 and encoded.tau == 1.0


def test_bitmap_layout() -> None:
    r = np.array([1.0, -1.0, 0.0, 2.0, -3.0], np.float32)
    encoded = threshold_encode(r, 1.0)
    assert encoded.encoding is Encoding.BITMAP
    # codes 1, 2, 0, 1 | 2 -> byte0 = 1 | 2<<2 | 0<<4 | 1<<6, byte1 = 2
    assert encoded.payload == bytes([1 | (2 << 2) | (1 << 6), 2])


@pytest.mark.parametrize("n", [16 * 1000, 16 * 5000 + 16])
def test_switch_point(n: int) -> None:
    limit = n // 16
    for nnz, expected in ((limit, Encoding.SPARSE), (limit + 1, Encoding.BITMAP)):
        r = np.zeros(n, np.float32)
        positions = np.random.default_rng(nnz).choice(n, nnz, replace=False)
        r[positions] = np.where(positions % 2 == 0, 1.5, -1.5).astype(np.float32)
        snapshot, decoded, encoded = roundtrip(r, 1.0)
        assert encoded.encoding is expected
        assert encoded.nnz == nnz
        size = 4 * nnz if expected is Encoding.SPARSE else bitmap_nbytes(n)
        assert len(encoded.payload) == size
        assert_exact(snapshot, decoded, r)


def test_zero_length_all_zero_and_all_pass() -> None:
    empty = np.zeros(0, np.float32)
    encoded = threshold_encode(empty, 0.1)
    assert (encoded.encoding, encoded.nnz, encoded.payload) == (Encoding.SPARSE, 0, b"")
    decode_into(encoded.encoding, encoded.payload, 0, encoded.tau, empty)
    decode_into(Encoding.BITMAP, b"", 0, 0.1, empty)

    zeros = np.zeros(1000, np.float32)
    snapshot, decoded, encoded = roundtrip(zeros, 0.1)
    assert encoded.nnz == 0 and encoded.payload == b"" and not decoded.any()

    n = 2 * CHUNK_ELEMENTS + 3
    full = np.where(np.arange(n) % 3 == 0, -1.0, 1.0).astype(np.float32)
    snapshot, decoded, encoded = roundtrip(full, 0.25)
    assert encoded.encoding is Encoding.BITMAP and encoded.nnz == n
    assert np.array_equal(decoded, np.where(snapshot < 0, -0.25, 0.25).astype(np.float32))
    assert np.all(full == np.where(snapshot < 0, -0.75, 0.75))


def test_decode_into_sums_several_messages() -> None:
    rng = np.random.default_rng(7)
    n = 5000
    out = np.zeros(n, np.float32)
    expected = np.zeros(n, np.float32)
    for density in (0.001, 0.05, 0.5, 1.0):
        r = rng.standard_normal(n).astype(np.float32)
        tau = float(np.quantile(np.abs(r), 1 - density))
        _, decoded, encoded = roundtrip(r, tau)
        decode_into(encoded.encoding, memoryview(encoded.payload), n, encoded.tau, out)
        expected += decoded
    assert np.array_equal(out, expected)


def test_encode_with_fused_add_matches_separate_add() -> None:
    rng = np.random.default_rng(3)
    n = CHUNK_ELEMENTS + 11
    r0 = rng.standard_normal(n).astype(np.float32)
    u = rng.standard_normal(n).astype(np.float32)
    a, b = r0.copy(), r0 + u
    ea = threshold_encode(a, 1.5, add=u)
    eb = threshold_encode(b, 1.5)
    assert ea == eb and np.array_equal(a, b)


@pytest.mark.parametrize("tau", [0.0, -1.0, float("nan"), float("inf"), 1e39, 1e-50, "x"])
def test_bad_tau(tau: object) -> None:
    with pytest.raises(ConfigurationError):
        threshold_encode(np.zeros(4, np.float32), tau)  # type: ignore[arg-type]
    with pytest.raises(CommunicationError):
        decode_into(Encoding.SPARSE, b"", 4, tau, np.zeros(4, np.float32))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "array",
    [np.zeros(4, np.float64), np.zeros((2, 2), np.float32), [0.0, 1.0], np.zeros(4, np.int32)],
)
def test_bad_residual(array: object) -> None:
    with pytest.raises(ConfigurationError):
        threshold_encode(array, 1.0)  # type: ignore[arg-type]


def test_bad_out_and_num_elements() -> None:
    with pytest.raises(ConfigurationError):
        decode_into(Encoding.SPARSE, b"", 4, 1.0, np.zeros(5, np.float32))
    with pytest.raises(ConfigurationError):
        decode_into(Encoding.SPARSE, b"", -1, 1.0, np.zeros(0, np.float32))
    with pytest.raises(ConfigurationError):
        decode_into(Encoding.SPARSE, b"", 4, 1.0, np.zeros(4, np.float64))


def _sparse(*codes: int) -> bytes:
    return np.array(codes, "<i4").tobytes()


@pytest.mark.parametrize(
    ("encoding", "payload"),
    [
        (7, b""),
        (0, b""),
        (Encoding.SPARSE, b"\x01\x00\x00"),  # not a multiple of 4
        (Encoding.SPARSE, _sparse(0)),  # index 0 has no sign
        (Encoding.SPARSE, _sparse(9)),  # out of range
        (Encoding.SPARSE, _sparse(-9)),
        (Encoding.SPARSE, _sparse(-(2**31))),
        (Encoding.SPARSE, _sparse(2**31 - 1)),
        (Encoding.SPARSE, _sparse(3, 2)),  # not increasing
        (Encoding.SPARSE, _sparse(2, -2)),  # duplicate index
        (Encoding.SPARSE, _sparse(*range(1, 10))),  # more entries than elements
        (Encoding.BITMAP, b"\x00"),  # too short
        (Encoding.BITMAP, b"\x00\x00\x00"),  # too long
        (Encoding.BITMAP, b"\x03\x00"),  # code 3
        (Encoding.BITMAP, b"\x00\xc0"),  # code 3 in the last element
    ],
)
def test_decode_rejects_bad_payloads(encoding: int, payload: bytes) -> None:
    out = np.zeros(8, np.float32)
    before = out.copy()
    with pytest.raises(CommunicationError):
        decode_into(encoding, payload, out.size, 1.0, out)  # type: ignore[arg-type]
    assert np.array_equal(out, before)


def test_decode_rejects_nonzero_padding_bits() -> None:
    out = np.zeros(7, np.float32)
    decode_into(Encoding.BITMAP, b"\x00\x10", 7, 1.0, out)  # element 6 = +1: fine
    assert out[6] == 1.0
    with pytest.raises(CommunicationError):
        decode_into(Encoding.BITMAP, b"\x00\x40", 7, 1.0, out)  # bits of element 7 of 7


def _reference_sparse_entries(
    codes: list[int], n: int, t: np.float32
) -> tuple[list[Any], list[Any]]:
    """sparse_entries, one entry at a time: every range error before any order error."""
    for c in codes:
        if c == 0 or abs(c) > n:
            return ["out of range"], [min(codes), max(codes)]
    index = [abs(c) - 1 for c in codes]
    if any(b <= a for a, b in itertools.pairwise(index)):
        return ["not strictly increasing"], []
    return index, [-t if c < 0 else t for c in codes]


def test_sparse_entries_matches_reference_on_random_payloads() -> None:
    rng = np.random.default_rng(7)
    t = np.float32(0.375)
    special = [0, 1, -1, 2**31 - 1, -(2**31), -(2**31) + 1]
    for _ in range(3000):
        n = int(rng.choice([1, 2, 5, 8, 100, 2**31 - 1]))
        size = int(rng.integers(1, min(n, 12) + 1))
        index = np.sort(rng.choice(min(n, 1000), size=min(size, min(n, 1000)), replace=False))
        if n > 1000 and rng.integers(0, 2):
            index = index + (n - 1000)  # reach the top of the range
        codes = [int(i) + 1 for i in index]
        codes = [-c if rng.integers(0, 2) else c for c in codes]
        for _ in range(int(rng.integers(0, 3))):  # corrupt some entries
            where = int(rng.integers(0, len(codes)))
            how = int(rng.integers(0, 4))
            if how == 0:
                codes[where] = int(rng.choice(special))
            elif how == 1:
                codes[where] = int(rng.integers(-n - 2, n + 3))
            elif how == 2 and where:
                codes[where] = codes[where - 1]  # duplicate
            else:
                codes[where] = -codes[where]  # sign only: still valid
        codes = [(c + 2**31) % 2**32 - 2**31 for c in codes]  # as int32
        payload = np.array(codes, "<i4").tobytes()
        expected, values = _reference_sparse_entries(codes, n, t)
        if isinstance(expected[0], str):
            with pytest.raises(CommunicationError, match=expected[0]) as info:
                sparse_entries(payload, n, float(t))
            if values:
                assert f"(min {values[0]}, max {values[1]}," in str(info.value)
            continue
        got_index, got_values = sparse_entries(payload, n, float(t))
        assert got_index.dtype == np.int32 and got_values.dtype == np.float32
        assert got_index.tolist() == expected
        assert got_values.view(np.int32).tolist() == np.array(values, np.float32).view(
            np.int32
        ).tolist()


def _reference_encode(
    residual: np.ndarray, tau: float, add: np.ndarray | None = None
) -> tuple[Encoding, int, bytes, np.ndarray]:
    """threshold_encode over the whole vector at once, without chunks or phases."""
    r = residual.copy() if add is None else residual + add
    t = np.float32(tau)
    n = r.size
    with np.errstate(over="ignore", invalid="ignore"):
        candidate = np.abs(r) >= t
        signed = np.where(np.signbit(r), -t, t).astype(np.float32)
        updated = r - signed
        keep = candidate & ((updated + signed) == r)
    r[keep] = updated[keep]
    negative = np.signbit(signed)
    index = np.flatnonzero(keep)
    if np.count_nonzero(candidate) <= bitmap_nbytes(n) // 4:
        codes = np.where(negative[index], -(index + 1), index + 1).astype("<i4")
        return Encoding.SPARSE, index.size, codes.tobytes(), r
    code = np.zeros(4 * bitmap_nbytes(n), np.uint8)
    code[index] = np.where(negative[index], 2, 1)
    quads = code.reshape(-1, 4)
    packed = quads[:, 0] | quads[:, 1] << 2 | quads[:, 2] << 4 | quads[:, 3] << 6
    return Encoding.BITMAP, index.size, packed.astype(np.uint8).tobytes(), r


def _encode_cases(rng: np.random.Generator) -> list[tuple[np.ndarray, float]]:
    c = CHUNK_ELEMENTS
    t = 2e-3
    cases: list[tuple[np.ndarray, float]] = []
    for n in [0, 1, 3, 4, 5, 7, 8, 9, 17, 1000, c - 1, c, c + 3, 2 * c + 5, 3 * c + 13]:
        r = rng.normal(0, 1e-3, n).astype(np.float32)
        cases.append((r, t))
        cases.append((r, 1e-30))  # all encoded (bitmap), zeros aside
        z = r.copy()
        z[rng.random(n) < 0.3] = -0.0
        z[rng.random(n) < 0.01] = np.nan
        cases.append((z, t))
        ties = r.copy()
        ties[rng.random(n) < 0.05] = np.float32(t) * rng.choice(np.float32([-1, 1, 2, -3]))
        cases.append((ties, t))
        huge = r.copy()
        huge[rng.random(n) < 0.002] = np.float32(3e33)
        huge[rng.random(n) < 0.002] = -np.float32(np.inf)
        cases.append((huge, t))
        # exact rounding ties: s - t exactly half-way between two float32 values
        tie = np.full(n, np.float32(2.0**24 + 2), np.float32)
        cases.append((tie, 1.0))
        tie[rng.random(n) < 0.95] = 0.0
        cases.append((tie, 1.0))
    for dense_at in [0, c // 3, c + 7, 2 * c - 1]:  # sparse -> bitmap inside a chunk
        n = 3 * c + 11
        r = rng.normal(0, 7e-4, n).astype(np.float32)  # a few candidates before the switch
        r[dense_at : dense_at + n // 10] = rng.normal(0, 1e-2, min(n // 10, n - dense_at))
        cases.append((r, t))
    return cases


def test_encode_matches_whole_vector_reference_bit_for_bit() -> None:
    rng = np.random.default_rng(5)
    for r, tau in _encode_cases(rng):
        for add in (None, rng.normal(0, 1e-3, r.size).astype(np.float32)):
            kind, nnz, payload, expected = _reference_encode(r, tau, add)
            got = r.copy()
            encoded = threshold_encode(got, tau, add=add)
            assert (encoded.encoding, encoded.nnz) == (kind, nnz)
            assert encoded.tau == float(np.float32(tau))
            assert encoded.payload == payload
            assert got.tobytes() == expected.tobytes()


def test_checking_finiteness_changes_no_bit_of_a_finite_encode() -> None:
    """``check_finite`` compares magnitudes as integer bit patterns: on a finite residual
    the same message and the same residual as the float comparison."""
    rng = np.random.default_rng(11)
    for r, tau in _encode_cases(rng):
        if not np.isfinite(r).all():
            continue
        plain, checked = r.copy(), r.copy()
        expected = threshold_encode(plain, tau)
        assert threshold_encode(checked, tau, check_finite=True) == expected
        assert checked.tobytes() == plain.tobytes()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", ["sparse", "before-switch", "at-switch", "after-switch"])
def test_a_non_finite_residual_is_named_and_left_unchanged(bad: float, where: str) -> None:
    """Before anything is subtracted: in the sparse phase, among the candidates that were
    flushed at the switch to the bitmap, in the chunk that switches, and past it."""
    c = CHUNK_ELEMENTS
    rng = np.random.default_rng(3)
    n = 3 * c + 11
    r = rng.normal(0, 7e-4, n).astype(np.float32)  # sparse: a few candidates at 2e-3
    if where != "sparse":
        r[c + 7 : c + 7 + n // 10] = rng.normal(0, 1e-2, n // 10)  # switches in chunk 1
    at = {"sparse": 2 * c + 5, "before-switch": 17, "at-switch": c + 3,
          "after-switch": 3 * c + 2}[where]
    r[at] = bad
    before = r.copy()
    with pytest.raises(NonFiniteError, match=rf"residual element {at} is {bad}"):
        threshold_encode(r, 2e-3, check_finite=True)
    assert r.tobytes() == before.tobytes()
    # without the check the sweep goes on as it always did: a NaN is never encoded
    threshold_encode(r, 2e-3)


def test_check_finite_takes_no_add() -> None:
    r = np.zeros(8, np.float32)
    with pytest.raises(ConfigurationError, match="check_finite needs the residual alone"):
        threshold_encode(r, 1.0, add=r.copy(), check_finite=True)
