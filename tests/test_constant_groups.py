"""Weight-bound ops join the open constant group (lowering.py): a squeeze-excite style pair of
1 x 1 convolutions on a pooled map, whose second layer's 64 KiB of weights take the DMA far
longer than its MACs take the array. Joined, its weights load during the stem's computes; alone,
during the first 1 x 1 layer's few cycles. The joined stream keeps its waits (hazards), computes
the integer model's codes, and is estimated faster by about that load.

Fresh constants (lowering.py): every constant group in SRAM of its own, so no constant load
waits for a compute, each placed in the in-order DMA queue where the estimate finds the stream
ends soonest (`_late_anchors`); on the same model."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from test_quantize import SETTINGS

import npubuild.targets.compile as compile_module
from conftest import integer_variants, npu_instructions, small_model
from npubuild.targets import isa, npub
from npubuild.targets.backend import lowering
from npubuild.targets.backend.memory import DoesNotFit
from npubuild.targets.compile import Grouping, compile_npub, plan_partition
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
    # every constant in SRAM of its own (lowering.py, "fresh constants") hides fc2's load as well,
    # with or without joining; this test is about joining with the slots
    monkeypatch.setattr(compile_module, "FRESH_CONSTANTS_MAX", 0.0)
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


TARGET = BUILTIN_TARGETS["vnpu-m"]


def _compile(built, choice: Grouping) -> tuple[bytes, dict]:
    model, program, arrays, _ = built
    plan = plan_partition(program, arrays, model, TARGET)
    data, stats = compile_module._compile(program, arrays, model, TARGET, plan, True, True, choice)
    return data, stats


def _constant_loads(data: bytes) -> list[isa.Instruction]:
    binary = npub.read(data)
    base = binary.meta["constants_base"]
    return [
        i
        for i in npu_instructions(binary)
        if i.op == "load" and i.args["space"] == 0 and i.args["dram"] >= base
    ]


def test_fresh_constants_load_without_waiting_and_compute_the_integer_model(built):
    _, slots = _compile(built, Grouping(0, 0.125))
    need = slots["constant_bytes"] + compile_module.FRESH_CONSTANTS_SLACK
    data, fresh = _compile(built, Grouping(0, 0.0, fresh_constants=need))
    loads = _constant_loads(data)
    assert len(loads) >= 3 and all(i.wait == 0 for i in loads), [i.wait for i in loads]
    assert any(i.wait for i in _constant_loads(_compile(built, Grouping(0, 0.125))[0]))
    assert binary_hazards(data) == []
    runtime, interpreter = Runtime(npub.read(data)), built[3]
    rng = np.random.default_rng(5)
    for _ in range(2):
        x = rng.normal(size=(1, 64, 16, 16)).astype(np.float32)
        np.testing.assert_array_equal(runtime.run({"x": x})["y"], interpreter.run({"x": x})[0]["y"])
    # fc2's weights load while the stem computes, not after fc1's few cycles
    assert fresh["estimated_cycles"] < slots["estimated_cycles"] - 1000, (fresh, slots)


def test_fresh_constants_go_where_the_dma_queue_has_room(built, monkeypatch):
    need = _compile(built, Grouping(0, 0.125))[1]["constant_bytes"] + compile_module.FRESH_CONSTANTS_SLACK
    data, placed = _compile(built, Grouping(0, 0.0, fresh_constants=need))
    monkeypatch.setattr(lowering.Lowering, "_late_anchors", lambda self, early: {})
    _, hoisted = _compile(built, Grouping(0, 0.0, fresh_constants=need))
    # after the first input load of the group before (as with slots), fc2's 64 KiB hold back the
    # stem's later tile loads in the in-order DMA queue
    assert placed["estimated_cycles"] < hoisted["estimated_cycles"] - 1000, (placed, hoisted)
    assert binary_hazards(data) == []


def test_fresh_constants_that_outgrow_their_area_do_not_fit(built):
    with pytest.raises(DoesNotFit):
        _compile(built, Grouping(0, 0.0, fresh_constants=16384))


def test_the_grouping_search_tries_fresh_constants(built):
    model, program, arrays, _ = built
    plan = plan_partition(program, arrays, model, TARGET)
    _, _, stats = compile_module.compile_npub(program, arrays, model, TARGET, plan)
    assert any(row.get("fresh_constants") for row in stats["grouping_search"])
