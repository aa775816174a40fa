"""Softmax, LayerNormalization and the tabulated element-wise functions (Pow, Sqrt, Erf, GELU,
c / x, ...): their integer kernels against exact rational arithmetic written out here, and small
models through quantize and the back end on an SRAM small enough to tile the rows, bit-exact
between the simulator and the golden interpreter and close to onnxruntime's float results."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_integer_ops import round_half_away

from npubuild.intmodel.fixedpoint import quantize_multiplier
from npubuild.intmodel.rowwise import exp_table, layernorm_rows, softmax_rows

RNG = np.random.default_rng(17)


def test_softmax_kernel_is_the_rounded_ratio_of_table_entries():
    table, rshift = exp_table(0.05, 8)
    assert rshift == 0 and table[0] == 1 << 15
    x = RNG.integers(-128, 128, (5, 37)).astype(np.int64)
    got = softmax_rows(x, table, rshift, 8)
    for row, out in zip(x, got):
        e = [int(table[min(int(row.max() - v), table.size - 1)]) for v in row]
        total = sum(e)
        want = [max(-128, min(127, round_half_away(Fraction(v * 256, total)) - 128)) for v in e]
        assert out.tolist() == want
    # and the table is exp: the probabilities are the float softmax's within a step
    real = x * 0.05
    ref = np.exp(real - real.max(axis=1, keepdims=True))
    ref /= ref.sum(axis=1, keepdims=True)
    assert np.abs((got + 128) / 256 - ref).max() < 2 / 256


def test_softmax_of_int16_inputs_uses_a_coarser_table():
    table, rshift = exp_table(1e-4, 16)
    assert rshift == 4 and table.size <= 4097
    x = RNG.integers(-30000, 30000, (3, 50)).astype(np.int64)
    got = softmax_rows(x, table, rshift, 16)
    real = x * 1e-4
    ref = np.exp(real - real.max(axis=1, keepdims=True))
    ref /= ref.sum(axis=1, keepdims=True)
    assert np.abs(got / 32768 - ref).max() < 1e-3


def test_layernorm_kernel_matches_exact_arithmetic():
    n, zp = 24, 5
    x = RNG.integers(-128, 128, (4, n)).astype(np.int64)
    gamma = RNG.uniform(-2, 2, n)
    beta = RNG.uniform(-1, 1, n)
    out_scale, out_zp, eps_codes = 0.03, -3, 7
    params = np.zeros((n, 3), np.int64)
    for i in range(n):
        m0, shift = quantize_multiplier(abs(gamma[i]) / (out_scale * 4096))
        params[i] = (int(math.copysign(m0, gamma[i])), shift, round(beta[i] / out_scale))
    got = layernorm_rows(x, zp, eps_codes, params, out_zp, 8)
    for row, out in zip(x, got):
        xc = [int(v) - zp for v in row]
        s, ss = sum(xc), sum(v * v for v in xc)
        d = n * ss - s * s + eps_codes
        sd = math.isqrt(d << 16)
        for i, v in enumerate(xc):
            z = round_half_away(Fraction((n * v - s) << 20, sd))
            m0, shift, bq = (int(p) for p in params[i])
            y = round_half_away(Fraction(z * m0, 2 ** (31 + shift))) + bq + out_zp
            assert out[i] == max(-128, min(127, y))
    # and it is a layer norm: dequantized, within a few output steps of the float one
    xf = (x - zp).astype(np.float64)
    norm = (xf - xf.mean(1, keepdims=True)) / np.sqrt(xf.var(1, keepdims=True) + eps_codes / n**2)
    assert np.abs((got - out_zp) * out_scale - (norm * gamma + beta)).max() < 3 * out_scale


def _model(nodes, inits, shape, opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def _compile_and_compare(tmp_path, model, samples, sram_kib=8, settings=None):
    """The model through calibrate, quantize and the back end on a small vnpu-s; returns the
    partition plan, the op kinds, and the simulator's and onnxruntime's outputs."""
    from test_quantize import SETTINGS, pipeline

    from npubuild.intmodel.interpreter import load_integer_model
    from npubuild.targets import npub
    from npubuild.targets.compile import compile_npub, plan_partition
    from npubuild.targets.runtime import Runtime
    from npubuild.targets.spec import BUILTIN_TARGETS

    tmp_path.mkdir(parents=True, exist_ok=True)
    _, q, report, summary = pipeline(tmp_path, model, settings=settings or SETTINGS, samples=samples)
    program, arrays, interpreter = load_integer_model(q["integer"])
    tiny = BUILTIN_TARGETS["vnpu-s"].model_copy(update={"sram_kib": sram_kib})
    plan = plan_partition(program, arrays, model, tiny)
    data, _, _ = compile_npub(program, arrays, model, tiny, plan)
    runtime = Runtime(npub.read(data))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    results = []
    for sample in samples[:3]:
        feed = {"x": sample[None]}
        golden, _ = interpreter.run(feed)
        got = runtime.run(feed)
        np.testing.assert_array_equal(got["y"], golden["y"])
        results.append((got["y"], session.run(None, feed)[0]))
    return plan, summary, results


def _cosine(a, b) -> float:
    a, b = a.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_attention_like_block_runs_on_the_npu_bit_exact(tmp_path):
    """MatMul -> Softmax over the last axis -> LayerNormalization: 64 rows of 96 cut into bands."""
    w = (RNG.standard_normal((32, 96)) * 0.2).astype(np.float32)
    inits = {
        "w": w,
        "gamma": RNG.uniform(0.5, 1.5, 96).astype(np.float32),
        "beta": RNG.uniform(-0.2, 0.2, 96).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Softmax", ["h"], ["p"], axis=-1),
        helper.make_node("LayerNormalization", ["p", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5),
    ]
    model = _model(nodes, inits, [1, 64, 32])
    samples = RNG.standard_normal((8, 64, 32)).astype(np.float32)
    plan, summary, results = _compile_and_compare(tmp_path, model, samples, sram_kib=8)
    assert {"softmax", "layernorm"} <= set(summary["op_kinds"])
    assert plan["npu_ops"] == 3 and plan["cpu_ops"] == 1  # the input's quantize on the CPU
    for got, ref in results:
        assert _cosine(got, ref) > 0.99


def test_tabulated_functions_and_a_reciprocal_are_lookup_tables_on_the_npu(tmp_path):
    inits = {"two": np.array(2.0, np.float32), "one": np.array(1.0, np.float32)}
    nodes = [
        helper.make_node("Pow", ["x", "two"], ["sq"]),
        helper.make_node("Add", ["sq", "one"], ["s1"]),
        helper.make_node("Sqrt", ["s1"], ["r"]),
        helper.make_node("Div", ["one", "r"], ["inv"]),
        helper.make_node("Erf", ["inv"], ["e"]),
        helper.make_node("Mul", ["e", "x"], ["y"]),
    ]
    model = _model(nodes, inits, [1, 4, 8, 8])
    samples = RNG.standard_normal((8, 4, 8, 8)).astype(np.float32)
    plan, summary, results = _compile_and_compare(tmp_path, model, samples, sram_kib=64)
    assert summary["float_ops"] == 0 and summary["op_kinds"]["lut"] == 4
    # the Add of a constant after Pow reads only Pow's table: the table absorbs it (absorb.py)
    assert "add" not in summary["op_kinds"] and plan["npu_ops"] == 5
    for got, ref in results:
        assert _cosine(got, ref) > 0.99


def _attention(t: int, d: int, h: int) -> onnx.ModelProto:
    """Q K^T over h heads, Softmax, times V, then an output projection: x [1, t, d] -> y."""
    inits = {f"w{s}": (RNG.standard_normal((d, d)) * 0.2).astype(np.float32) for s in "qkvo"}
    inits["heads"] = np.array([1, t, h, d // h], np.int64)
    inits["back"] = np.array([1, t, d], np.int64)
    inits["scale"] = np.array(1 / np.sqrt(d // h), np.float32)
    nodes = []
    for s in "qkv":
        nodes.append(helper.make_node("MatMul", ["x", f"w{s}"], [f"{s}0"]))
        nodes.append(helper.make_node("Reshape", [f"{s}0", "heads"], [f"{s}1"]))
    nodes += [
        helper.make_node("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["k1"], ["kt"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["v1"], ["v"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["q", "kt"], ["s0"]),
        helper.make_node("Mul", ["s0", "scale"], ["s"]),
        helper.make_node("Softmax", ["s"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["o0"]),
        helper.make_node("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["o1", "back"], ["o2"]),
        helper.make_node("MatMul", ["o2", "wo"], ["y"]),
    ]
    return _model(nodes, inits, [1, t, d])


def test_multi_head_attention_runs_on_the_npu_bit_exact(tmp_path):
    """Q K^T over 4 heads, Softmax, times V: two MatMuls of activations (batch_matmul), the
    projections and head transposes around them, all on the NPU, tiled on a 8 KiB SRAM."""
    t, d = 24, 32
    samples = RNG.standard_normal((8, t, d)).astype(np.float32)
    plan, summary, results = _compile_and_compare(tmp_path, _attention(t, d, 4), samples, sram_kib=8)
    assert summary["float_ops"] == 0 and summary["op_kinds"]["batch_matmul"] == 2
    assert plan["cpu_ops"] == 1  # only the input's conversion to codes
    for got, ref in results:
        assert _cosine(got, ref) > 0.99


def test_attention_probabilities_on_the_int16_grid_by_default(tmp_path):
    """softmax_bits: over 96 tokens a probability is about 1/96, 2-3 codes of the int8 grid. The
    default puts the Softmax's result on the int16 grid, which the attention-times-values MatMul
    reads at int16 and the NPU runs bit-exact, and the outputs come closer to onnxruntime's."""
    from test_quantize import SETTINGS

    t, d = 96, 32
    model, samples = _attention(t, d, 2), RNG.standard_normal((8, t, d)).astype(np.float32)
    errors, wide = {}, {}
    for bits in (16, 8):
        settings = SETTINGS | {"softmax_bits": bits}
        _, summary, results = _compile_and_compare(tmp_path / str(bits), model, samples, 32, settings)
        wide[bits] = summary["tensor_bits"].get("16", 0)
        errors[bits] = sum(float(((got - ref) ** 2).sum()) for got, ref in results)
    assert wide[16] == wide[8] + 1  # the probabilities (the network output is int16 in both)
    assert errors[16] < 0.8 * errors[8], errors


@pytest.mark.parametrize(
    "field, value",
    [("eps", -1), ("eps", 1 << 60), ("out_bits", 12), ("shift", 200), ("m0", 1 << 40)],
)
def test_a_forged_layernorm_instruction_is_one_npub_error(field, value):
    """An .npub is untrusted: a layernorm whose epsilon, width, multiplier or shift the encoder
    could not have written stops with one NpubError, not garbage codes or a numpy warning."""
    from npubuild.targets.isa import Instruction
    from npubuild.targets.npub import NpubError
    from npubuild.targets.simulator import Simulator
    from npubuild.targets.spec import BUILTIN_TARGETS

    target = BUILTIN_TARGETS["vnpu-s"]
    sim = Simulator(target.sram_kib * 1024, 1024, target.model_dump())
    params = np.array([[1 << 30, 0, 0]] * 4, np.int64)
    if field in ("shift", "m0"):
        params[:, {"m0": 0, "shift": 1}[field]] = value
    sim.sram.write(1024, 64, params.reshape(1, -1))
    args = {"src": 0, "rows": 2, "n": 4, "in_bits": 8, "in_zp": 0, "eps": 1, "params": 1024, "dst": 512,
            "out_bits": 8, "out_zp": 0}  # fmt: skip
    if field in args:
        args[field] = value
    with pytest.raises(NpubError, match="layernorm .* out of range"):
        sim.execute([Instruction("layernorm", args)])
