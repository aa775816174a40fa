"""A Transpose of a whole resident tensor into DRAM is one store (emit_data._scattered_store):
the DMA reads the tensor where it lies and writes each element to its place in the output, with
no copy through a tile buffer (Silero VAD's last encoder result, [128, 16] -> [16, 128] for the
LSTM on the CPU)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from test_quantize import SETTINGS

from conftest import integer_variants, small_model
from npubuild.targets import isa, npub
from npubuild.targets.compile import compile_npub, plan_partition
from npubuild.targets.hazards import binary_hazards
from npubuild.targets.runtime import Runtime
from npubuild.targets.spec import BUILTIN_TARGETS


@pytest.mark.parametrize("target", ["vnpu-m", "vnpu-s"])
def test_a_resident_tensor_transposed_into_dram_is_one_store(tmp_path, target):
    rng = np.random.default_rng(11)
    weights = {"w": rng.normal(size=(24, 8, 1, 3)) * 0.2}
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[0, 1, 0, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 3, 1], name="to_rows"),
    ]
    model = small_model(nodes, "scatter", {"x": [1, 8, 6, 10]}, {"y": [1, 6, 10, 24]}, weights)
    samples = rng.normal(size=(6, 8, 6, 10)).astype(np.float32)
    program, arrays, interpreter = integer_variants(model, tmp_path, samples, {"default": SETTINGS})[
        "default"
    ]
    spec = BUILTIN_TARGETS[target]
    data, _, _ = compile_npub(program, arrays, model, spec, plan_partition(program, arrays, model, spec))
    binary = npub.read(data)
    ((k, subgraph),) = [(k, s) for k, s in enumerate(binary.meta["subgraphs"]) if s["device"] == "npu"]
    code = isa.subgraph_program(binary, subgraph, k)
    marks = [k for k, name, _ in subgraph["marks"] if name == "to_rows"]
    transpose = code[marks[0] :]
    stores = [i for i in transpose if i.op == "store" and i.args["space"] == 0]
    assert [i.op for i in transpose[:1]] == ["store"] and len(stores) == 1, [i.op for i in transpose]
    assert [stores[0].args[f"s{k}"] for k in range(4)] == [6 * 10 * 24, 1, 10 * 24, 24]  # channels scattered
    assert binary_hazards(data) == []
    runtime = Runtime(binary)
    for _ in range(2):
        x = rng.normal(size=(1, 8, 6, 10)).astype(np.float32)
        np.testing.assert_array_equal(runtime.run({"x": x})["y"], interpreter.run({"x": x})[0]["y"])
