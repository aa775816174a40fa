"""Models whose defect only shows when they run, found at import in one line (benchmarks/fuzz.py
--which model found both crashing a later stage as an internal error), and a stage that runs out
of memory said as such."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import OPTIMIZE_SETTINGS, run_build
from npubuild.cache.store import Store
from npubuild.errors import UserError
from npubuild.stages import importer


def _save(tmp_path, nodes, initializers, x_shape, y_shape, outputs=True) -> dict:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)] if outputs else [],
        initializers,
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return {"model": path}


RUNTIME_DEFECTS = {
    "index out of range": (
        [helper.make_node("Gather", ["x", "i"], ["y"], axis=1)],
        [numpy_helper.from_array(np.array([9], np.int64), "i")],
        [1, 6],
        [1, 1],
        "indices element out of data bounds",
    ),
    "channels that do not match": (
        [helper.make_node("Conv", ["x", "w"], ["y"])],
        [numpy_helper.from_array(np.ones((2, 3, 1, 1), np.float32), "w")],
        [1, 4, 4, 4],
        [1, 2, 4, 4],
        "Input channels C is not equal to kernel channels",
    ),
}


@pytest.mark.parametrize("defect", sorted(RUNTIME_DEFECTS))
def test_a_model_the_float_reference_cannot_run_is_refused_at_import(tmp_path, defect):
    nodes, initializers, x_shape, y_shape, reason = RUNTIME_DEFECTS[defect]
    inputs = _save(tmp_path, nodes, initializers, x_shape, y_shape)
    with pytest.raises(UserError) as raised:
        importer.run({"opset": 17, "input_shapes": {}}, inputs, tmp_path)
    message = str(raised.value)
    assert message.startswith("onnxruntime (the float reference) cannot run the model:"), message
    assert reason in message and "\n" not in message


def test_a_model_without_outputs_is_refused_at_import(tmp_path):
    inputs = _save(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], [], [1, 6], [1, 6], outputs=False)
    with pytest.raises(UserError, match="the model has no outputs"):
        importer.run({"opset": 17, "input_shapes": {}}, inputs, tmp_path)


def test_a_checker_message_that_breaks_lines_is_one_line(tmp_path):
    """onnx's checker names the node on a line of its own, inside its sentence."""
    nodes = [helper.make_node("Relu", ["t"], ["y"], name="second"), helper.make_node("Relu", ["x"], ["t"])]
    inputs = _save(tmp_path, nodes, [], [1, 6], [1, 6])
    with pytest.raises(UserError) as raised:
        importer.run({"opset": 17, "input_shapes": {}}, inputs, tmp_path)
    message = str(raised.value)
    assert "topologically sorted" in message and "name: second" in message and "\n" not in message


def test_a_stage_out_of_memory_is_one_line_and_not_an_internal_error(small_ws, store, monkeypatch):
    """What a data set too large for the machine does to a stage (numpy's MemoryError), here
    raised by the prepare stage itself: the build says which stage ran out of memory, not
    "internal error" (which tells the user to report a bug)."""
    from npubuild.stages import prepare

    def out_of_memory(params, inputs, outdir):
        raise MemoryError("Unable to allocate 29.3 GiB for an array")

    monkeypatch.setattr(prepare, "run", out_of_memory)
    outcome = run_build(small_ws, store, ["//data:calib"], jobs=1)  # in this process: the patch holds
    assert not outcome.ok
    (error,) = outcome.errors
    assert "stage 'prepare' ran out of memory" in error and "internal error" not in error, error


def test_a_window_larger_than_its_padded_input_is_refused(tmp_path):
    """floor((1 - 2) / 2) + 1 is 0 output rows by ONNX's formula; onnx's inference and onnxruntime
    truncate towards zero and make one, whose value the formula leaves undefined."""
    nodes = [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], name="pool")]
    inputs = _save(tmp_path, nodes, [], [1, 4, 1, 8], [1, 4, 1, 4])
    with pytest.raises(UserError, match="MaxPool 'pool': its window spans 2 along axis 2, more than"):
        importer.run({"opset": 17, "input_shapes": {}}, inputs, tmp_path)


def test_a_map_with_no_values_is_refused(tmp_path):
    initializers = [
        numpy_helper.from_array(np.array([3], np.int64), "starts"),
        numpy_helper.from_array(np.array([3], np.int64), "ends"),
        numpy_helper.from_array(np.array([1], np.int64), "axes"),
    ]
    nodes = [
        helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["t"], name="nothing"),
        helper.make_node("Relu", ["t"], ["y"]),
    ]
    inputs = _save(tmp_path, nodes, initializers, [1, 6], [1, 0])
    with pytest.raises(UserError, match=r"Slice 'nothing' makes 't' of shape \[1, 0\], which holds no"):
        importer.run({"opset": 17, "input_shapes": {}}, inputs, tmp_path)


@pytest.mark.slow
def test_our_own_qdq_export_builds_again_as_a_pre_quantized_model(small_ws, warm_store):
    """The standard-form export keeps the pairs a grid per channel needs (x -> Q -> DQ, x__scale);
    re-imported, the new export's own x__scale clashed with them (an internal error in
    quantize). The export's names now take a longer separator where they would clash."""
    build_file = small_ws / "models" / "BUILD"
    standard = 'npu_model(\n    quantize = {"qdq_export": "standard"},\n'
    build_file.write_text(build_file.read_text().replace("npu_model(\n", standard))
    assert run_build(small_ws, warm_store, ["//models:cls_npu"]).ok
    export = small_ws / "npubuild-out" / "models" / "cls_npu" / "quantized.qdq.onnx"
    (small_ws / "models" / "cls.onnx").write_bytes(export.read_bytes())
    outcome = run_build(small_ws, warm_store, ["//models:cls_npu"])
    assert outcome.ok, outcome.errors
    again = onnx.load(export)
    separator = {p.key: p.value for p in again.metadata_props}.get("npubuild.name_separator")
    assert separator and len(separator) > 2  # the clash was there, and avoided


def test_float64_and_integer_data_stay_float(tmp_path):
    """A model computing in float64 (as our exact QDQ export does, re-imported) or on integers:
    an integer grid stands in for float32 values only, so those ops stay float, with the reason
    (before, they got grids and the QDQ export a QuantizeLinear onnxruntime refuses)."""
    from test_quantize import SETTINGS

    from conftest import integer_variants, small_model

    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="first"),
        helper.make_node("Cast", ["a"], ["wide"], to=TensorProto.DOUBLE, name="widen"),
        helper.make_node("Neg", ["wide"], ["negated"], name="in_float64"),
        helper.make_node("Cast", ["negated"], ["back"], to=TensorProto.FLOAT, name="narrow"),
        helper.make_node("Relu", ["back"], ["y"], name="last"),
    ]
    model = small_model(nodes, "wide", {"x": [1, 4, 8, 8]}, {"y": [1, 4, 8, 8]}, {})
    samples = np.random.default_rng(0).normal(size=(4, 4, 8, 8)).astype(np.float32)
    program, _, _ = integer_variants(model, tmp_path, samples, {"int8": SETTINGS})["int8"]
    reasons = {f.node: f.reason for f in program.float_nodes}
    assert {"widen", "in_float64", "narrow"} <= set(reasons), reasons
    assert all("float64 or integer data stays float" in reasons[n] for n in ("widen", "in_float64", "narrow"))
    assert "first" not in reasons and "last" not in reasons  # float32 ops keep their integer form


def _contrib_op_model() -> onnx.ModelProto:
    """x -> Relu -> com.microsoft Gelu -> Relu -> y: onnx's inference knows no shape past the
    contrib op (onnxruntime runs it), as with the com.microsoft Q/DQ of a 16-bit QDQ model."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="first"),
        helper.make_node("Gelu", ["a"], ["g"], name="contrib", domain="com.microsoft"),
        helper.make_node("Relu", ["g"], ["y"], name="last"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def _shapes(model: onnx.ModelProto) -> dict:
    values = [*model.graph.value_info, *model.graph.output]
    return {
        v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in values
        if v.type.tensor_type.HasField("shape")
    }


def test_shapes_read_from_a_run_survive_optimize(tmp_path):
    """Import reads the shapes onnx cannot infer from a run in onnxruntime; optimize re-infers from
    scratch and lost them, and planning then took a [1, 8, 24, 96] map for a scalar (re-importing
    our exact QDQ export: simulate failed with 'cannot reshape array of size 55296 into shape')."""
    from npubuild.stages.optimize import stage as optimize_stage

    onnx.save(_contrib_op_model(), tmp_path / "m.onnx")
    imported = importer.run({"opset": 17, "input_shapes": {}}, {"model": tmp_path / "m.onnx"}, tmp_path)
    assert _shapes(onnx.load(imported["model"]))["g"] == [1, 4, 8, 8]
    np.save(tmp_path / "cal.npy", np.random.default_rng(0).normal(size=(4, 4, 8, 8)).astype(np.float32))
    settings = OPTIMIZE_SETTINGS
    (tmp_path / "o").mkdir()
    optimized = optimize_stage.run(
        settings, {"model": imported["model"], "calibration": tmp_path / "cal.npy"}, tmp_path / "o"
    )
    shapes = _shapes(onnx.load(optimized["model"]))
    assert shapes["g"] == [1, 4, 8, 8] and shapes["y"] == [1, 4, 8, 8]


def test_a_tensor_without_a_static_shape_stays_float(tmp_path):
    """Where no shape is known at all, the op on it stays float with that reason, not an NPU op
    on a scalar."""
    from test_quantize import SETTINGS

    from conftest import integer_variants

    model = onnx.shape_inference.infer_shapes(_contrib_op_model())
    samples = np.random.default_rng(0).normal(size=(4, 4, 8, 8)).astype(np.float32)
    program, _, _ = integer_variants(model, tmp_path, samples, {"int8": SETTINGS})["int8"]
    reasons = {f.node: f.reason for f in program.float_nodes}
    assert reasons.get("last") == "no static shape", reasons
    assert "first" not in reasons


@pytest.mark.slow
def test_our_exact_qdq_export_builds_again_and_simulates(small_ws, warm_store):
    """The default (exact) export computes in float64 and int16 through com.microsoft Q/DQ;
    re-imported, codegen wrote a float64 CPU input the .npub loader refused, then planned a map
    whose shape optimize had lost as a scalar on the NPU."""
    assert run_build(small_ws, warm_store, ["//models:cls_npu"]).ok
    export = small_ws / "npubuild-out" / "models" / "cls_npu" / "quantized.qdq.onnx"
    (small_ws / "models" / "cls.onnx").write_bytes(export.read_bytes())
    outcome = run_build(small_ws, warm_store, ["//models:cls_npu"])
    assert outcome.ok, outcome.errors


def test_an_op_on_constants_only_stays_float_and_a_program_with_no_npu_op_compiles(tmp_path):
    """What optimize leaves unfolded on constants (here a network output: a Softmax a mutation
    rewired to a weight's scales) has no grid to read: it stays float ("reads constants only");
    quantize raised KeyError on it. With nothing else left, the NPU gets no op at all, and the
    code generator's choice among schedules divided by their zero cycles (both found by
    benchmarks/fuzz.py --which qdq, seed 21)."""
    from test_quantize import SETTINGS

    from conftest import integer_variants
    from npubuild.targets.compile import compile_npub, plan_partition
    from npubuild.targets.spec import BUILTIN_TARGETS

    scales = np.linspace(0.01, 0.4, 40, dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("Softmax", ["scales"], ["y"], name="on_constants")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [40])],
        [numpy_helper.from_array(scales, "scales")],
    )
    model = onnx.shape_inference.infer_shapes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    )
    samples = np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32)
    program, arrays, golden = integer_variants(model, tmp_path, samples, {"int8": SETTINGS})["int8"]
    assert {f.node: f.reason for f in program.float_nodes} == {"on_constants": "reads constants only"}
    np.testing.assert_allclose(
        golden.run({"x": samples[:1]})[0]["y"], np.exp(scales) / np.exp(scales).sum(), rtol=1e-5
    )
    target = BUILTIN_TARGETS["vnpu-m"]
    plan = plan_partition(program, arrays, model, target)
    assert not [sg for sg in plan["subgraphs"] if sg["device"] == "npu"]
    _, _, stats = compile_npub(program, arrays, model, target, plan)
    assert stats["estimated_cycles"] == 0 and stats["cpu_subgraphs"] == 1


def _aborting_model() -> onnx.ModelProto:
    """An opset-11 model whose input declares a dimension of -1 (as Paddle exports write a free
    batch) and slices a feature map cast to integers: onnx's shape inference, with data
    propagation (which its version converter runs), aborts the process on it (a C++ assertion in
    std::clamp; onnx 1.19-1.23)."""
    starts = [numpy_helper.from_array(np.array([v], np.int64), n) for n, v in (("s", 0), ("e", 1), ("a", 0))]
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Cast", ["r"], ["codes"], to=TensorProto.INT32),
        helper.make_node("Slice", ["codes", "s", "e", "a"], ["first"]),
        helper.make_node("Cast", ["first"], ["y"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4, 4])],
        starts,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 6
    return model


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_model_that_aborts_onnx_fails_its_import_alone(small_ws, tmp_path, jobs):
    """The import runs in a child process (engine/isolated.py): onnx aborting on the model is the
    import's failure, one line naming the signal. Before, `-j 1` ended the build (and this test's
    process) with the assertion; `-j 2` broke the pool, and the data sets' actions running beside
    it failed too ("worker died")."""
    (small_ws / "models" / "cls.onnx").write_bytes(_aborting_model().SerializeToString())
    store = Store(tmp_path / "cache")
    try:
        outcome = run_build(small_ws, store, ["//models:cls_npu"], jobs=jobs)
    finally:
        store.close()
    assert not outcome.ok
    assert len(outcome.errors) == 1, outcome.errors
    assert "import //models:cls: stage 'import' crashed with SIGABRT in native code" in outcome.errors[0]
    assert "\n" not in outcome.errors[0]  # and no other action failed with it ("worker died")
