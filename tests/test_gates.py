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


def test_passing_gates_exit_0_with_junit(small_ws, tmp_path):
    with_gates(small_ws, '{"min_cosine": 0.9, "min_top1": 0.5, "max_latency_ms": 100.0}')
    proc = cli(["test", "//models:cls_npu"], small_ws, tmp_path / "cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("PASS //models:cls_npu") == 3
    suite = junit(small_ws)
    assert suite.get("tests") == "1" and suite.get("failures") == "0"
    (case,) = suite.iter("testcase")
    assert case.get("name") == "//models:cls_npu" and case.find("failure") is None


def test_a_failing_gate_exits_3_and_names_it(small_ws, tmp_path):
    # a latency no NPU meets, and an accuracy that int8 on this model does not reach
    with_gates(small_ws, '{"min_cosine": 0.9, "max_latency_ms": 0.001, "min_sqnr": 60.0}')
    proc = cli(["test", "//models:cls_npu"], small_ws, tmp_path / "cache")
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


def test_html_report_is_self_contained_and_has_every_section(small_ws, tmp_path):
    import re

    cache = tmp_path / "cache"
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
