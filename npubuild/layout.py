"""Where things are in a workspace: its root, its packages, glob matches. Light on purpose: the
no-op build uses it to check a cached analysis without loading the rules."""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path

from npubuild.errors import Location, UserError

WORKSPACE_FILE = "WORKSPACE"
BUILD_FILE = "BUILD"
OUT_DIR = "npubuild-out"
# The photographs a data set (and `npubuild run --image`) decodes; Pillow reads each.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif")
_SKIP_DIRS = {OUT_DIR, "__pycache__", "node_modules"}


def find_root(start: Path) -> Path:
    here = start.resolve()
    for candidate in (here, *here.parents):
        if (candidate / WORKSPACE_FILE).is_file():
            return candidate
    raise UserError(f"no {WORKSPACE_FILE} file in {here} or any parent directory; is this a workspace?")


def list_packages(root: Path) -> list[str]:
    """Every directory below root holding a BUILD file, as package names ('' for the root)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        if BUILD_FILE in filenames:
            rel = os.path.relpath(dirpath, root)
            found.append("" if rel == "." else rel.replace(os.sep, "/"))
    return sorted(found)


def package_dir(root: Path, package: str) -> Path:
    return root / package if package else root


def build_file(package: str) -> str:
    return f"{package}/{BUILD_FILE}" if package else BUILD_FILE


def glob_files(
    directory: Path, include: list[str], exclude: list[str], location: Location | None = None
) -> list[str]:
    """Files (not directories) under `directory` matching include and not exclude, sorted.

    Patterns read as Python's recursive glob: `*` and `?` within one name, `**` any number of
    folders, names starting with '.' only when the pattern says so. The walk never follows a
    symlinked folder (so a link loop cannot hang it); a symlinked file is listed, and whether its
    target stays in the workspace is checked where the file is used."""
    for pattern in [*include, *exclude]:
        if not isinstance(pattern, str) or pattern.startswith("/") or ".." in pattern.split("/"):
            raise UserError(
                f"glob pattern {pattern!r} must be relative and stay inside the package", location
            )
    if not include:
        return []
    wanted = [_pattern_regex(p) for p in include]
    unwanted = [_pattern_regex(p) for p in exclude]
    found = []
    for dirpath, dirnames, filenames in os.walk(directory, followlinks=False):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, directory)
        prefix = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
        for name in filenames:
            rel = prefix + name
            if any(r.match(rel) for r in wanted) and not any(r.match(rel) for r in unwanted):
                found.append(rel)
    return sorted(found)


@lru_cache(maxsize=256)
def _pattern_regex(pattern: str) -> re.Pattern:
    parts = [p for p in pattern.split("/") if p not in ("", ".")]
    out = []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            # zero or more visible folders; as the last part, any visible file below as well
            out.append(r"(?:[^/.][^/]*/)*" + (r"[^/.][^/]*" if last else ""))
            continue
        out.append(_part_regex(part) + ("" if last else "/"))
    return re.compile("".join(out) + r"\Z")


def _part_regex(part: str) -> str:
    """One name's pattern: `*`, `?` and `[...]` as fnmatch reads them; hidden names need a dot."""
    regex = "" if part.startswith(".") else r"(?!\.)"
    i = 0
    while i < len(part):
        c = part[i]
        if c == "*":
            regex += r"[^/]*"
        elif c == "?":
            regex += r"[^/]"
        elif c == "[" and "]" in part[i + 2 :] or c == "[" and part[i + 1 : i + 2] == "]":
            end = part.index("]", i + 2)
            body = part[i + 1 : end]
            body = "^" + body[1:] if body.startswith("!") else body
            regex += "[" + body.replace("\\", "\\\\").replace("[", "\\[") + "]"
            i = end
        else:
            regex += re.escape(c)
        i += 1
    return regex
