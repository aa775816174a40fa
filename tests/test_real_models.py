"""The example workspace end to end on the three real models (fetched from their pinned wheels)."""

from __future__ import annotations

import shutil
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from conftest import EXAMPLE, run_build
from npubuild.cache.store import Store

MODELS = ["yolo", "ocr_det", "ocr_cls"]


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    root = tmp_path_factory.mktemp("example")
    ws = root / "ws"
    shutil.copytree(EXAMPLE, ws, ignore=shutil.ignore_patterns("npubuild-out"))
    store = Store(root / "cache")
    outcome = run_build(ws, store, jobs=2)
    yield ws, store, outcome
    store.close()


def out_dir(ws, label):
    pkg, name = label.split(":")
    return ws / "npubuild-out" / pkg.strip("/") / name


def session(path):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def test_example_builds_every_stage(example):
    ws, _, outcome = example
    assert outcome.ok, outcome.errors
    stages = Counter(a.stage for a in outcome.actions if outcome.result(a).status == "ran")
    assert stages == {
        "fetch": 3,
        "import": 3,
        "prepare": 6,
        "optimize": 3,
        "calibrate": 3,
        "quantize": 3,
        "evaluate": 3,
        "partition": 3,
        "codegen": 3,
        "simulate": 3,
        "sensitivity": 1,
        "search": 1,  # the example asks for mixed precision on ocr_cls only
    }


@pytest.mark.parametrize("name", MODELS)
def test_optimized_model_is_smaller_and_agrees_on_held_out_photos(example, name):
    ws, _, _ = example
    out = out_dir(ws, f"//models:{name}")
    canonical = onnx.load(out / "canonical.onnx")
    optimized = onnx.load(out / "optimized.onnx")
    assert any(o.domain in ("", "ai.onnx") and o.version >= 13 for o in canonical.opset_import)
    assert len(optimized.graph.node) < 0.7 * len(canonical.graph.node)
    assert "BatchNormalization" not in {n.op_type for n in optimized.graph.node}
    assert "Constant" not in {n.op_type for n in optimized.graph.node}
    # The evaluation photos were never seen by optimize's own check.
    evaluation = {"yolo": "yolo_eval", "ocr_det": "ocr_det_eval", "ocr_cls": "ocr_cls_eval"}[name]
    tensors = np.load(out_dir(ws, f"//data:{evaluation}") / "tensors.npy")
    ref, opt = session(out / "canonical.onnx"), session(out / "optimized.onnx")
    feed_name = ref.get_inputs()[0].name
    for sample in tensors:
        feed = {feed_name: sample[None]}
        for a, b in zip(ref.run(None, feed), opt.run(None, feed)):
            assert np.max(np.abs(a - b)) <= 1e-4 + 1e-3 * np.max(np.abs(a))


def test_silu_fusion_covers_every_sigmoid_mul_pair_in_yolo(example):
    ws, _, _ = example
    out = out_dir(ws, "//models:yolo")
    canonical = onnx.load(out / "canonical.onnx")
    producers = {o: n for n in canonical.graph.node for o in n.output}
    pairs = sum(
        1
        for n in canonical.graph.node
        if n.op_type == "Mul"
        and any(
            producers.get(i) is not None
            and producers[i].op_type == "Sigmoid"
            and producers[i].input[0] in n.input
            for i in n.input
        )
    )
    optimized = onnx.load(out / "optimized.onnx")
    assert pairs > 0
    assert sum(1 for n in optimized.graph.node if n.op_type == "SiLU") == pairs


def test_summary_reports_the_check(example):
    ws, store, outcome = example
    for name in MODELS:
        (opt,) = [a for a in outcome.actions if a.stage == "optimize" and a.owner == f"//models:{name}"]
        summary = store.read_json(outcome.result(opt).outputs["summary"])
        assert summary["check"]["passed"] and summary["check"]["samples"] == 4
        assert summary["nodes_after"] == len(
            onnx.load(out_dir(ws, f"//models:{name}") / "optimized.onnx").graph.node
        )


def test_artifacts_are_byte_identical_in_a_clean_cache(example, tmp_path):
    ws, _, _ = example
    first = {p: p.read_bytes() for p in (ws / "npubuild-out").rglob("*") if p.is_file()}
    other = Store(tmp_path / "clean")
    outcome = run_build(ws, other, jobs=1)
    assert outcome.ok
    second = {p: p.read_bytes() for p in (ws / "npubuild-out").rglob("*") if p.is_file()}
    assert first.keys() == second.keys()
    assert [p for p in first if first[p] != second[p]] == []


@pytest.mark.parametrize("name", MODELS)
def test_integer_model_agrees_with_its_qdq_twin_and_with_float(example, name):
    import json

    ws, _, _ = example
    out = out_dir(ws, f"//models:{name}")
    report = json.loads((out / "accuracy.json").read_text())
    g = report["golden_vs_qdq"]["op_by_op"]
    assert g["elements"] > 100_000
    assert g["within_1_lsb"] >= 0.999
    # the QDQ twin runs in stock onnxruntime and has the integer model's parameters
    qdq = onnx.load(out / "quantized.qdq.onnx")
    assert sum(n.op_type == "QuantizeLinear" for n in qdq.graph.node) > 50
    session(out / "quantized.qdq.onnx")
    # every layer is reported; classification and detection outputs stay close to float
    assert len(report["layers"]) > 50 and len(report["worst_layers"]) == 5
    if name in ("yolo", "ocr_cls"):
        (metrics,) = report["outputs"].values()
        assert metrics["cosine"] > 0.99
