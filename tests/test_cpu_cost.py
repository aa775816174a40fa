"""The latency estimate counts the CPU's share (targets/cpu_cost.py): the ops a target sends to
the CPU and every NPU/CPU hand-over, from the target's CPU fields."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from test_row_ops import _model


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    from test_quantize import SETTINGS, pipeline

    from npubuild.intmodel.interpreter import load_integer_model

    rng = np.random.default_rng(5)  # a module fixture: its own numbers, whatever ran before
    w = (rng.standard_normal((32, 48)) * 0.2).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Softmax", ["h"], ["p"], axis=-1),
        helper.make_node("Sigmoid", ["p"], ["s"]),
        helper.make_node("MatMul", ["s", "w2"], ["y"]),
    ]
    model = _model(nodes, {"w": w, "w2": w.T.copy()}, [1, 16, 32])
    tmp = tmp_path_factory.mktemp("cpu")
    _, q, _, _ = pipeline(
        tmp, model, settings=SETTINGS, samples=rng.standard_normal((8, 16, 32)).astype(np.float32)
    )
    program, arrays, _ = load_integer_model(q["integer"])
    return model, program, arrays


def _stats(compiled, **fields):
    from npubuild.targets.compile import compile_npub, plan_partition
    from npubuild.targets.spec import BUILTIN_TARGETS

    model, program, arrays = compiled
    target = BUILTIN_TARGETS["vnpu-m"].model_copy(update=fields)
    plan = plan_partition(program, arrays, model, target)
    return plan, compile_npub(program, arrays, model, target, plan)[2]


def test_cpu_ops_and_hand_overs_are_in_the_latency(compiled):
    without_softmax = tuple(t for t in _target_ops() if t != "Softmax")
    plan, stats = _stats(compiled, supported_ops=without_softmax)
    assert plan["transitions"] >= 2 and stats["transitions"] == plan["transitions"]
    assert stats["cpu_latency_ms"] > 0
    total = stats["npu_latency_ms"] + stats["cpu_latency_ms"] + stats["transitions"] * 15e-3
    assert stats["estimated_latency_ms"] == pytest.approx(total)
    # a CPU half as fast doubles the CPU's share and nothing else
    _, slow = _stats(compiled, supported_ops=without_softmax, cpu_gelements=1.0, cpu_gmacs=4.0)
    assert slow["cpu_latency_ms"] == pytest.approx(2 * stats["cpu_latency_ms"])
    assert slow["npu_latency_ms"] == pytest.approx(stats["npu_latency_ms"])
    # with the Softmax on the NPU, only the input's conversion stays on the CPU: one hand-over
    plan_all, stats_all = _stats(compiled)
    assert stats_all["transitions"] == 1 and stats_all["estimated_latency_ms"] < stats["estimated_latency_ms"]


def _target_ops():
    from npubuild.targets.spec import BUILTIN_TARGETS

    return BUILTIN_TARGETS["vnpu-m"].supported_ops


def test_multiply_accumulates_of_a_convolution_and_a_transposed_one_on_the_cpu():
    """Counted by hand: a 3x3 convolution 8 -> 16 channels on 10x10 outputs; a stride-2 2x2
    transposed convolution 16 -> 4 channels from a 5x5 input."""
    from npubuild.intmodel.program import FloatOp
    from npubuild.targets.cpu_cost import op_work

    shapes = {"x": [1, 8, 10, 10], "y": [1, 16, 10, 10], "t": [1, 16, 5, 5], "u": [1, 4, 10, 10]}
    arrays = {"w": np.zeros((16, 8, 3, 3)), "wt": np.zeros((16, 4, 2, 2))}
    conv = FloatOp(
        kind="float", op_type="Conv", inputs=["x", "w"], outputs=["y"], constants={"w": "w"}, proto="p"
    )
    macs, elements = op_work(conv, shapes, arrays)
    assert macs == 16 * 10 * 10 * 8 * 3 * 3 and elements == 800 + 1600
    up = FloatOp(
        kind="float",
        op_type="ConvTranspose",
        inputs=["t", "wt"],
        outputs=["u"],
        constants={"wt": "wt"},
        proto="p",
    )
    assert op_work(up, shapes, arrays)[0] == 16 * 5 * 5 * 4 * 2 * 2  # = 4 * 10 * 10 outputs x 16 inputs
