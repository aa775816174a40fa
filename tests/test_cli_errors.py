"""Every command-line mistake and bad input file is one `error:` line with the right exit code."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from conftest import cli, write
from npubuild.targets import npub


def _one_error(proc: subprocess.CompletedProcess, code: int = 1) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    return lines[0]


@pytest.fixture
def empty_ws(tmp_path):
    write(tmp_path / "ws" / "WORKSPACE", "")
    return tmp_path / "ws"


def test_an_unknown_option_is_a_usage_error(empty_ws, tmp_path):
    line = _one_error(cli(["build", "//...", "--bogus"], empty_ws, tmp_path / "cache"), 2)
    assert "No such option: --bogus" in line


def test_usage_errors_need_no_click_package(empty_ws, tmp_path):
    """typer 0.29 vendors click; the error handler must not import the click package."""
    code = (
        "import sys; sys.modules['click'] = None\n"
        "sys.argv = ['npubuild', 'nosuchcommand']\n"
        "from npubuild.cli import main; main()\n"
    )
    env = {**os.environ, "NPUBUILD_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", code], cwd=empty_ws, env=env, capture_output=True, text=True)
    assert "No such command" in _one_error(proc, 2)


def _npy(array) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _npz() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        archive.writestr("x.npy", _npy(np.zeros((1, 3, 48, 192), np.float32)))
    return buf.getvalue()


@pytest.mark.parametrize(
    "name, data, message",
    [
        ("empty.npy", _npy(np.zeros((0,), np.float32)), "the array is empty"),
        ("zero.npy", b"", "not a .npy array"),
        ("several.npz", _npz(), "a .npz holds several arrays"),
        ("photo.jpg", b"\xff\xd8\xff\xe0 a jpeg", "an image, not a .npy array; pass it as --image"),
        ("text.npy", b"x", "not a .npy array (no .npy header)"),
        ("missing.npy", None, "no such file"),
    ],
    ids=lambda value: value if isinstance(value, str) and len(value) < 40 else "",
)
def test_run_refuses_bad_inputs(cls_binary, tmp_path, name, data, message):
    if data is not None:
        (tmp_path / name).write_bytes(data)
    line = _one_error(cli(["run", str(cls_binary), "--input", name], tmp_path, tmp_path / "cache"))
    assert message in line


def test_run_refuses_an_output_path_that_is_a_file(cls_binary, tmp_path):
    (tmp_path / "x.npy").write_bytes(_npy(np.zeros((1, 3, 48, 192), np.float32)))
    (tmp_path / "out").write_text("a file")
    line = _one_error(cli(["run", str(cls_binary), "-i", "x.npy", "-o", "out"], tmp_path, tmp_path / "c"))
    assert "is a file" in line


def test_a_binary_asking_for_a_huge_sram_is_refused(cls_binary, tmp_path):
    binary = npub.read(cls_binary.read_bytes())
    meta = dict(binary.meta)
    meta["target"] = {**meta["target"], "sram_kib": 2**40}
    forged = tmp_path / "huge.npub"
    forged.write_bytes(npub.write(npub.Npub(binary.target_digest, meta, binary.sections, binary.version)))
    (tmp_path / "x.npy").write_bytes(_npy(np.zeros((1, 3, 48, 192), np.float32)))
    line = _one_error(cli(["run", str(forged), "-i", "x.npy"], tmp_path, tmp_path / "cache"))
    assert "sram_kib" in line


def test_targets_needing_the_same_output_path_are_one_error(cls_model, tmp_path):
    ws = tmp_path / "ws"
    write(ws / "WORKSPACE", "")
    (ws / "a").mkdir()
    (ws / "a" / "m.onnx").write_bytes(cls_model.read_bytes())
    write(ws / "a" / "BUILD", 'onnx_model(name = "b", src = "m.onnx")\n')
    write(ws / "a" / "b" / "BUILD", 'onnx_model(name = "canonical.onnx", src = "m.onnx")\n')
    (ws / "a" / "b" / "m.onnx").write_bytes(cls_model.read_bytes())
    line = _one_error(cli(["build", "//...", "--until", "import"], ws, tmp_path / "cache"))
    assert "npubuild-out/a/b/canonical.onnx" in line and "//a:b" in line
