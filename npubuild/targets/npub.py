"""The .npub container: header, section table, aligned sections, SHA-256 trailer.

Layout (little-endian; docs/npub-format.md is the reference):

    0   8  magic b"NPUB\\0\\r\\n\\x1a"
    8   2  format major          10  2  format minor
    12  4  header size (64)      16 32  target digest (SHA-256 of the target spec)
    48  4  section count         52  4  section alignment (64)
    56  8  file size
    64  .  section table, 32 bytes per section:
           kind u32, reserved u32, offset u64, size u64, crc32 u32, reserved u32
    ... sections, each at a multiple of the alignment, zero padding between
    end-32  SHA-256 of every byte before it

`read` validates all of it before anything is used and raises only NpubError.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from dataclasses import dataclass, field

from npubuild.errors import UserError

MAGIC = b"NPUB\x00\r\n\x1a"
# 2.0: the conv instruction's mapping; 3.0: table shifts; 3.1: the spatial mapping of a transposed conv
# 6.0: per-channel shifts after a table (conv lut_shifts; lut shifts, per)
# 7.0: a clamp of a conv's residual sum (conv sum_min, sum_max)
FORMAT_MAJOR, FORMAT_MINOR = 7, 0
HEADER = struct.Struct("<8sHHI32sIIQ")
ENTRY = struct.Struct("<IIQQII")
ALIGN = 64
TRAILER = 32
MAX_SECTIONS = 16

SECTION_KINDS = {1: "meta", 2: "constants", 3: "code", 4: "cpu"}
KIND_IDS = {v: k for k, v in SECTION_KINDS.items()}
REQUIRED = ("meta", "code")


class NpubError(UserError):
    """A .npub that cannot be used: truncated, corrupt, of another format or version."""


@dataclass
class Npub:
    target_digest: bytes
    meta: dict
    sections: dict[str, bytes] = field(default_factory=dict)
    version: tuple[int, int] = (FORMAT_MAJOR, FORMAT_MINOR)

    @property
    def code(self) -> bytes:
        return self.sections["code"]

    @property
    def constants(self) -> bytes:
        return self.sections.get("constants", b"")


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def write(npub: Npub) -> bytes:
    """Serialise deterministically: sections in kind order, zero padding, then the trailer."""
    if len(npub.target_digest) != 32:
        raise ValueError("target digest must be 32 bytes")
    payloads = dict(npub.sections)
    payloads["meta"] = json.dumps(npub.meta, sort_keys=True, separators=(",", ":")).encode()
    kinds = sorted(payloads, key=lambda k: KIND_IDS[k])
    offset = _aligned(HEADER.size + ENTRY.size * len(kinds))
    table, layout = [], []
    for kind in kinds:
        data = payloads[kind]
        table.append(ENTRY.pack(KIND_IDS[kind], 0, offset, len(data), zlib.crc32(data), 0))
        layout.append((offset, data))
        offset = _aligned(offset + len(data))
    size = offset + TRAILER
    out = bytearray(size - TRAILER)
    out[: HEADER.size] = HEADER.pack(
        MAGIC, FORMAT_MAJOR, FORMAT_MINOR, HEADER.size, npub.target_digest, len(kinds), ALIGN, size
    )
    table_bytes = b"".join(table)
    out[HEADER.size : HEADER.size + len(table_bytes)] = table_bytes
    for start, data in layout:
        out[start : start + len(data)] = data
    return bytes(out) + hashlib.sha256(out).digest()


def read(data: bytes, where: str = ".npub") -> Npub:
    """Parse and validate a whole binary; every failure is one NpubError naming what is wrong."""

    def fail(message: str) -> NpubError:
        return NpubError(f"{where}: {message}")

    data = bytes(data)
    if len(data) < HEADER.size + TRAILER:
        raise fail(f"truncated: {len(data)} bytes is shorter than a header and trailer")
    magic, major, minor, header_size, digest, count, align, size = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise fail("not an npubuild binary (bad magic)")
    if major > FORMAT_MAJOR:
        raise fail(f"format {major}.{minor} is newer than this npubuild reads ({FORMAT_MAJOR}.x); upgrade it")
    if major < 1:
        raise fail(f"unknown format version {major}.{minor}")
    if header_size != HEADER.size or align != ALIGN:
        raise fail(f"bad header (header size {header_size}, alignment {align})")
    if size != len(data):
        raise fail(f"truncated or padded: header says {size} bytes, file has {len(data)}")
    if hashlib.sha256(data[:-TRAILER]).digest() != data[-TRAILER:]:
        raise fail("checksum mismatch (corrupt file)")
    if not 0 < count <= MAX_SECTIONS:
        raise fail(f"bad section count {count}")
    table_end = HEADER.size + ENTRY.size * count
    if table_end > len(data) - TRAILER:
        raise fail("section table runs past the end of the file")
    sections: dict[str, bytes] = {}
    spans = []
    for i in range(count):
        kind_id, _, offset, length, crc, _ = ENTRY.unpack_from(data, HEADER.size + ENTRY.size * i)
        kind = SECTION_KINDS.get(kind_id)
        if kind is None:
            raise fail(f"section {i} has unknown kind {kind_id}")
        if kind in sections:
            raise fail(f"section '{kind}' appears twice")
        if offset % ALIGN or offset < table_end or offset + length > len(data) - TRAILER:
            raise fail(f"section '{kind}' lies outside the file or is misaligned")
        payload = data[offset : offset + length]
        if zlib.crc32(payload) != crc:
            raise fail(f"section '{kind}' is corrupt (CRC mismatch)")
        spans.append((offset, offset + length, kind))
        sections[kind] = payload
    spans.sort()
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        if start < end:
            raise fail(f"sections '{a}' and '{b}' overlap")
    missing = [k for k in REQUIRED if k not in sections]
    if missing:
        raise fail(f"missing section '{missing[0]}'")
    try:
        meta = json.loads(sections.pop("meta").decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise fail(f"metadata is not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise fail("metadata must be a JSON object")
    return Npub(target_digest=digest, meta=meta, sections=sections, version=(major, minor))
