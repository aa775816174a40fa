"""The messages a new user meets first, each as the user sees it through the command line: labels
printed as written, `run` on a photo, `disasm` and `report` of a label, a mistyped built-in target
and a pypi_file without its sha256."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from conftest import MODELS_BUILD, cli, make_small_ws, write
from npubuild.targets.npub import read
from npubuild.targets.runtime import Runtime

# The small workspace with names rich would have read as emoji codes (":rocket:", ":m:").
RENAMED = MODELS_BUILD.replace('name = "cls"', 'name = "rocket"').replace('":cls"', '":rocket"')
RENAMED = RENAMED.replace('name = "cls_npu"', 'name = "m"')


@pytest.fixture(scope="module")
def built(tmp_path_factory, cls_model):
    """(workspace, cache, the build's output) of the renamed small workspace, built once."""
    root = tmp_path_factory.mktemp("messages")
    ws = make_small_ws(root / "ws", cls_model)
    write(ws / "models" / "BUILD", RENAMED)
    cache = root / "cache"
    proc = cli(["build", "//...", "-j", "1"], ws, cache)
    assert proc.returncode == 0, proc.stderr
    return ws, cache, proc.stdout + proc.stderr


def one_error(proc) -> str:
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def test_labels_print_as_written(built, tmp_path):
    ws, _, printed = built
    assert "//models:rocket" in printed and "//models:m" in printed
    # an error line that names the model with a colon after it, as every stage error does
    bad = shutil.copytree(ws, tmp_path / "ws", ignore=shutil.ignore_patterns("npubuild-out"))
    text = (bad / "models" / "BUILD").read_text()
    write(bad / "models" / "BUILD", text.replace('{"x": [1, 3, 48, 192]}', '{"y": [1, 3, 48, 192]}'))
    proc = cli(["build", "//models:rocket"], bad, tmp_path / "cache")
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert proc.returncode == 1 and "import //models:rocket: input_shapes names 'y'" in line, line


def test_run_on_a_photo_applies_the_calibration_preprocessing(built, tmp_path):
    ws, cache, _ = built
    photo = sorted((ws / "data" / "calib").glob("*.png"))[0]
    proc = cli(["run", "//models:m", "--image", str(photo), "-o", str(tmp_path / "o")], ws, cache)
    assert proc.returncode == 0, proc.stderr
    (written,) = list((tmp_path / "o").glob("*.npy"))
    # the calibration set's own tensor of that photo (sources are sorted), through the same binary
    tensors = np.load(ws / "npubuild-out" / "data" / "calib" / "tensors.npy")
    runtime = Runtime(read((ws / "npubuild-out" / "models" / "m" / "model.npub").read_bytes()))
    (expected,) = runtime.run({"x": tensors[:1]}).values()
    np.testing.assert_array_equal(np.load(written), expected)


def test_run_points_a_photo_given_as_input_to_image(built):
    ws, cache, _ = built
    photo = sorted((ws / "data" / "calib").glob("*.png"))[0]
    line = one_error(cli(["run", "//models:m", "--input", str(photo)], ws, cache))
    assert "an image, not a .npy array" in line and f"--image {photo}" in line


def test_disasm_and_report_take_labels_and_files(built):
    ws, cache, _ = built
    listing = (ws / "npubuild-out" / "models" / "m" / "model.lst").read_text()
    for what in ("//models:m", "npubuild-out/models/m/model.npub"):
        proc = cli(["disasm", what], ws, cache)
        assert proc.returncode == 0 and proc.stdout == listing, proc.stderr
    by_label = cli(["report", "//models:m"], ws, cache)
    by_file = cli(["report", "npubuild-out/models/m/accuracy.json"], ws, cache)
    assert by_label.returncode == by_file.returncode == 0, by_label.stderr + by_file.stderr
    assert "//models:m" in by_label.stdout and by_file.stdout == by_label.stdout


def test_report_of_a_dataset_names_the_models_it_can_report(built):
    ws, cache, _ = built
    line = one_error(cli(["report", "//data:calib"], ws, cache))
    assert "//data:calib is a dataset" in line and "//models:m" in line and "build" not in line


def test_a_mistyped_builtin_target_names_the_builtins(built, tmp_path):
    ws, cache, _ = built
    bad = shutil.copytree(ws, tmp_path / "ws", ignore=shutil.ignore_patterns("npubuild-out"))
    text = (bad / "models" / "BUILD").read_text()
    write(bad / "models" / "BUILD", text.replace('name = "m",', 'name = "m",\n    target = "vnpu-xl",'))
    line = one_error(cli(["build", "//models:m"], bad, tmp_path / "cache"))
    assert "models/BUILD:" in line and "no built-in target 'vnpu-xl'" in line
    assert "vnpu-m, vnpu-s" in line


def test_a_pypi_file_without_sha256_says_how_to_get_it(built, tmp_path):
    ws, cache, _ = built
    bad = shutil.copytree(ws, tmp_path / "ws", ignore=shutil.ignore_patterns("npubuild-out"))
    with open(bad / "models" / "BUILD", "a") as f:
        f.write('onnx_model(name = "p", src = pypi_file(package = "nudenet", version = "3.4.2",\n')
        f.write('    path = "nudenet/320n.onnx"))\n')
    line = one_error(cli(["build", "//models:p"], bad, tmp_path / "cache"))
    assert "models/BUILD:" in line and "missing required attribute 'sha256'" in line
    assert "pip download nudenet==3.4.2 --no-deps" in line and "nudenet/320n.onnx | sha256sum" in line


def test_no_evaluation_set_and_a_failed_gate_are_warnings(built, tmp_path):
    ws, cache, printed = built
    assert "declares no evaluation" not in printed and "fails its gate" not in printed
    bad = shutil.copytree(ws, tmp_path / "ws", ignore=shutil.ignore_patterns("npubuild-out"))
    text = (bad / "models" / "BUILD").read_text()
    text = text.replace('    evaluation = "//data:eval",\n', '    gates = {"min_cosine": 0.999999},\n')
    write(bad / "models" / "BUILD", text)
    # a copy of the module's cache: the stages up to quantize are the same and come from it
    proc = cli(["build", "//models:m"], bad, shutil.copytree(cache, tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr
    warnings = [ln for ln in proc.stdout.splitlines() if ln.startswith("warning:")]
    assert any("//models:m declares no evaluation data set" in w and "//data:calib" in w for w in warnings)
    assert any("//models:m fails its gate min_cosine" in w for w in warnings), proc.stdout


def test_an_output_far_from_float_is_a_warning_unless_gates_decide():
    from npubuild.engine.actions import TargetPlan
    from npubuild.labels import Label
    from npubuild.report import _verdicts

    evaluate = {"outputs": {"maps": {"cosine": 0.2488, "sqnr_db": -0.3}, "ok": {"cosine": 0.999}}}
    plan = TargetPlan(Label("models", "det"), "npu_model")
    (warning,) = _verdicts(plan, {"evaluate": evaluate})
    assert "//models:det output 'maps': cosine 0.2488" in warning
    plan.gates = {"min_cosine": 0.2}  # the user's own bar, met: no warning
    assert _verdicts(plan, {"evaluate": evaluate}) == []


def test_help_shows_flags_as_flags(tmp_path):
    for command in ("build", "test", "report", "clean"):
        proc = cli([command, "--help"], tmp_path, tmp_path / "cache")
        assert proc.returncode == 0 and "--help" in proc.stdout, proc.stderr
        assert "<bool>" not in proc.stdout, proc.stdout
    assert "default: CPUs" in cli(["test", "--help"], tmp_path, tmp_path / "cache").stdout


def test_report_rows_follow_the_graph_and_name_each_layer_once(built):
    import json

    import onnx

    ws, cache, _ = built
    out = ws / "npubuild-out" / "models" / "m"
    graph = onnx.load(out / "optimized.onnx").graph
    position = {o: k for k, n in enumerate(graph.node) for o in n.output}
    rows = json.loads((out / "accuracy.json").read_text())["layers"]
    assert len(rows) > 10
    order = [position[r["tensor"]] for r in rows]
    assert order == sorted(order)  # graph order, not name order ('model.10' before 'model.2')
    names = [r["node"] + str(r.get("output", "")) for r in rows]
    assert len(names) == len(set(names))
    printed = cli(["report", "//models:m"], ws, cache).stdout
    first, last = rows[0]["node"], rows[-1]["node"]
    assert printed.index(first) < printed.index(last)


def test_report_of_a_pattern_is_one_line_per_model_from_the_cache_alone(built, tmp_path):
    ws, cache, _ = built
    bare = shutil.copytree(ws, tmp_path / "ws", ignore=shutil.ignore_patterns("npubuild-out"))
    proc = cli(["report", "//..."], bare, cache)
    assert proc.returncode == 0, proc.stderr
    (row,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("//models:m ")]
    simulated = (ws / "npubuild-out" / "models" / "m" / "simulate.json").read_text()
    assert ("bit-exact" in row) == ('"ok": true' in simulated), row
    assert "cos 0." in row and "ms vnpu-m" in row and "none" in row  # no gates declared
    page = cli(["report", "//...", "--html"], bare, cache)
    assert page.returncode == 0, page.stderr
    dashboard = (bare / "npubuild-out" / "report.html").read_text()
    assert '<a href="models/m/report.html">//models:m</a>' in dashboard
    assert "//models:m" in (bare / "npubuild-out" / "models" / "m" / "report.html").read_text()
    line = one_error(cli(["report", "//data:all"], bare, cache))
    assert "matches no npu_model" in line


@pytest.mark.parametrize("width", [60, 100, 130, 200])
def test_summary_rows_are_cut_only_in_the_accuracy_column(width):
    import io

    from rich.console import Console

    from npubuild.overview import COLUMNS, print_rows

    headers = ["target", "ran", "cached", *COLUMNS]
    accuracy = "mixed int8/int16 cos 0.9994 SQNR 28.8 dB top-1 1.000 (maps, worst of 2)"
    rows = [["//models:ocr_cls", "all 13 steps", "-", accuracy, "cos 0.9997", "100%", "109/113"]]
    rows[0] += ["1.27 ms vnpu-s", "bit-exact", "FAIL min_cosine"]
    console = Console(file=io.StringIO(), width=width, highlight=False)
    print_rows(console, headers, rows)
    text = console.file.getvalue()
    for cell in rows[0][:3] + rows[0][4:]:  # every other cell whole, whatever the width
        assert cell in text.replace("\n", " ") or cell in text, (width, text)
    if width >= 130:  # a table: no line longer than the terminal
        assert max(len(ln) for ln in text.splitlines()) <= width, text
