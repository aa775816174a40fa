"""ReLUs in an add's or a mul's output path (format 5.0): a clamp whose only input is an Add's or
a Mul's result, read by nothing else, is applied by that op as it writes (DenseNet's batch norm,
Mul + Add + ReLU, before each convolution); and in a convolution's, after the residual Add it
applies (format 7.0: ResNet's and ShuffleNet's blocks). The simulator still computes the integer
model's codes, and the fused binary has fewer instructions."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from test_quantize import SETTINGS  # the settings the other quantize tests use

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
    - add4: read by a ReLU and by the next Add as well: its ReLU stays an op;
    - bn6: another Add + ReLU, whose ReLU and the conv after it a precision table may keep float;
    - conv7 + add8 + relu8: a residual block, relu1's result plus conv7's, then ReLU (the Add
      runs in conv7's output path, the ReLU after it there too)."""
    weights = {
        "w1": rng.normal(size=(16, 3, 3, 3)) * 0.4,
        "w2": rng.normal(size=(16, 16, 1, 1)) * 0.3,
        "scale": rng.uniform(0.5, 1.5, size=(1, 16, 1, 1)),
        "shift": rng.normal(size=(1, 16, 1, 1)) * 0.5,
        "w7": rng.normal(size=(16, 16, 3, 3)) * 0.1,
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
        helper.make_node("Add", ["c1", "shift"], ["a6"], name="bn6"),
        helper.make_node("Relu", ["a6"], ["r6"], name="relu6"),
        helper.make_node("Conv", ["r6", "w2"], ["c6"], name="conv6"),
        helper.make_node("Add", ["c6", "c2"], ["w"], name="add7"),
        helper.make_node("Conv", ["r1", "w7"], ["c7"], pads=[1, 1, 1, 1], name="conv7"),
        helper.make_node("Add", ["c7", "r1"], ["a8"], name="add8"),
        helper.make_node("Relu", ["a8"], ["v"], name="relu8"),
    ]
    outputs = {"y": [1, 16, 12, 12], "z": [1, 16, 12, 12], "w": [1, 16, 12, 12], "v": [1, 16, 12, 12]}
    return small_model(nodes, "clamps", {"x": [1, 3, 12, 12]}, outputs, weights)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    rng = np.random.default_rng(17)
    model = _model(rng)
    samples = rng.normal(size=(8, 3, 12, 12)).astype(np.float32)
    # relu6 and conv6 kept float: bn6's only reader is a float op, whose output is no integer
    # tensor (a precision table's float layers; this once raised a KeyError)
    kept = [dict(match=n, op_type=None, bits=None, method=None, keep_float=True) for n in ("relu6", "conv6")]
    variants = {"default": SETTINGS, "float_reader": {**SETTINGS, "overrides": kept}}
    out = integer_variants(model, tmp_path_factory.mktemp("clamp"), samples, variants)
    return model, out


def _fusion(model, program, arrays) -> tuple[dict[str, str], set[str]]:
    """On vnpu-m: {add or mul: the clamp it runs} and the ops absorbed, by node name."""
    fusion = fuse(
        program, plan_partition(program, arrays, model, BUILTIN_TARGETS["vnpu-m"]), model_shapes(model)
    )
    names = {i: op.node for i, op in enumerate(program.ops)}
    return {names[i]: names[j] for i, j in fusion.clamp.items()}, {names[i] for i in fusion.absorbed}


def test_the_clamps_fused_are_those_of_a_result_read_by_nothing_else(built):
    model, variants = built
    clamps, absorbed = _fusion(model, *variants["default"][:2])
    assert clamps == {
        "bn_shift": "relu1",
        "mul2": "relu2",
        "add3": "relu3",
        "bn6": "relu6",
        "conv7": "relu8",
    }
    assert absorbed >= {"relu1", "relu2", "relu3", "add8", "relu8"} and "relu4" not in absorbed


@pytest.mark.parametrize("target_name", ["vnpu-m", "vnpu-s"])
def test_a_fused_clamp_computes_the_integer_models_codes(built, target_name):
    model, variants = built
    program, arrays, interpreter = variants["default"]
    target = BUILTIN_TARGETS[target_name]
    plan = plan_partition(program, arrays, model, target)
    rng = np.random.default_rng(5)
    for group in (True, False):  # fused and every op on its own
        data, _, stats = compile_npub(program, arrays, model, target, plan, group=group)
        kinds = [row["kind"] for row in stats["layers"]]
        assert kinds.count("clamp") == (1 if group else 6), (group, kinds)  # relu4 stays an op
        assert binary_hazards(data) == []
        runtime = Runtime(npub.read(data))
        for _ in range(2):
            x = rng.normal(size=(1, 3, 12, 12)).astype(np.float32)
            got, want = runtime.run({"x": x}), interpreter.run({"x": x})[0]
            for name in ("y", "z", "w", "v"):
                np.testing.assert_array_equal(got[name], want[name])


def test_an_add_read_only_by_a_float_layer_keeps_its_codes(built):
    model, variants = built
    program, arrays, interpreter = variants["float_reader"]
    target = BUILTIN_TARGETS["vnpu-m"]
    plan = plan_partition(program, arrays, model, target)
    assert _fusion(model, program, arrays)[0] == {
        "bn_shift": "relu1",
        "mul2": "relu2",
        "add3": "relu3",
        "conv7": "relu8",
    }
    x = np.random.default_rng(6).normal(size=(1, 3, 12, 12)).astype(np.float32)
    fused, apart = (
        Runtime(npub.read(compile_npub(program, arrays, model, target, plan, group=group)[0])).run({"x": x})
        for group in (True, False)
    )
    want = interpreter.run({"x": x})[0]
    for name in ("y", "z", "w", "v"):
        np.testing.assert_array_equal(fused[name], apart[name])
        # the float layers run in onnxruntime here and in numpy in the interpreter: codes after
        # them may round the other way
        a, b = fused[name].ravel(), want[name].ravel()
        assert a @ b / (np.linalg.norm(a) * np.linalg.norm(b)) > 0.999, name


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
