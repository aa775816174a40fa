"""Residual Adds in a convolution's output path (issue 19, part 3): an Add whose one term is a
convolution's result (activated or not), read by nothing else, and whose other term is made before
that convolution runs is applied by the convolution as it stores; an Add of x and x * g (a
squeeze-excite block's shortcut, PP-OCRv4 det's) is chained onto the mul's vector pass. The
simulator still computes the integer model's codes, and no instruction overlaps another on the
same bytes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper
from test_quantize import SETTINGS  # the settings the other quantize tests use

from conftest import integer_variants, small_model
from npubuild.targets import npub
from npubuild.targets.backend.fusion import fuse
from npubuild.targets.compile import compile_npub, model_shapes, plan_partition
from npubuild.targets.hazards import binary_hazards
from npubuild.targets.runtime import Runtime
from npubuild.targets.spec import BUILTIN_TARGETS


def _model(rng: np.random.Generator) -> onnx.ModelProto:
    """- add1: a bottleneck's shortcut, x1 + HardSigmoid(conv(x1)) (fused into conv2, activated);
    - add2: conv3's result plus the input of conv3's input's producer's... that is, y1 + conv3(y1),
      with conv3 not activated (fused into conv3);
    - add3: conv4's result, which conv5 also reads, plus conv5's: conv4's result has two readers,
      and conv5's term is made after conv4, so only conv5 takes add3;
    - add4: two tensors made before it by no convolution of theirs (a MaxPool and an input): stays;
    - add5: y + y * g, g a squeeze-excite gate of y (chained onto the mul)."""
    weights = {
        "w1": rng.normal(size=(16, 3, 3, 3)) * 0.4,
        "w2": rng.normal(size=(16, 16, 3, 3)) * 0.15,
        "w3": rng.normal(size=(16, 16, 1, 1)) * 0.3,
        "w4": rng.normal(size=(16, 16, 1, 1)) * 0.3,
        "w5": rng.normal(size=(16, 16, 3, 3)) * 0.1,
        "w6": rng.normal(size=(16, 16, 1, 1)) * 0.5,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["x1"], name="relu1"),
        helper.make_node("Conv", ["x1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("HardSigmoid", ["c2"], ["h2"], name="act2"),
        helper.make_node("Add", ["x1", "h2"], ["y1"], name="add1"),
        helper.make_node("Conv", ["y1", "w3"], ["c3"], name="conv3"),
        helper.make_node("Add", ["c3", "y1"], ["y2"], name="add2"),
        helper.make_node("Conv", ["y2", "w4"], ["c4"], name="conv4"),
        helper.make_node("Conv", ["c4", "w5"], ["c5"], pads=[1, 1, 1, 1], name="conv5"),
        helper.make_node("Add", ["c4", "c5"], ["y3"], name="add3"),
        helper.make_node("MaxPool", ["y3"], ["p"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="pool"),
        helper.make_node("Add", ["p", "y2"], ["y4"], name="add4"),
        helper.make_node("GlobalAveragePool", ["y4"], ["s"], name="gap"),
        helper.make_node("Conv", ["s", "w6"], ["s1"], name="conv6"),
        helper.make_node("HardSigmoid", ["s1"], ["g"], name="gate"),
        helper.make_node("Mul", ["y4", "g"], ["m"], name="mul"),
        helper.make_node("Add", ["m", "y4"], ["y"], name="add5"),
    ]
    return small_model(nodes, "residuals", {"x": [1, 3, 12, 12]}, {"y": [1, 16, 12, 12]}, weights)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    rng = np.random.default_rng(11)  # the module's own seed: which test builds the fixture first varies
    model = _model(rng)
    samples = rng.normal(size=(8, 3, 12, 12)).astype(np.float32)
    out = integer_variants(model, tmp_path_factory.mktemp("residual"), samples, {"default": SETTINGS})
    return model, *out["default"]


def test_the_adds_fused_are_those_whose_terms_are_ready(built):
    model, program, arrays, _ = built
    plan = plan_partition(program, arrays, model, BUILTIN_TARGETS["vnpu-m"])
    fusion = fuse(program, plan, model_shapes(model))
    names = {i: op.node for i, op in enumerate(program.ops)}
    assert {names[i]: names[j] for i, j in fusion.residual.items()} == {
        "conv2": "add1",
        "conv3": "add2",
        "conv5": "add3",
        "mul": "add5",
    }
    # without shapes (every op's own result checked) nothing is fused but the activations
    assert fuse(program, plan).residual == {}


@pytest.mark.parametrize("target_name", ["vnpu-m", "vnpu-s", "tiny"])
def test_a_fused_residual_add_computes_the_integer_models_codes(built, target_name):
    model, program, arrays, interpreter = built
    if target_name == "tiny":  # tiles of a few rows and weight chunks: residual boxes per tile
        target = BUILTIN_TARGETS["vnpu-s"].model_copy(update={"name": "tiny", "sram_kib": 8})
    else:
        target = BUILTIN_TARGETS[target_name]
    plan = plan_partition(program, arrays, model, target)
    rng = np.random.default_rng(5)
    for group in (True, False):  # fused (grouped) and every op on its own
        data, listing, stats = compile_npub(program, arrays, model, target, plan, group=group)
        kinds = [row["kind"] for row in stats["layers"]]
        # add4 always has its own instructions; the other four only without fusion
        assert kinds.count("add") == (1 if group else 5), (group, kinds)
        fused = [line for line in listing.splitlines() if " conv " in f" {line} " and "res=-1" not in line]
        chained = [line for line in listing.splitlines() if " mul " in f" {line} " and "then_add=1" in line]
        assert bool(fused) == bool(chained) == group
        assert binary_hazards(data) == []
        runtime = Runtime(npub.read(data))
        for _ in range(2):
            x = rng.normal(size=(1, 3, 12, 12)).astype(np.float32)
            np.testing.assert_array_equal(runtime.run({"x": x})["y"], interpreter.run({"x": x})[0]["y"])


def test_a_mul_that_adds_an_operand_it_lacks_is_one_npub_error():
    """A chained Add names operand a (0) or b (1); a binary naming another is refused, not read
    as b."""
    from npubuild.targets.isa import NO_CLAMP, NO_RESIDUAL, SUM_OPERANDS, Instruction
    from npubuild.targets.npub import NpubError
    from npubuild.targets.simulator import Simulator

    target = BUILTIN_TARGETS["vnpu-m"].model_dump()
    mul = dict(
        a=0, a0=1, a1=4, a2=2, a3=2, a_bits=8, b=64, b0=1, b1=4, b2=1, b3=1, b_bits=8,
        dst=128, o0=1, o1=4, o2=2, o3=2, out_bits=8, za=0, zb=0, m0=1 << 30, shift=31, out_zp=0,
        **{k: NO_RESIDUAL[k] for k in SUM_OPERANDS}, then_add=1, **NO_CLAMP,
    )  # fmt: skip
    Simulator(target["sram_kib"] * 1024, 1024, target).execute([Instruction("mul", {**mul, "add_term": 0})])
    with pytest.raises(NpubError, match="mul adds operand 2"):
        Simulator(target["sram_kib"] * 1024, 1024, target).execute(
            [Instruction("mul", {**mul, "add_term": 2})]
        )
