"""matmul_bias_as_gemm: x @ W + b with constant W and a per-column constant b becomes one Gemm
(between Reshapes to and from [rows, K] when x has more than two axes), which computes the same in
onnxruntime, adds the bias in the integer accumulator before its one rounding, and is left alone
where the product has other readers or the constant is not one value per column."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from test_optimize_passes import check_same, ops

from conftest import small_model
from npubuild.stages.optimize.stage import optimize

RNG = np.random.default_rng(23)
K, N = 16, 8


def _matmul_bias(shape, bias_shape=(N,), extra_reader=False, bias_scale=20.0):
    inits = {
        "w": (RNG.standard_normal((K, N)) * 0.3).astype(np.float32),
        "b": (RNG.uniform(-1, 1, bias_shape) * bias_scale).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["p"], name="mm"),
        helper.make_node("Add", ["p", "b"], ["y"]),
    ]
    outputs = {"y": [*shape[:-1], N]}
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["p"], ["r"]))
        outputs["r"] = [*shape[:-1], N]
    return small_model(nodes, "g", {"x": list(shape)}, outputs, inits, opset=13)


@pytest.mark.parametrize(
    "shape, expected",
    [
        ((6, K), ["Gemm"]),
        ((1, 6, K), ["Reshape", "Gemm", "Reshape"]),
        ((2, 3, 4, K), ["Reshape", "Gemm", "Reshape"]),
    ],
)
def test_a_matmul_and_its_bias_become_one_gemm(shape, expected):
    m = _matmul_bias(shape)
    out, log = optimize(m, [], 8)
    assert ops(out) == expected
    assert log[0]["changes"]["matmul_bias_as_gemm"] == 1
    assert [o.name for o in out.graph.output] == ["y"]
    check_same(m, out, list(shape), atol=1e-5)


@pytest.mark.parametrize("case", ["product read elsewhere", "bias per row", "disabled"])
def test_a_matmul_whose_bias_cannot_join_it_stays(case):
    m = _matmul_bias(
        (1, 6, K),
        bias_shape=(6, N) if case == "bias per row" else (N,),
        extra_reader=case == "product read elsewhere",
    )
    out, _ = optimize(m, ["matmul_bias_as_gemm"] if case == "disabled" else [], 8)
    assert "Gemm" not in ops(out) and ops(out)[:2] == ["MatMul", "Add"]


def test_the_bias_is_added_before_the_one_rounding(tmp_path):
    """As a separate Add, the product is rounded to a grid of its own, and the bias (here 20x the
    product) to the sum's; in the Gemm, the two meet in the 32-bit accumulator and only the sum is
    rounded. Measured 46.7 -> 49.4 dB; one rounding of two is at most 3 dB."""
    from test_quantize import SETTINGS, pipeline

    m = _matmul_bias((1, 6, K), bias_scale=20.0)
    samples = RNG.standard_normal((16, 6, K)).astype(np.float32)
    settings = {**SETTINGS, "output_bits": 8}  # the sum on an int8 grid, as inside a net
    errors = {}
    for disabled in ([], ["matmul_bias_as_gemm"]):
        optimized, _ = optimize(m, disabled, 8)
        (tmp_path / str(len(disabled))).mkdir()
        _, _, report, summary = pipeline(tmp_path / str(len(disabled)), optimized, settings, samples)
        errors[bool(disabled)] = report["outputs"]["y"]["sqnr_db"]
        assert summary["op_kinds"].get("add", 0) == (1 if disabled else 0)
    assert errors[False] > errors[True] + 1.5, errors
