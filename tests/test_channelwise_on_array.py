"""Channel-wise ops on the MAC array (docs/npu.md, "Channel-wise ops on the array"): on a target
with `channelwise_on_array` and the depthwise mapping, global and window pools and multiplies of a
map by one value per channel run on the array's depthwise path. Their cycles worked out by hand,
the engine each goes to on each kind of target, and a squeeze-excite network compiled so: the
simulator computes the integer model's codes, the schedule keeps its waits, and the estimate is
lower than with the ops on the vector unit."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from test_quantize import SETTINGS

from conftest import integer_variants, npu_instructions, small_model
from npubuild.targets import npub
from npubuild.targets.compile import compile_npub, plan_partition
from npubuild.targets.cycles import cost, engine
from npubuild.targets.hazards import binary_hazards
from npubuild.targets.isa import Instruction
from npubuild.targets.runtime import Runtime
from npubuild.targets.spec import BUILTIN_TARGETS, TargetSpec

M = BUILTIN_TARGETS["vnpu-m"].model_dump()  # 32 x 32 array with row bands, 64 vector lanes
S = BUILTIN_TARGETS["vnpu-s"].model_dump()  # 16 x 16, channels only, 16 lanes


def _mul(a_box, b_box, out_box, bits=8) -> Instruction:
    args = {f"a{k}": d for k, d in enumerate(a_box)} | {f"b{k}": d for k, d in enumerate(b_box)}
    args |= {f"o{k}": d for k, d in enumerate(out_box)}
    return Instruction("mul", dict(args, a_bits=bits, b_bits=8, out_bits=8, then_add=0))


def test_cycles_and_engines_worked_out_by_hand():
    gap = Instruction("gap", dict(c=480, hw=80, in_bits=8, out_bits=8))
    # 80 inputs per channel down 32 rows: 3 row folds; 480 channels over 32 columns: 15 folds
    assert engine(gap, M) == "mac" and cost(gap, M) == 45
    # on the vector unit: 38,400 elements over 16 lanes
    assert engine(gap, S) == "vector" and cost(gap, S) == 2400
    pool = Instruction("pool", dict(c=24, kh=3, kw=3, out_h=24, out_w=24, mode=0, in_bits=8, out_bits=8))
    # 9 taps: 3 bands of rows, 3 positions per step: 192 steps; 24 channels on 32 columns: 4
    # positions side by side in 3 folds, 48 steps each
    assert engine(pool, M) == "mac" and cost(pool, M) == 144
    assert cost(pool, S) == 24 * 576 * 9 // 16
    gate = _mul((1, 96, 10, 10), (1, 96, 1, 1), (1, 96, 10, 10))
    # one tap: 32 bands, 4 steps of the 100 positions; 96 channels: 3 column folds
    assert engine(gate, M) == "mac" and cost(gate, M) == 12
    assert engine(_mul((1, 1, 1, 1), (1, 96, 10, 10), (1, 96, 10, 10)), M) == "mac"  # a scalar, first
    # int16 data at the array's int16 rate (a quarter of int8)
    assert cost(_mul((1, 96, 10, 10), (1, 96, 1, 1), (1, 96, 10, 10), bits=16), M) == 48
    both = _mul((1, 96, 10, 10), (1, 96, 10, 10), (1, 96, 10, 10))  # two maps: no weight to hold
    assert engine(both, M) == "vector" and cost(both, M) == 150
    rows = _mul((1, 96, 10, 10), (1, 1, 10, 1), (1, 96, 10, 10))  # one value per row: not per channel
    assert engine(rows, M) == "vector"
    # a target without the depthwise mapping has no per-column input path: the vector unit
    plain = TargetSpec(**{**M, "name": "plain", "conv_mappings": ("channels",)}).model_dump()
    assert plain["channelwise_on_array"]
    assert engine(gap, plain) == "vector" and engine(gate, plain) == "vector"
    assert not TargetSpec(**{k: v for k, v in M.items() if k != "channelwise_on_array"}).channelwise_on_array


def _se_model(rng: np.random.Generator):
    """A stem, max pool, then a squeeze-excite block (global pool, two 1 x 1 convolutions, a hard
    sigmoid gate times the map), a per-channel scale (an unfolded batch norm), an average pool."""
    weights = {
        "w1": rng.normal(size=(24, 3, 3, 3)) * 0.4,
        "w2": rng.normal(size=(8, 24, 1, 1)) * 0.3,
        "w3": rng.normal(size=(24, 8, 1, 1)) * 0.3,
        "w4": rng.normal(size=(32, 24, 1, 1)) * 0.2,
        "scale": rng.uniform(0.5, 1.5, size=(1, 32, 1, 1)),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="stem"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["p1"], ["g"], name="squeeze"),
        helper.make_node("Conv", ["g", "w2"], ["s1"], name="reduce"),
        helper.make_node("Relu", ["s1"], ["s2"], name="relu2"),
        helper.make_node("Conv", ["s2", "w3"], ["s3"], name="expand"),
        helper.make_node("HardSigmoid", ["s3"], ["gate"], name="gate"),
        helper.make_node("Mul", ["p1", "gate"], ["e"], name="excite"),
        helper.make_node("Conv", ["e", "w4"], ["c4"], name="project"),
        helper.make_node("Mul", ["c4", "scale"], ["b"], name="bn_scale"),
        helper.make_node("AveragePool", ["b"], ["y"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
    ]
    return small_model(nodes, "se", {"x": [1, 3, 24, 24]}, {"y": [1, 32, 6, 6]}, weights)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    rng = np.random.default_rng(23)
    model = _se_model(rng)
    samples = rng.normal(size=(8, 3, 24, 24)).astype(np.float32)
    program, arrays, interpreter = integer_variants(
        model, tmp_path_factory.mktemp("se"), samples, {"default": SETTINGS}
    )["default"]
    return model, program, arrays, interpreter


@pytest.mark.parametrize("group", [True, False])
def test_a_squeeze_excite_network_runs_its_pools_and_gates_on_the_array(built, group):
    model, program, arrays, interpreter = built
    on = BUILTIN_TARGETS["vnpu-m"]
    off = TargetSpec(**{**on.model_dump(), "name": "vector", "channelwise_on_array": False})
    cycles = {}
    for target in (on, off):
        plan = plan_partition(program, arrays, model, target)
        data, _, stats = compile_npub(program, arrays, model, target, plan, group=group)
        assert binary_hazards(data) == []
        binary = npub.read(data)
        code = npu_instructions(binary)
        fields = target.model_dump()
        ops = {i.op for i in code if engine(i, fields) == "mac"} - {"conv"}
        assert ops == ({"gap", "pool", "mul"} if target is on else set()), ops
        runtime = Runtime(binary)
        rng = np.random.default_rng(5)
        for _ in range(2):
            x = rng.normal(size=(1, 3, 24, 24)).astype(np.float32)
            np.testing.assert_array_equal(runtime.run({"x": x})["y"], interpreter.run({"x": x})[0]["y"])
        # codegen.json's layers say they ran on the array's depthwise path
        mapped = {row["node"]: row.get("mapping") for row in stats["layers"]}
        on_array = "depthwise" if target is on else None
        assert [mapped["squeeze"], mapped["excite"], mapped["bn_scale"]] == [on_array] * 3, mapped
        cycles[target.name] = stats["estimated_cycles"]
    assert cycles["vnpu-m"] < cycles["vector"], cycles
