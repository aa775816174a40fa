"""The exact form of the QDQ export: onnxruntime running it gives the golden interpreter's codes on
every integer tensor, end to end, at 8 bits, 16 bits and mixed; the standard form stays
DequantizeLinear -> op -> QuantizeLinear."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_quantize import SETTINGS  # the settings the other quantize tests use

from conftest import small_model
from npubuild.intmodel.interpreter import load_integer_model
from npubuild.stages import calibrate
from npubuild.stages.feeds import session
from npubuild.stages.onnx_utils import with_outputs
from npubuild.stages.quantize import stage as quantize_stage

RNG = np.random.default_rng(11)


def _every_exact_kind() -> onnx.ModelProto:
    """Conv with a fused Relu, depthwise Conv, ConvTranspose, Add of two tensors and of a
    constant, Sigmoid and HardSwish tables, GlobalAveragePool, Gemm: every op the exact form
    rewrites, with channels wide enough that sums reach far beyond one code."""
    weights = {
        "w1": RNG.normal(size=(8, 3, 3, 3)) * 0.4,
        "b1": RNG.normal(size=8),
        "wd": RNG.normal(size=(8, 1, 3, 3)) * 0.5,
        "bd": RNG.normal(size=8) * 0.3,
        "wt": RNG.normal(size=(8, 6, 2, 2)) * 0.3,
        "bt": RNG.normal(size=6) * 0.2,
        "k": RNG.normal(size=(1, 6, 1, 1)),
        "wg": RNG.normal(size=(6, 5)) * 0.5,
        "bg": RNG.normal(size=5) * 0.1,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
        helper.make_node("Conv", ["r1", "wd", "bd"], ["d"], pads=[1, 1, 1, 1], group=8, name="depthwise"),
        helper.make_node("Add", ["d", "r1"], ["res"], name="residual"),
        helper.make_node("ConvTranspose", ["res", "wt", "bt"], ["up"], strides=[2, 2], name="up"),
        helper.make_node("HardSwish", ["up"], ["hs"], name="hardswish"),
        helper.make_node("Add", ["hs", "k"], ["shifted"], name="add_constant"),
        helper.make_node("Sigmoid", ["shifted"], ["sg"], name="sigmoid"),
        helper.make_node("GlobalAveragePool", ["sg"], ["pooled"], name="gap"),
        helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "wg", "bg"], ["y"], name="gemm"),
    ]
    graph = helper.make_graph(
        nodes,
        "every_exact_kind",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def _quantize(case, model: onnx.ModelProto, calibration: np.ndarray, settings: dict):
    """calibrate and quantize `model` in directory `case`: (QDQ export, program, arrays,
    interpreter)."""
    np.save(case / "cal.npy", calibration.astype(np.float32))
    onnx.save(model, case / "m.onnx")
    for d in ("cal", "q"):
        (case / d).mkdir()
    cal = calibrate.run({}, {"model": case / "m.onnx", "calibration": case / "cal.npy"}, case / "cal")
    out = quantize_stage.run(settings, {"model": case / "m.onnx", "stats": cal["stats"]}, case / "q")
    return onnx.load(out["qdq"]), *load_integer_model(out["integer"])


def _quantized(tmp_path, settings: dict):
    model = _every_exact_kind()
    return _quantize(tmp_path, model, RNG.normal(size=(8, 3, 8, 8)), settings)


SIXTEEN = [{"match": name, "bits": 16} for name in ("depthwise", "residual", "hardswish", "gap")]


@pytest.mark.parametrize(
    "settings",
    [SETTINGS, {**SETTINGS, "activation_bits": 16}, {**SETTINGS, "overrides": SIXTEEN}],
    ids=["int8", "int16", "mixed"],
)
def test_onnxruntime_computes_the_integer_models_codes_on_every_tensor(tmp_path, settings):
    qdq, program, _, interpreter = _quantized(tmp_path, settings)
    assert {op.kind for op in program.ops} >= {"conv", "add", "lut", "global_avgpool"}
    if settings["overrides"]:
        assert {t.bits for t in program.tensors.values()} == {8, 16}
    if settings == SETTINGS:  # the ConvTranspose's result: a fine pre-activation
        (shifted,) = [op for op in program.ops if op.kind == "lut" and op.attrs.index_shift]
        assert program.tensors[shifted.inputs[0]].bits == 16
    names = sorted(program.tensors)
    fetch = [f"{t}__q" for t in names]
    qdq_session = session(with_outputs(qdq, fetch))
    input_name = qdq.graph.input[0].name
    for x in (RNG.normal(size=(1, 3, 8, 8)) * scale for scale in (0.5, 1.0, 3.0)):
        x = x.astype(np.float32)
        codes = dict(zip(names, qdq_session.run(fetch, {input_name: x})))
        _, env = interpreter.run({input_name: x}, keep=True)
        for name in names:
            np.testing.assert_array_equal(
                codes[name].astype(np.int64), env[name].astype(np.int64), err_msg=name
            )


def test_the_exact_form_reads_codes_and_the_standard_form_dequantizes(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    exact, *_ = _quantized(tmp_path / "a", SETTINGS)
    standard, *_ = _quantized(tmp_path / "b", {**SETTINGS, "qdq_export": "standard"})
    exact_ops = {n.op_type for n in exact.graph.node}
    standard_ops = {n.op_type for n in standard.graph.node}
    assert "Gather" in exact_ops and "Floor" in exact_ops
    assert not standard_ops & {"Gather", "Floor", "Sign", "Clip"}
    # standard: every Conv reads a dequantized weight
    producers = {o: n.op_type for n in standard.graph.node for o in n.output}
    assert all(
        producers.get(n.input[1]) == "DequantizeLinear" for n in standard.graph.node if n.op_type == "Conv"
    )
    # neither keeps the float weights it replaced
    for model in (exact, standard):
        assert not {"w1", "wd", "wt", "wg"} & {t.name for t in model.graph.initializer}


def test_a_16_bit_layer_with_a_bias_beyond_int64_products_is_exact(tmp_path):
    """A bias of 300 on the grid of a 16-bit input of ~0.01 and weights of ~0.1 is ~2^40 codes:
    times a 31-bit multiplier it leaves int64, and the export takes the split product."""
    w = RNG.normal(size=(2, 3, 1, 1)).astype(np.float32) * 0.1
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv")],
        "bias",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])],
        [
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(np.array([300.0, -250.0], np.float32), "b"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    np.save(tmp_path / "cal.npy", (RNG.normal(size=(4, 3, 4, 4)) * 0.01).astype(np.float32))
    for d in ("cal", "q"):
        (tmp_path / d).mkdir()
    cal = calibrate.run(
        {}, {"model": tmp_path / "m.onnx", "calibration": tmp_path / "cal.npy"}, tmp_path / "cal"
    )
    out = quantize_stage.run(
        {**SETTINGS, "activation_bits": 16},
        {"model": tmp_path / "m.onnx", "stats": cal["stats"]},
        tmp_path / "q",
    )
    qdq = onnx.load(out["qdq"])
    assert any(n.output[0].endswith("__carry") for n in qdq.graph.node)  # the split product
    _, _, interpreter = load_integer_model(out["integer"])
    probe = session(with_outputs(qdq, ["y__q"]))
    for scale in (0.01, 0.03):
        x = (RNG.normal(size=(1, 3, 4, 4)) * scale).astype(np.float32)
        _, env = interpreter.run({"x": x}, keep=True)
        (codes,) = probe.run(["y__q"], {"x": x})
        np.testing.assert_array_equal(codes.astype(np.int64), env["y"].astype(np.int64))


def test_layernorm_is_exact_in_the_export(tmp_path):
    """LayerNormalization (the first op where ViT's export differed from the integer model: one
    code on a quarter of the elements) in int64 ops: every code equal, rows wide and narrow, int8
    and int16 inputs, a negative scale."""
    for width, rows, settings in (
        (96, 8, SETTINGS),
        (7, 5, SETTINGS),
        (96, 8, {**SETTINGS, "activation_bits": 16}),
    ):
        case = tmp_path / f"{width}_{settings['activation_bits']}"
        case.mkdir()
        gamma = RNG.normal(size=width) * 0.8
        gamma[0] = -abs(gamma[0])
        weights = {
            "w": RNG.normal(size=(width, width)) * 0.2,
            "gamma": gamma,
            "beta": RNG.normal(size=width) * 0.1,
        }
        nodes = [
            helper.make_node("MatMul", ["x", "w"], ["h"], name="project"),
            helper.make_node(
                "LayerNormalization", ["h", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5, name="norm"
            ),
        ]
        model = small_model(nodes, "norm", {"x": [1, rows, width]}, {"y": [1, rows, width]}, weights, 17)
        qdq, program, _, interpreter = _quantize(case, model, RNG.normal(size=(8, rows, width)) * 2, settings)
        assert "layernorm" in {op.kind for op in program.ops}
        assert "LayerNormalization" not in {n.op_type for n in qdq.graph.node}  # rewritten, not float
        qdq_session = session(with_outputs(qdq, ["y__q"]))
        for scale in (0.3, 1.0, 4.0):
            x = (RNG.normal(size=(1, 1, rows, width)) * scale).astype(np.float32)[0]
            (codes,) = qdq_session.run(["y__q"], {"x": x})
            _, env = interpreter.run({"x": x}, keep=True)
            np.testing.assert_array_equal(codes.astype(np.int64), env["y"].astype(np.int64))


@pytest.mark.parametrize("softmax_bits, opset", [(16, 17), (8, 17), (16, 18)])
def test_softmax_is_exact_in_the_export(tmp_path, softmax_bits, opset):
    """Softmax in int64 ops (its table, the row's sum, the rounding division): every probability
    code equal at both widths, with ReduceMax's axes as an attribute (opset 17) and as an input
    (18). A float Softmax between Q/DQ pairs is a code off on the int16 grid, often enough that
    ViT-S's export drifted from its integer model."""
    rows, width = 6, 40
    weights = {"w": RNG.normal(size=(16, width)) * 0.6, "v": RNG.normal(size=(width, 8)) * 0.3}
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["logits"], name="scores"),
        helper.make_node("Softmax", ["logits"], ["p"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["p", "v"], ["y"], name="mix"),
    ]
    model = small_model(nodes, "attention_row", {"x": [1, rows, 16]}, {"y": [1, rows, 8]}, weights, opset)
    calibration = RNG.normal(size=(8, rows, 16)) * 2
    settings = {**SETTINGS, "softmax_bits": softmax_bits}
    qdq, program, _, interpreter = _quantize(tmp_path, model, calibration, settings)
    assert program.tensors["p"].bits == softmax_bits
    assert "Softmax" not in {n.op_type for n in qdq.graph.node}  # rewritten, not float
    qdq_session = session(with_outputs(qdq, ["p__q", "y__q"]))
    for scale in (0.3, 1.0, 4.0):
        x = (RNG.normal(size=(1, rows, 16)) * scale).astype(np.float32)
        p, y = qdq_session.run(["p__q", "y__q"], {"x": x})
        _, env = interpreter.run({"x": x}, keep=True)
        np.testing.assert_array_equal(p.astype(np.int64), env["p"].astype(np.int64))
        np.testing.assert_array_equal(y.astype(np.int64), env["y"].astype(np.int64))


def test_a_product_of_two_activations_is_exact_in_the_export(tmp_path):
    """Attention's probabilities times its values (both activations, int16 times int8 over 197
    tokens: sums up to 2^30, which float32 rounds) in float64, then requantized: every code equal.
    ViT-S's export drifted from its integer model by such 1-code differences (cosine 0.9979)."""
    tokens, width = 197, 16
    weights = {"w": RNG.normal(size=(width, tokens)) * 0.6, "v": RNG.normal(size=(width, 8)) * 0.3}
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["logits"], name="scores"),
        helper.make_node("Softmax", ["logits"], ["p"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["x", "v"], ["values"], name="values"),
        helper.make_node("MatMul", ["p", "values"], ["y"], name="mix"),
    ]
    model = small_model(nodes, "attention", {"x": [1, tokens, width]}, {"y": [1, tokens, 8]}, weights, 17)
    calibration = RNG.normal(size=(8, tokens, width)) * 2
    qdq, program, _, interpreter = _quantize(tmp_path, model, calibration, {**SETTINGS, "softmax_bits": 16})
    assert next(op for op in program.ops if op.outputs == ["y"]).kind == "batch_matmul"
    mix = next(n for n in qdq.graph.node if n.op_type == "MatMul" and n.output[0].startswith("mix"))
    assert all(i.endswith("centred_f64") for i in mix.input)  # the codes, in float64
    qdq_session = session(with_outputs(qdq, ["y__q"]))
    for scale in (0.3, 1.0, 4.0):
        x = (RNG.normal(size=(1, tokens, width)) * scale).astype(np.float32)
        (y,) = qdq_session.run(["y__q"], {"x": x})
        _, env = interpreter.run({"x": x}, keep=True)
        np.testing.assert_array_equal(y.astype(np.int64), env["y"].astype(np.int64))
