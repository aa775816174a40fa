"""sha256 digests of bytes, files and canonical JSON."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

CHUNK = 1 << 20
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")  # a digest as the store and the remote name it


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def canonical_json(value: Any) -> str:
    """One text per value: sorted keys, no spaces, so equal values hash equally."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def sha256_json(value: Any) -> str:
    return sha256_bytes(canonical_json(value).encode())
