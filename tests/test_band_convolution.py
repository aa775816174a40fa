"""A convolution whose weights are a band (an LRN's channel window, recognise.decompose_lrn) runs in
chunks as wide as the MAC array's columns, each reading and summing only the input channels its
weights touch (schedule.band_chunk, schedule.band_reads): bit-exact, hazard-free, and below
what the dense reduction would take the array."""

from __future__ import annotations

import numpy as np
from onnx import helper
from test_quantize import SETTINGS

from conftest import integer_variants, npu_instructions, small_model
from npubuild.targets import npub
from npubuild.targets.compile import compile_npub, plan_partition
from npubuild.targets.hazards import binary_hazards
from npubuild.targets.runtime import Runtime
from npubuild.targets.spec import BUILTIN_TARGETS

CHANNELS, HALF = 96, 2  # a window of 5 channels, as ZFNet's and AlexNet's LRN


def _band_model(rng: np.random.Generator):
    band = np.zeros((CHANNELS, CHANNELS, 1, 1))
    for out in range(CHANNELS):
        band[out, max(0, out - HALF) : out + HALF + 1] = rng.uniform(0.5, 1.0)
    weights = {
        "stem": rng.normal(size=(CHANNELS, 3, 3, 3)) * 0.3,
        "band": band,
        "head": rng.normal(size=(8, CHANNELS, 1, 1)) * 0.2,
    }
    nodes = [
        helper.make_node("Conv", ["x", "stem"], ["s"], pads=[1, 1, 1, 1], name="stem"),
        helper.make_node("Relu", ["s"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "band"], ["b"], name="window"),
        helper.make_node("Conv", ["b", "head"], ["y"], name="head"),
    ]
    return small_model(nodes, "band", {"x": [1, 3, 20, 20]}, {"y": [1, 8, 20, 20]}, weights)


def test_a_band_convolution_reads_only_its_chunks_channels(tmp_path):
    rng = np.random.default_rng(31)
    model = _band_model(rng)
    samples = rng.normal(size=(8, 3, 20, 20)).astype(np.float32)
    program, arrays, interpreter = integer_variants(model, tmp_path, samples, {"default": SETTINGS})[
        "default"
    ]
    target = BUILTIN_TARGETS["vnpu-m"]
    plan = plan_partition(program, arrays, model, target)
    data, _, stats = compile_npub(program, arrays, model, target, plan)
    assert binary_hazards(data) == []
    binary = npub.read(data)
    cols = target.mac_cols
    # the 1x1 convolutions of 96 inputs: the head reads all 96; the window's chunks of 32
    # outputs read the channels their band covers
    expected = {(max(0, o0 - HALF), min(CHANNELS, o0 + cols + HALF)) for o0 in range(0, CHANNELS, cols)}
    reads = {
        (i.args["in_c"], i.args["out_c"])
        for i in npu_instructions(binary)
        if i.op == "conv" and i.args["kh"] == 1 and i.args["in_c"] < CHANNELS
    }
    assert reads == {(k1 - k0, cols) for k0, k1 in expected}, reads
    runtime = Runtime(binary)
    for _ in range(2):
        x = rng.normal(size=(1, 3, 20, 20)).astype(np.float32)
        np.testing.assert_array_equal(runtime.run({"x": x})["y"], interpreter.run({"x": x})[0]["y"])
    (window,) = [row for row in stats["layers"] if row["node"] == "window"]
    dense = 20 * 20 * CHANNELS * CHANNELS  # every input channel for every output
    assert window["macs"] == 20 * 20 * cols * sum(k1 - k0 for k0, k1 in expected) < 0.4 * dense, window
    assert window["compute_cycles"] < 0.5 * dense / (target.mac_rows * cols), window
