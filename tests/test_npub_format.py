"""The .npub container: round trip, each kind of damage named, and a fuzzed loader."""

from __future__ import annotations

import hashlib
import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npubuild.targets import npub
from npubuild.targets.npub import ENTRY, FORMAT_MAJOR, HEADER, TRAILER, Npub, NpubError


def sample() -> bytes:
    return npub.write(
        Npub(
            target_digest=hashlib.sha256(b"vnpu-s").digest(),
            meta={"inputs": [{"name": "x", "shape": [1, 3, 8, 8], "scale": 0.5, "zero_point": -3}]},
            sections={"code": bytes(range(64)) * 2, "constants": b"\x07" * 100},
        )
    )


def reseal(data: bytes, fix_crcs: bool = False) -> bytes:
    """Recompute the trailer (and optionally every section CRC) so deeper checks are reached."""
    data = bytearray(data[:-TRAILER])
    if fix_crcs and len(data) >= HEADER.size:
        count = min(HEADER.unpack_from(data)[5], 64)
        for i in range(count):
            at = HEADER.size + ENTRY.size * i
            if at + ENTRY.size > len(data):
                break
            kind, r0, offset, size, _, r1 = ENTRY.unpack_from(data, at)
            payload = bytes(data[offset : offset + size]) if offset + size <= len(data) else b""
            ENTRY.pack_into(data, at, kind, r0, offset, size, zlib.crc32(payload), r1)
    return bytes(data) + hashlib.sha256(data).digest()


def test_round_trip_is_exact_and_deterministic():
    data = sample()
    loaded = npub.read(data)
    assert loaded.meta["inputs"][0]["zero_point"] == -3
    assert loaded.code == bytes(range(64)) * 2 and loaded.constants == b"\x07" * 100
    assert npub.write(loaded) == data
    assert len(data) % 64 == TRAILER % 64  # sections aligned, then the 32-byte trailer


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: d[:100], "truncated"),
        (lambda d: d[:-1], "truncated or padded"),
        (lambda d: b"XPUB" + d[4:], "bad magic"),
        (lambda d: d[:200] + bytes([d[200] ^ 0x10]) + d[201:], "checksum mismatch"),
        (lambda d: reseal(d[:8] + struct.pack("<H", FORMAT_MAJOR + 1) + d[10:]), "newer than this npubuild"),
        (lambda d: reseal(d[:200] + bytes([d[200] ^ 0x10]) + d[201:]), "CRC mismatch"),
    ],
)
def test_each_kind_of_damage_is_one_clear_error(damage, message):
    with pytest.raises(NpubError, match=message):
        npub.read(damage(sample()))


@settings(max_examples=1200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=8),
    st.integers(0, 2),
)
def test_fuzzed_bytes_raise_only_the_loader_error(flips, mode):
    data = bytearray(sample())
    for position, value in flips:
        data[position % len(data)] = value
    candidate = bytes(data) if mode == 0 else reseal(bytes(data), fix_crcs=mode == 2)
    try:
        npub.read(candidate)
    except NpubError:
        return
    # only a binary whose trailer matches can load; unsealed damage never does
    assert mode != 0 or candidate == sample()


@settings(max_examples=800, deadline=None)
@given(st.integers(0, 2000), st.binary(max_size=64), st.integers(0, 2))
def test_fuzzed_truncation_and_insertion_raise_only_the_loader_error(cut, insert, mode):
    data = sample()
    cut %= len(data)
    candidate = data[:cut] + insert + data[cut + len(insert) // 2 :]
    if mode:
        candidate = reseal(candidate, fix_crcs=mode == 2)
    try:
        npub.read(candidate)
    except NpubError:
        pass
