"""`npubuild test`: gates from BUILD, exit codes 0 / 3 / 1, and JUnit XML."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from conftest import cli

MARKER = '    optimize = {"check_samples": 2},\n'


def with_gates(ws, gates: str) -> None:
    build = ws / "models" / "BUILD"
    text = build.read_text()
    assert MARKER in text
    build.write_text(text.replace(MARKER, MARKER + f"    gates = {gates},\n"))


def junit(ws):
    return ET.parse(ws / "npubuild-out" / "testlogs" / "junit.xml").getroot()


def test_passing_gates_exit_0_with_junit(small_ws, warm_cache):
    with_gates(small_ws, '{"min_cosine": 0.9, "min_top1": 0.5, "max_latency_ms": 100.0}')
    proc = cli(["test", "//models:cls_npu"], small_ws, warm_cache)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("PASS //models:cls_npu") == 3
    suite = junit(small_ws)
    assert suite.get("tests") == "1" and suite.get("failures") == "0"
    (case,) = suite.iter("testcase")
    assert case.get("name") == "//models:cls_npu" and case.find("failure") is None


def test_a_failing_gate_exits_3_and_names_it(small_ws, warm_cache):
    # a latency no NPU meets, and an accuracy that int8 on this model does not reach
    with_gates(small_ws, '{"min_cosine": 0.9, "max_latency_ms": 0.001, "min_sqnr": 60.0}')
    proc = cli(["test", "//models:cls_npu"], small_ws, warm_cache)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "PASS //models:cls_npu min_cosine" in proc.stdout
    assert "FAIL //models:cls_npu max_latency_ms" in proc.stdout
    assert "FAIL //models:cls_npu min_sqnr" in proc.stdout
    suite = junit(small_ws)
    assert suite.get("failures") == "1"
    messages = [f.get("message") for f in suite.iter("failure")]
    assert len(messages) == 2 and any(m.startswith("max_latency_ms") for m in messages)


def test_a_build_error_exits_1(small_ws, tmp_path):
    with_gates(small_ws, '{"min_cosine": 0.9}')
    (small_ws / "data" / "calib" / "astronaut.png").write_bytes(b"not an image")
    proc = cli(["test", "//models:cls_npu"], small_ws, tmp_path / "cache")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    (case,) = junit(small_ws).iter("testcase")
    assert case.find("error") is not None


def test_html_report_is_self_contained_and_has_every_section(small_ws, warm_cache):
    import re

    cache = warm_cache
    assert cli(["build", "//models:cls_npu"], small_ws, cache).returncode == 0
    proc = cli(["report", "//models:cls_npu", "--html"], small_ws, cache)
    assert proc.returncode == 0, proc.stderr
    page = (small_ws / "npubuild-out" / "models" / "cls_npu" / "report.html").read_text()
    # nothing fetched: no external URLs, scripts, stylesheets or images by reference
    assert not re.search(r"(src|href)\s*=", page) and "http" not in page.replace("http://www.w3.org", "")
    assert "<script" not in page and "<link" not in page
    for section in (
        "Pipeline",
        "Accuracy of the integer model",
        "Partition on",
        "Cycles per layer",
        "Roofline",
    ):
        assert section in page, section
    assert page.count("<svg") >= 4
    # every layer of the accuracy report has a bar
    import json

    layers = json.loads((small_ws / "npubuild-out" / "models" / "cls_npu" / "accuracy.json").read_text())[
        "layers"
    ]
    assert all(f"{r['node']} ({r['op_type']})"[:48] in page for r in layers)


def test_top1_is_measured_on_the_class_axis():
    """A recogniser's [1, T, classes] Softmax output: top-1 per timestep over the last axis, not
    over axis 1 (which would compare timesteps); a declared axis wins; 1 when no Softmax says."""
    import numpy as np
    import pytest
    from onnx import TensorProto, helper

    from npubuild.errors import UserError
    from npubuild.stages.evaluate import _class_axis
    from npubuild.stages.metrics import Top1

    def out(name, shape):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)

    nodes = [
        helper.make_node("Softmax", ["x"], ["p"], axis=2),
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Softmax", ["x"], ["s"], axis=-1),
        helper.make_node("Reshape", ["s", "shape"], ["flat"]),
    ]
    graph = helper.make_graph(
        nodes, "g", [out("x", [1, 4, 6])], [out("p", [1, 4, 6]), out("r", [1, 4, 6]), out("flat", [4, 6])],
        [helper.make_tensor("shape", TensorProto.INT64, [2], [4, 6])],
    )  # fmt: skip
    graph.value_info.append(out("s", [1, 4, 6]))
    model = helper.make_model(graph)
    assert _class_axis(model, "p", {}) == 2
    assert _class_axis(model, "flat", {}) == -1
    assert _class_axis(model, "r", {}) == 1
    assert _class_axis(model, "r", {"r": -1}) == -1
    with pytest.raises(UserError, match="class_axes names \\['nope'\\]"):
        _class_axis(model, "r", {"nope": 1})
    with pytest.raises(UserError, match="but the output has 3 axes"):
        _class_axis(model, "r", {"r": 3})
    # classes last: [1, T, C]; the candidate flips one timestep's winner out of 4
    ref = np.zeros((1, 4, 6))
    ref[0, np.arange(4), [1, 2, 3, 4]] = 1.0
    cand = ref.copy()
    cand[0, 3, 0] = 2.0
    last, first = Top1(2), Top1(1)
    last.update(ref, cand)
    first.update(ref, cand)
    assert last.result() == {"top1_agreement": 0.75, "top1_axis": 2}
    assert first.result()["top1_agreement"] == 5 / 6  # over the 6 class columns, comparing timesteps
