"""Weight-bound ops join the open constant group (lowering.py): a squeeze-excite style pair of
1 x 1 convolutions on a pooled map, whose second layer's 64 KiB of weights take the DMA far
longer than its MACs take the array. Joined, its weights load during the stem's computes; alone,
during the first 1 x 1 layer's few cycles. The joined stream keeps its waits (hazards), computes
the integer model's codes, and is estimated faster by about that load."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from test_quantize import SETTINGS

from conftest import integer_variants, small_model
from npubuild.targets import npub
from npubuild.targets.backend import lowering
from npubuild.targets.compile import compile_npub, plan_partition
from npubuild.targets.hazards import binary_hazards
from npubuild.targets.runtime import Runtime
from npubuild.targets.spec import BUILTIN_TARGETS


def _model(rng: np.random.Generator):
    weights = {
        "w1": rng.normal(size=(64, 64, 3, 3)) * 0.05,
        "w2": rng.normal(size=(256, 64, 1, 1)) * 0.15,
        "w3": rng.normal(size=(256, 256, 1, 1)) * 0.06,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="stem"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("GlobalAveragePool", ["r1"], ["g"], name="squeeze"),
        helper.make_node("Conv", ["g", "w2"], ["s1"], name="fc1"),
        helper.make_node("Relu", ["s1"], ["s2"], name="relu2"),
        helper.make_node("Conv", ["s2", "w3"], ["y"], name="fc2"),
    ]
    return small_model(nodes, "pooled", {"x": [1, 64, 16, 16]}, {"y": [1, 256, 1, 1]}, weights)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    rng = np.random.default_rng(29)
    model = _model(rng)
    samples = rng.normal(size=(6, 64, 16, 16)).astype(np.float32)
    program, arrays, interpreter = integer_variants(
        model, tmp_path_factory.mktemp("groups"), samples, {"default": SETTINGS}
    )["default"]
    return model, program, arrays, interpreter


def test_a_weight_bound_layer_loads_its_weights_with_the_group_before(built, monkeypatch):
    model, program, arrays, interpreter = built
    target = BUILTIN_TARGETS["vnpu-m"]
    plan = plan_partition(program, arrays, model, target)
    joined: list[str] = []
    add_op = lowering.Lowering.add_op

    def recorded(self, op, commands):
        add_op(self, op, commands)
        if self.const_shift:  # the op's constants went after the open group's in its slot
            joined.append(op.node)

    monkeypatch.setattr(lowering.Lowering, "add_op", recorded)
    data, _, stats = compile_npub(program, arrays, model, target, plan)
    assert "fc2" in joined and "stem" not in joined, joined
    assert binary_hazards(data) == []
    runtime = Runtime(npub.read(data))
    rng = np.random.default_rng(3)
    for _ in range(2):
        x = rng.normal(size=(1, 64, 16, 16)).astype(np.float32)
        np.testing.assert_array_equal(runtime.run({"x": x})["y"], interpreter.run({"x": x})[0]["y"])

    monkeypatch.setattr(lowering.Lowering, "_joining_offset", lambda self, commands: None)
    _, _, alone = compile_npub(program, arrays, model, target, plan)
    # fc2's 64 KiB at 32 bytes per cycle: 2,048 cycles the array waited for with only fc1's few
    # cycles of MACs to overlap
    assert stats["estimated_cycles"] < alone["estimated_cycles"] - 1000, (stats["estimated_cycles"], alone)
