"""The one exception type a user ever sees: a message with an optional source location."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Location:
    path: str
    line: int = 0
    col: int = 0

    def __str__(self) -> str:
        if not self.line:
            return self.path
        return f"{self.path}:{self.line}:{self.col}" if self.col else f"{self.path}:{self.line}"


class UserError(Exception):
    """A problem in the user's workspace, inputs or command line; printed as one line, no traceback."""

    def __init__(self, message: str, location: Location | None = None):
        super().__init__(message)
        self.message = message
        self.location = location

    def __str__(self) -> str:
        return f"{self.location}: {self.message}" if self.location else self.message


def one_line(exc: BaseException, limit: int = 300) -> str:
    """Another library's exception (onnx's checker, onnxruntime) as one line: its lines joined (a
    checker message breaks lines inside its sentence), at most `limit` characters, or the type's
    name when it says nothing."""
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return text[:limit] if text else type(exc).__name__
