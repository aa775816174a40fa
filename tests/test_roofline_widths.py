"""The roofline bound at the layers' widths (codegen's `roofline_cycles_at_widths`, each layer's
`roofline_cycles`): a MAC that multiplies a 16-bit operand is bounded by the array's int16 peak
(peak x `int16_rate`), so a precision table with 16-bit layers is measured against what the array
allows for it, beside the all-int8 bound."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper
from stripe_kit import SMALL, build_int8
from test_quantize import SETTINGS

from npubuild.targets.compile import compile_npub


def _model() -> onnx.ModelProto:
    """Two wide 3x3 convolutions on a small map: the array, not DRAM, bounds it."""
    rng = np.random.default_rng(3)
    weights = {"w1": rng.normal(size=(64, 16, 3, 3)) * 0.1, "w2": rng.normal(size=(64, 64, 3, 3)) * 0.05}
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "wide",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 16, 16, 16])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 64, 16, 16])],
        [numpy_helper.from_array(w.astype(np.float32), k) for k, w in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return onnx.shape_inference.infer_shapes(model)


def test_sixteen_bit_layers_are_bounded_at_the_arrays_int16_peak(tmp_path):
    model = _model()
    samples = np.random.default_rng(4).normal(size=(4, 16, 16, 16)).astype(np.float32)
    stats = {}
    for bits in (8, 16):
        (tmp_path / str(bits)).mkdir()
        built = build_int8(model, tmp_path / str(bits), samples, {**SETTINGS, "activation_bits": bits})
        stats[bits] = compile_npub(built.program, built.arrays, model, SMALL, built.plan)[2]
    int8, int16 = stats[8], stats[16]
    peak = SMALL.mac_rows * SMALL.mac_cols
    macs = 64 * 16 * 16 * (16 * 9 + 64 * 9)
    assert int8["macs"] >= macs and macs / peak > int8["compulsory_dram_bytes"] / SMALL.dram_bytes_per_cycle
    # all int8: the two bounds are one, and no row counts 16-bit MACs
    assert int8["roofline_cycles_at_widths"] == int8["roofline_cycles"] == np.ceil(macs / peak)
    assert not any("int16_macs" in row for row in int8["layers"])
    # 16-bit inputs: the same work, bounded at the int16 peak, and the estimate still above it
    convs = [row for row in int16["layers"] if row["macs"]]
    assert {row["node"] for row in convs} == {"conv1", "conv2"}
    assert all(row["int16_macs"] == row["macs"] for row in convs)
    assert int16["roofline_cycles"] == int8["roofline_cycles"]
    assert int16["roofline_cycles_at_widths"] == np.ceil(macs / (peak * SMALL.int16_rate))
    assert int16["estimated_cycles"] >= int16["roofline_cycles_at_widths"] > int16["roofline_cycles"]
    for row in convs:
        assert row["roofline_cycles"] >= row["macs"] / (peak * SMALL.int16_rate)
        assert row["compute_cycles"] >= row["macs"] / (peak * SMALL.int16_rate)
