"""A deterministic, pickle-free archive of named numpy arrays plus a JSON header.

Layout: b"NPBT" + u32 version + u64 header length + header (UTF-8 JSON: {"meta": ..., "arrays":
{name: {dtype, shape, offset, nbytes}}}) + the arrays' bytes (C order, little endian), each at a
64-byte aligned offset. Same arrays and meta in, same bytes out.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from npubuild.errors import UserError

MAGIC = b"NPBT"
VERSION = 1
_ALIGN = 64


def save(path: Path, arrays: dict[str, np.ndarray], meta: Any = None) -> Path:
    entries, blobs, offset = {}, [], 0
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        data = a.tobytes()
        pad = (-offset) % _ALIGN
        blobs.append(b"\0" * pad + data)
        offset += pad
        entries[name] = {"dtype": a.dtype.str, "shape": list(a.shape), "offset": offset, "nbytes": len(data)}
        offset += len(data)
    header = json.dumps(
        {"meta": meta, "arrays": entries}, sort_keys=True, separators=(",", ":"), allow_nan=False
    ).encode()
    with open(path, "wb") as f:
        f.write(MAGIC + struct.pack("<IQ", VERSION, len(header)) + header)
        for b in blobs:
            f.write(b)
    return path


def load(path: Path) -> tuple[dict[str, np.ndarray], Any]:
    raw = Path(path).read_bytes()
    if raw[:4] != MAGIC or len(raw) < 16:
        raise UserError(f"{path}: not an npubuild tensor archive")
    version, header_len = struct.unpack("<IQ", raw[4:16])
    if version != VERSION:
        raise UserError(f"{path}: tensor archive version {version}, this npubuild reads {VERSION}")
    header = json.loads(raw[16 : 16 + header_len])
    base = 16 + header_len
    arrays = {}
    for name, e in header["arrays"].items():
        start = base + e["offset"]
        arrays[name] = np.frombuffer(
            raw, dtype=np.dtype(e["dtype"]), count=int(np.prod(e["shape"], dtype=np.int64)), offset=start
        ).reshape(e["shape"])
    return arrays, header["meta"]
