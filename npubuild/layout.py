"""Where things are in a workspace: its root, its packages, glob matches. Light on purpose: the
no-op build uses it to check a cached analysis without loading the rules."""

from __future__ import annotations

import glob as globlib
import os
from pathlib import Path

from npubuild.errors import Location, UserError

WORKSPACE_FILE = "WORKSPACE"
BUILD_FILE = "BUILD"
OUT_DIR = "npubuild-out"
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
    """Files (not directories) under `directory` matching include and not exclude, sorted."""

    def expand(patterns: list[str]) -> set[str]:
        found: set[str] = set()
        for pattern in patterns:
            if not isinstance(pattern, str) or pattern.startswith("/") or ".." in pattern.split("/"):
                raise UserError(
                    f"glob pattern {pattern!r} must be relative and stay inside the package", location
                )
            for hit in globlib.glob(pattern, root_dir=directory, recursive=True):
                if os.path.isfile(directory / hit):
                    found.add(hit.replace(os.sep, "/"))
        return found

    return sorted(expand(include) - expand(exclude))
