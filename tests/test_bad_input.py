"""Bad input through the real command line: one clear line naming file:line where there is one,
exit code 1, no traceback, and nothing wrong left in the cache."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import CLS, cli, write
from npubuild.cache.store import Store


def error_lines(proc) -> list[str]:
    return [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]


def assert_one_clear_error(proc, *fragments: str) -> str:
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = error_lines(proc)
    assert len(lines) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def ac_entries(cache) -> int:
    store = Store(cache)
    try:
        return store.stats()["ac"]
    finally:
        store.close()


@pytest.fixture(scope="module")
def built_once(small_build):
    """The small workspace and its cache, built once per session (conftest.small_build)."""
    return small_build / "ws", small_build / "cache"


@pytest.fixture
def built(built_once, tmp_path):
    """A private copy of the built workspace and its cache (each test edits and rebuilds its own);
    returns (workspace, cache)."""
    ws, cache = (shutil.copytree(src, tmp_path / src.name, symlinks=True) for src in built_once)
    return ws, cache


def edit(path, old, new):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


BUILD_ERRORS = [
    ("syntax", 'npu_model(name = "x",\n', "models/BUILD:", "syntax error"),
    ("unknown rule", 'onnx_modle(name = "x")\n', "models/BUILD:", "unknown rule or function 'onnx_modle'"),
    (
        "unknown attribute",
        'onnx_model(name = "x", src = "cls.onnx", inputshape = 1)\n',
        "models/BUILD:",
        "unknown attribute 'inputshape'",
    ),
    (
        "mistyped attribute",
        'onnx_model(name = "x", src = "cls.onnx", input_shapes = [1, 3])\n',
        "models/BUILD:",
        "attribute 'input_shapes'",
    ),
    ("missing name", 'onnx_model(src = "cls.onnx")\n', "models/BUILD:", "missing required attribute 'name'"),
    (
        "duplicate target",
        'onnx_model(name = "cls", src = "cls.onnx")\n',
        "models/BUILD:",
        "duplicate target 'cls'",
    ),
    (
        "bad label",
        'npu_model(name = "x", model = "cls::a", calibration = "//data:calib")\n',
        "models/BUILD:",
        "bad label",
    ),
    (
        "missing source",
        'onnx_model(name = "x", src = "nope.onnx")\n',
        "models/BUILD:",
        "source file 'nope.onnx' does not exist",
    ),
    (
        "wrong kind",
        'npu_model(name = "x", model = "//data:calib", calibration = "//data:calib")\n',
        "models/BUILD:",
        "must name a onnx_model",
    ),
    (
        "unknown pass",
        'npu_model(name = "x", model = ":cls", calibration = "//data:calib", '
        'optimize = {"disable": ["fold_everything"]})\n',
        "models/BUILD:",
        "unknown pass 'fold_everything'",
    ),
    (
        "impossible target",
        'npu_target(name = "t", base = "vnpu-s", sram_kib = 0)\n',
        "models/BUILD:",
        "sram_kib",
    ),
    (
        "negative bandwidth",
        'npu_target(name = "t", dram_bytes_per_cycle = -1.0)\n',
        "models/BUILD:",
        "dram_bytes_per_cycle",
    ),
]


@pytest.mark.parametrize("name, appended, where, message", BUILD_ERRORS, ids=[c[0] for c in BUILD_ERRORS])
def test_build_file_errors(built, name, appended, where, message):
    ws, cache = built
    before = ac_entries(cache)
    build = ws / "models" / "BUILD"
    good = build.read_text()
    build.write_text(good + "\n" + appended)
    line = assert_one_clear_error(cli(["build", "//..."], ws, cache), where, message)
    assert line.split(":")[2].strip().isdigit(), line  # error: models/BUILD:LINE...
    assert ac_entries(cache) == before
    build.write_text(good)
    again = cli(["build", "//..."], ws, cache)
    assert again.returncode == 0 and "Build OK" in again.stdout


def test_unknown_target_in_pattern(built):
    ws, cache = built
    assert_one_clear_error(cli(["build", "//models:nope"], ws, cache), "no target 'nope'", "cls_npu")
    assert_one_clear_error(cli(["build", "//nothere/..."], ws, cache), "matches no target")
    assert_one_clear_error(cli(["build", "models"], ws, cache), "bad target pattern")


def test_dependency_cycle(built):
    ws, cache = built
    write(ws / "hw" / "BUILD", 'npu_target(name = "a", base = ":b")\nnpu_target(name = "b", base = ":a")\n')
    assert_one_clear_error(
        cli(["build", "//hw:a"], ws, cache), "hw/BUILD:", "dependency cycle", "//hw:a -> //hw:b"
    )


def test_corrupt_onnx_fails_import_and_leaves_no_entry(built):
    ws, cache = built
    before = ac_entries(cache)
    model = ws / "models" / "cls.onnx"
    good = model.read_bytes()
    model.write_bytes(b"\x08\x07garbage" + good[:1000])
    proc = cli(["build", "//models:cls"], ws, cache)
    assert_one_clear_error(proc, "models/BUILD:1:1", "import //models:cls", "not a valid ONNX model")
    assert ac_entries(cache) == before
    model.write_bytes(good)
    assert cli(["build", "//models:cls"], ws, cache).returncode == 0


def test_dynamic_dimension_without_declared_shape(built):
    ws, cache = built
    edit(ws / "models" / "BUILD", '    input_shapes = {"x": [1, 3, 48, 192]},\n', "")
    assert_one_clear_error(
        cli(["build", "//models:cls"], ws, cache),
        "models/BUILD:1:1",
        "dynamic dimension",
        "declare input_shapes",
    )


def test_declared_shape_that_contradicts_the_model(built):
    ws, cache = built
    edit(ws / "models" / "BUILD", '{"x": [1, 3, 48, 192]}', '{"x": [1, 4, 48, 192]}')
    assert_one_clear_error(cli(["build", "//models:cls"], ws, cache), "fixes it to 3")


def test_undecodable_image(built):
    ws, cache = built
    (ws / "data" / "calib" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really a png")
    assert_one_clear_error(
        cli(["build", "//data:calib"], ws, cache),
        "data/BUILD:",
        "prepare //data:calib",
        "calib/broken.png: cannot decode image",
    )


def test_sample_shape_that_does_not_fit_the_model(built):
    ws, cache = built
    edit(ws / "data" / "BUILD", '"resize": [48, 192]', '"resize": [64, 64]')
    assert_one_clear_error(
        cli(["build", "//models:cls_npu"], ws, cache), "models/BUILD:", "optimize", "expects [1, 3, 48, 192]"
    )


def test_sha256_mismatch_of_a_pinned_wheel_file(built):
    ws, cache = built
    spec = dict(CLS, sha256="0" * 64)
    write(
        ws / "ext" / "BUILD",
        "onnx_model(name = 'm', src = pypi_file(**{}), input_shapes = {})\n".replace(
            "pypi_file(**{})",
            "pypi_file(" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in spec.items()) + ")",
        ),
    )
    proc = cli(["build", "//ext:m"], ws, cache)
    assert_one_clear_error(proc, "ext/BUILD:1:1", "sha256 mismatch", "BUILD pins " + "0" * 64, CLS["sha256"])


def test_not_a_workspace(tmp_path):
    proc = cli(["build", "//..."], tmp_path, tmp_path / "cache")
    assert_one_clear_error(proc, "no WORKSPACE file")


def test_keep_going_builds_what_does_not_depend_on_a_failure(built):
    ws, cache = built
    (ws / "data" / "eval" / "broken.png").write_bytes(b"nope")
    edit(ws / "models" / "BUILD", '"check_samples": 2', '"check_samples": 1')
    stop = cli(["build", "//...", "-j", "1"], ws, cache)
    assert stop.returncode == 1
    going = cli(["build", "//...", "-j", "1", "--keep-going"], ws, cache)
    assert going.returncode == 1
    assert "ran optimize //models:cls_npu" in going.stderr  # independent of the broken eval set
    assert len(error_lines(going)) == 1


def test_missing_cache_dir_parent_is_created(small_ws, tmp_path):
    cache = tmp_path / "deep" / "er" / "cache"
    assert cli(["build", "//data:calib"], small_ws, cache).returncode == 0
    shutil.rmtree(cache)


def test_calibration_set_of_zero_images(built):
    ws, cache = built
    write(
        ws / "data" / "BUILD",
        (ws / "data" / "BUILD").read_text()
        + 'dataset(name = "empty", srcs = glob(["nothing/*.png"]), preprocess = PRE)\n',
    )
    edit(ws / "models" / "BUILD", 'calibration = "//data:calib"', 'calibration = "//data:empty"')
    assert_one_clear_error(
        cli(["build", "//models:cls_npu"], ws, cache), "data/BUILD:", "//data:empty", "lists no files"
    )


def test_override_that_matches_no_node_is_a_warning_naming_it(built):
    ws, cache = built
    edit(
        ws / "models" / "BUILD",
        '    optimize = {"check_samples": 2},\n',
        '    optimize = {"check_samples": 2},\n    overrides = [{"match": "backbone.*", "bits": 16}],\n',
    )
    proc = cli(["build", "//models:cls_npu"], ws, cache)
    assert proc.returncode == 0, proc.stderr
    warnings = [ln for ln in proc.stdout.splitlines() if ln.startswith("warning:")]
    assert any("'backbone.*'" in w and "matches no node" in w for w in warnings), proc.stdout


def test_report_before_any_build_is_a_clear_error(small_ws, tmp_path):
    proc = cli(["report", "//models:cls_npu"], small_ws, tmp_path / "cache")
    assert_one_clear_error(proc, "no accuracy report for //models:cls_npu")


def test_unknown_quantize_method_is_an_attribute_error(built):
    ws, cache = built
    edit(
        ws / "models" / "BUILD",
        '    optimize = {"check_samples": 2},\n',
        '    optimize = {"check_samples": 2},\n    quantize = {"method": "magic"},\n',
    )
    assert_one_clear_error(cli(["build", "//..."], ws, cache), "models/BUILD:", "attribute 'quantize.method'")


def test_convolution_smoothing_without_a_strength_is_an_attribute_error(built):
    ws, cache = built
    edit(
        ws / "models" / "BUILD",
        '    optimize = {"check_samples": 2},\n',
        '    optimize = {"check_samples": 2},\n'
        '    quantize = {"smooth": None, "smooth_convolutions": True},\n',
    )
    assert_one_clear_error(
        cli(["build", "//..."], ws, cache), "models/BUILD:", "smooth_convolutions migrates"
    )


def test_symlinks_leaving_the_workspace_are_refused_and_loops_do_not_hang(tmp_path):
    import time

    from conftest import cli, write

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.png").write_bytes(b"not yours")
    ws = tmp_path / "ws"
    write(ws / "WORKSPACE", "")
    write(ws / "data" / "BUILD", 'dataset(name = "d", srcs = glob(["**/*.png"]))\nX = glob(["**"])\n')
    (ws / "data" / "img").mkdir()
    (ws / "data" / "img" / "loop").symlink_to("..")  # a folder that contains itself
    (ws / "data" / "a").symlink_to("b")
    (ws / "data" / "b").symlink_to("a")  # two links pointing at each other
    (ws / "data" / "secret.png").symlink_to(outside / "secret.png")
    started = time.monotonic()
    proc = cli(["query", "//..."], ws, tmp_path / "cache", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - started < 30
    proc = cli(["build", "//data:d"], ws, tmp_path / "cache", timeout=120)
    assert proc.returncode == 1
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "outside the workspace" in errors[0] and "secret.png" in errors[0], (
        proc.stderr
    )
