"""The latency estimate counts the CPU's share (targets/cpu_cost.py): the ops a target sends to
the CPU and every NPU/CPU hand-over, from the target's CPU fields."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from test_row_ops import RNG, _model


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    from test_quantize import SETTINGS, pipeline

    from npubuild.intmodel.interpreter import load_integer_model

    w = (RNG.standard_normal((32, 48)) * 0.2).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Softmax", ["h"], ["p"], axis=-1),
        helper.make_node("Sigmoid", ["p"], ["s"]),
        helper.make_node("MatMul", ["s", "w2"], ["y"]),
    ]
    model = _model(nodes, {"w": w, "w2": w.T.copy()}, [1, 16, 32])
    tmp = tmp_path_factory.mktemp("cpu")
    _, q, _, _ = pipeline(
        tmp, model, settings=SETTINGS, samples=RNG.standard_normal((8, 16, 32)).astype(np.float32)
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
