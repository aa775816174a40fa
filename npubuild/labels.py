"""Labels (`//pkg:name`, `:name`, `//pkg`) and target patterns (`//...`, `//pkg/...`, `//pkg:all`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from npubuild.errors import UserError

_PKG_RE = re.compile(r"^[A-Za-z0-9_\-.]+(/[A-Za-z0-9_\-.]+)*$")
_NAME_RE = re.compile(r"^[A-Za-z0-9_\-.+]+$")


@dataclass(frozen=True, order=True)
class Label:
    package: str
    name: str

    def __str__(self) -> str:
        return f"//{self.package}:{self.name}"

    @property
    def out_dir(self) -> str:
        return f"{self.package}/{self.name}" if self.package else self.name


def _check_package(pkg: str, text: str) -> None:
    if pkg and (not _PKG_RE.match(pkg) or any(part in (".", "..") for part in pkg.split("/"))):
        raise UserError(f"bad label '{text}': invalid package name '{pkg}'")


# A target's name becomes a directory under npubuild-out/: keep it well inside NAME_MAX (255).
MAX_NAME_LENGTH = 128


def _check_name(name: str, text: str) -> None:
    if len(name) > MAX_NAME_LENGTH:
        raise UserError(f"bad label '{text[:40]}…': target name longer than {MAX_NAME_LENGTH} characters")
    if not name or not _NAME_RE.match(name) or name in (".", ".."):
        raise UserError(f"bad label '{text}': invalid target name '{name}'")


def parse_label(text: str, current_package: str | None = None) -> Label:
    """Parse an absolute label, or a relative `:name` when the current package is known."""
    if not isinstance(text, str) or not text:
        raise UserError(f"bad label {text!r}: expected '//package:name' or ':name'")
    if text.startswith("//"):
        body = text[2:]
        pkg, sep, name = body.partition(":")
        if not sep:
            name = pkg.rsplit("/", 1)[-1]
            if not name:
                raise UserError(f"bad label '{text}': the root package needs an explicit ':name'")
        _check_package(pkg, text)
        _check_name(name, text)
        return Label(pkg, name)
    if text.startswith(":"):
        if current_package is None:
            raise UserError(f"bad label '{text}': a relative label needs a package, write '//pkg{text}'")
        _check_name(text[1:], text)
        return Label(current_package, text[1:])
    if current_package is not None and ":" not in text and "/" not in text:
        _check_name(text, text)
        return Label(current_package, text)
    raise UserError(f"bad label '{text}': expected '//package:name' or ':name'")


@dataclass(frozen=True)
class Pattern:
    """What a command-line pattern selects: one label, every target of a package, or a subtree."""

    text: str
    package: str
    name: str | None  # None: all targets of the package(s)
    recursive: bool

    def matches(self, label: Label) -> bool:
        if self.recursive:
            return (
                not self.package
                or label.package == self.package
                or label.package.startswith(self.package + "/")
            )
        if label.package != self.package:
            return False
        return self.name is None or label.name == self.name


def parse_pattern(text: str) -> Pattern:
    if not text.startswith("//"):
        raise UserError(f"bad target pattern '{text}': patterns start with '//' (e.g. //..., //pkg:all)")
    body = text[2:]
    if body == "..." or body.endswith("/..."):
        pkg = body[:-3].rstrip("/")
        _check_package(pkg, text)
        return Pattern(text, pkg, None, True)
    pkg, sep, name = body.partition(":")
    if sep and name in ("all", "*"):
        _check_package(pkg, text)
        return Pattern(text, pkg, None, False)
    label = parse_label(text)
    return Pattern(text, label.package, label.name, False)
