"""ReLUs in an add's or a mul's output path (format 5.0): a clamp whose only input is an Add's or
a Mul's result, read by nothing else, is applied by that op as it writes (DenseNet's batch norm,
Mul + Add + ReLU, before each convolution). The simulator still computes the integer model's
codes, and the fused binary has fewer instructions."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from test_quantize import SETTINGS  # the quantizer defaults the other quantize tests use

from conftest import integer_variants, small_model
from npubuild.targets import npub
from npubuild.targets.backend.fusion import fuse
from npubuild.targets.compile import compile_npub, model_shapes, plan_partition
from npubuild.targets.hazards import binary_hazards
from npubuild.targets.isa import NO_CLAMP, NO_RESIDUAL, SUM_OPERANDS, Instruction
from npubuild.targets.runtime import Runtime
from npubuild.targets.simulator import Simulator
from npubuild.targets.spec import BUILTIN_TARGETS

M = BUILTIN_TARGETS["vnpu-m"].model_dump()


def _model(rng: np.random.Generator):
    """- bn: conv1's result times a per-channel scale plus a per-channel shift, then ReLU (the
      ReLU runs in the Add's output path);
    - mul2: conv2's result times a scale, then ReLU (in the Mul's);
    - add3: the two ReLUs' sum, then ReLU into the network output (in the Add's);
    - add4: read by a ReLU and by the next Add as well: its ReLU stays an op."""
    weights = {
        "w1": rng.normal(size=(16, 3, 3, 3)) * 0.4,
        "w2": rng.normal(size=(16, 16, 1, 1)) * 0.3,
        "scale": rng.uniform(0.5, 1.5, size=(1, 16, 1, 1)),
        "shift": rng.normal(size=(1, 16, 1, 1)) * 0.5,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Mul", ["c1", "scale"], ["m1"], name="bn_scale"),
        helper.make_node("Add", ["m1", "shift"], ["a1"], name="bn_shift"),
        helper.make_node("Relu", ["a1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2"),
        helper.make_node("Mul", ["c2", "scale"], ["m2"], name="mul2"),
        helper.make_node("Relu", ["m2"], ["r2"], name="relu2"),
        helper.make_node("Add", ["r1", "r2"], ["a3"], name="add3"),
        helper.make_node("Relu", ["a3"], ["y"], name="relu3"),
        helper.make_node("Add", ["c2", "c1"], ["a4"], name="add4"),
        helper.make_node("Relu", ["a4"], ["r4"], name="relu4"),
        helper.make_node("Add", ["r4", "a4"], ["z"], name="add5"),
    ]
    outputs = {"y": [1, 16, 12, 12], "z": [1, 16, 12, 12]}
    return small_model(nodes, "clamps", {"x": [1, 3, 12, 12]}, outputs, weights)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    rng = np.random.default_rng(17)
    model = _model(rng)
    samples = rng.normal(size=(8, 3, 12, 12)).astype(np.float32)
    out = integer_variants(model, tmp_path_factory.mktemp("clamp"), samples, {"default": SETTINGS})
    return model, *out["default"]


def test_the_clamps_fused_are_those_of_a_result_read_by_nothing_else(built):
    model, program, arrays, _ = built
    plan = plan_partition(program, arrays, model, BUILTIN_TARGETS["vnpu-m"])
    fusion = fuse(program, plan, model_shapes(model))
    names = {i: op.node for i, op in enumerate(program.ops)}
    assert {names[i]: names[j] for i, j in fusion.clamp.items()} == {
        "bn_shift": "relu1",
        "mul2": "relu2",
        "add3": "relu3",
    }
    assert {names[i] for i in fusion.absorbed} >= {"relu1", "relu2", "relu3"}
    assert "relu4" not in {names[i] for i in fusion.absorbed}


@pytest.mark.parametrize("target_name", ["vnpu-m", "vnpu-s"])
def test_a_fused_clamp_computes_the_integer_models_codes(built, target_name):
    model, program, arrays, interpreter = built
    target = BUILTIN_TARGETS[target_name]
    plan = plan_partition(program, arrays, model, target)
    rng = np.random.default_rng(5)
    for group in (True, False):  # fused and every op on its own
        data, _, stats = compile_npub(program, arrays, model, target, plan, group=group)
        kinds = [row["kind"] for row in stats["layers"]]
        assert kinds.count("clamp") == (1 if group else 4), (group, kinds)  # relu4 stays an op
        assert binary_hazards(data) == []
        runtime = Runtime(npub.read(data))
        for _ in range(2):
            x = rng.normal(size=(1, 3, 12, 12)).astype(np.float32)
            got, want = runtime.run({"x": x}), interpreter.run({"x": x})[0]
            for name in ("y", "z"):
                np.testing.assert_array_equal(got[name], want[name])


@pytest.mark.parametrize("op", ["add", "mul"])
def test_an_add_or_mul_clamps_what_it_writes_as_the_clamp_instruction_would(op):
    rng = np.random.default_rng(3)
    box = dict(a0=1, a1=4, a2=5, a3=6, b0=1, b1=4, b2=5, b3=6, o0=1, o1=4, o2=5, o3=6)
    args = dict(a=0, a_bits=8, b=1024, b_bits=8, dst=2048, out_bits=8, za=3, zb=-2, out_zp=-7, **box)
    if op == "add":
        args.update(ma=1 << 19, mb=3 << 18)
    else:
        args.update(
            m0=1 << 30, shift=6, **{k: NO_RESIDUAL[k] for k in ("then_add", "add_term", *SUM_OPERANDS)}
        )
    a, b = (rng.integers(-128, 128, 120).astype(np.int8) for _ in range(2))

    def written(bounds: dict, then: list) -> np.ndarray:
        sim = Simulator(M["sram_kib"] * 1024, 1024, M)
        sim.sram.write(0, 8, a[None])
        sim.sram.write(1024, 8, b[None])
        sim.execute([Instruction(op, {**args, **bounds}), *then, Instruction("end", {})])
        return np.array(sim.sram.view(2048, 8, (120,))[0])

    relu = Instruction("clamp", dict(src=2048, n=120, bits=8, min=-7, max=127, dst=2048))
    apart = written(NO_CLAMP, [relu])
    assert (apart == -7).any() and (apart > -7).any()  # the ReLU clamps some codes, not all
    np.testing.assert_array_equal(written({"min": -7, "max": 127}, []), apart)
    unclamped = written(NO_CLAMP, [])
    assert (unclamped < -7).any()


def test_a_format_4_add_or_mul_decodes_without_a_clamp():
    import struct

    from npubuild.targets.isa import OPCODES, OPERANDS, decode, encode
    from npubuild.targets.npub import NpubError

    for op in ("add", "mul"):
        names = OPERANDS[op][:-2]  # 4.x: no min, max
        stream = struct.pack("<BBBBI", OPCODES[op], 0, 0xFF, len(names), 0)
        stream += struct.pack(f"<{len(names)}q", *range(len(names))) + encode([Instruction("end", {})])
        (decoded, _) = decode(stream, format_major=4)
        assert decoded.args == {**dict(zip(names, range(len(names)))), **NO_CLAMP}
        with pytest.raises(NpubError, match="operands"):
            decode(stream)
