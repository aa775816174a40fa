"""Each optimize pass on small hand-built graphs: the rewrite happens, and onnxruntime gives the
same outputs before and after (the reference is the unoptimized graph, not our code)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npubuild.stages.optimize.stage import optimize

RNG = np.random.default_rng(7)


def model(nodes, inputs, outputs, inits=(), opset=13):
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


def run(m, feeds):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def ops(m):
    return [n.op_type for n in m.graph.node]


def x_info(shape, name="x"):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def check_same(original, optimized, shape, atol=1e-5):
    feeds = {"x": RNG.standard_normal(shape).astype(np.float32)}
    for a, b in zip(run(original, feeds), run(optimized, feeds)):
        np.testing.assert_allclose(a, b, atol=atol, rtol=1e-5)


def conv_weights(cout=4, cin=3):
    return RNG.standard_normal((cout, cin, 3, 3)).astype(np.float32), RNG.standard_normal(cout).astype(
        np.float32
    )


def test_batchnorm_folds_into_conv():
    w, b = conv_weights()
    bn = [
        RNG.uniform(0.5, 2, 4).astype(np.float32),
        RNG.standard_normal(4).astype(np.float32),
        RNG.standard_normal(4).astype(np.float32),
        RNG.uniform(0.5, 2, 4).astype(np.float32),
    ]
    m = model(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("BatchNormalization", ["c", "g", "be", "m", "v"], ["y"], epsilon=1e-3),
        ],
        [x_info([1, 3, 8, 8])],
        [x_info([1, 4, 8, 8], "y")],
        [("w", w), ("b", b), ("g", bn[0]), ("be", bn[1]), ("m", bn[2]), ("v", bn[3])],
    )
    out, log = optimize(m, [], 8)
    assert ops(out) == ["Conv"]
    assert log[0]["changes"]["fold_batchnorm"] == 1
    check_same(m, out, [1, 3, 8, 8], atol=1e-4)


@pytest.mark.parametrize(
    "op, const", [("Mul", "per_channel"), ("Add", "per_channel"), ("Div", "scalar"), ("Sub", "per_channel")]
)
def test_scale_and_shift_fold_into_conv(op, const):
    w, b = conv_weights()
    c = (RNG.uniform(0.5, 2, (1, 4, 1, 1)) if const == "per_channel" else np.array(2.5)).astype(np.float32)
    m = model(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node(op, ["c", "k"], ["y"])],
        [x_info([1, 3, 6, 6])],
        [x_info([1, 4, 4, 4], "y")],
        [("w", w), ("b", b), ("k", c)],
    )
    out, _ = optimize(m, [], 8)
    assert ops(out) == ["Conv"]
    check_same(m, out, [1, 3, 6, 6], atol=1e-4)


def test_scale_that_is_not_per_channel_is_left_alone():
    w, b = conv_weights()
    k = RNG.uniform(0.5, 2, (1, 1, 4, 4)).astype(np.float32)  # varies over space: not foldable
    m = model(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Mul", ["c", "k"], ["y"])],
        [x_info([1, 3, 6, 6])],
        [x_info([1, 4, 4, 4], "y")],
        [("w", w), ("b", b), ("k", k)],
    )
    out, _ = optimize(m, [], 8)
    assert ops(out) == ["Conv", "Mul"]


def test_silu_is_recognised_and_stays_runnable():
    m = model(
        [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])],
        [x_info([2, 5])],
        [x_info([2, 5], "y")],
    )
    out, _ = optimize(m, [], 8)
    assert [(n.domain, n.op_type) for n in out.graph.node] == [("npubuild", "SiLU")]
    assert [f.name for f in out.functions] == ["SiLU"]
    check_same(m, out, [2, 5])


def test_sigmoid_with_other_readers_is_not_fused():
    m = model(
        [
            helper.make_node("Sigmoid", ["x"], ["s"]),
            helper.make_node("Mul", ["x", "s"], ["y"]),
            helper.make_node("Add", ["s", "s"], ["z"]),
        ],
        [x_info([2, 5])],
        [x_info([2, 5], "y"), x_info([2, 5], "z")],
    )
    out, _ = optimize(m, [], 8)
    assert sorted(ops(out)) == ["Add", "Mul", "Sigmoid"]


@pytest.mark.parametrize("then_affine", [False, True], ids=["alone", "then-affine"])
@pytest.mark.parametrize("form", ["hardsigmoid", "relu6_div", "relu6_mul"])
def test_hardswish_forms_are_recognised(form, then_affine):
    """Also with a batch-norm's per-channel Mul and Add after it (PP-OCR's), which merge_affines
    must not merge the division by 6 into before the HardSwish is seen."""
    inits = [
        ("three", np.array(3.0, np.float32)),
        ("zero", np.array(0.0, np.float32)),
        ("six", np.array(6.0, np.float32)),
        ("sixth", np.array(1 / 6, np.float32)),
    ]
    if form == "hardsigmoid":
        nodes = [
            helper.make_node("HardSigmoid", ["x"], ["h"], alpha=1 / 6, beta=0.5),
            helper.make_node("Mul", ["x", "h"], ["y"]),
        ]
    else:
        nodes = [
            helper.make_node("Add", ["x", "three"], ["a"]),
            helper.make_node("Clip", ["a", "zero", "six"], ["c"]),
            helper.make_node("Mul", ["x", "c"], ["m"]),
            helper.make_node("Div", ["m", "six"], ["y"])
            if form == "relu6_div"
            else helper.make_node("Mul", ["m", "sixth"], ["y"]),
        ]
    if then_affine:
        nodes[-1].output[0] = "h2"
        nodes += [helper.make_node("Mul", ["h2", "g"], ["gy"]), helper.make_node("Add", ["gy", "b"], ["y"])]
        inits += [
            ("g", RNG.uniform(0.5, 2, 7).astype(np.float32)),
            ("b", RNG.standard_normal(7).astype(np.float32)),
        ]
    m = model(nodes, [x_info([3, 7])], [x_info([3, 7], "y")], inits)
    out, _ = optimize(m, [], 8)
    expected = [("npubuild", "HardSwish")] + [("", "Mul"), ("", "Add")] * then_affine
    assert [(n.domain, n.op_type) for n in out.graph.node] == expected
    check_same(m, out, [3, 7])


def test_constant_and_shape_folding_remove_a_shape_subgraph():
    shape_nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["newshape"], axis=0),
        helper.make_node("Reshape", ["x", "newshape"], ["y"]),
    ]
    m = model(
        shape_nodes,
        [x_info([2, 3, 4])],
        [x_info([2, 12], "y")],
        [
            ("i0", np.array(0, np.int64)),
            ("ax", np.array([0], np.int64)),
            ("minus1", np.array([-1], np.int64)),
        ],
    )
    out, log = optimize(m, [], 8)
    assert ops(out) == ["Reshape"]
    assert numpy_helper.to_array(out.graph.initializer[0]).tolist() == [2, -1]
    assert log[0]["changes"]["fold_shapes"] == 1
    check_same(m, out, [2, 3, 4])


def test_noops_and_dead_code_are_removed():
    nodes = [
        helper.make_node("Identity", ["x"], ["i"]),
        helper.make_node("Transpose", ["i"], ["t"], perm=[0, 1]),
        helper.make_node("Add", ["t", "zeros"], ["a"]),
        helper.make_node("Mul", ["a", "ones"], ["m"]),
        helper.make_node("Relu", ["m"], ["y"]),
        helper.make_node("Sigmoid", ["x"], ["unused"]),
    ]
    m = model(
        nodes,
        [x_info([2, 3])],
        [x_info([2, 3], "y")],
        [("zeros", np.zeros((1, 3), np.float32)), ("ones", np.ones(3, np.float32))],
    )
    out, _ = optimize(m, [], 8)
    assert ops(out) == ["Relu"]
    assert out.graph.node[0].input[0] == "x"
    check_same(m, out, [2, 3])


def test_noop_feeding_a_graph_output_keeps_the_output_name():
    m = model(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["r"], ["y"])],
        [x_info([4])],
        [x_info([4], "y")],
    )
    out, _ = optimize(m, [], 8)
    assert ops(out) == ["Relu"] and out.graph.node[0].output[0] == "y"
    assert [o.name for o in out.graph.output] == ["y"]


def test_common_subexpressions_are_merged():
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Relu", ["x"], ["b"]),
        helper.make_node("Add", ["a", "b"], ["y"]),
    ]
    m = model(nodes, [x_info([5])], [x_info([5], "y")])
    out, _ = optimize(m, [], 8)
    assert ops(out) == ["Relu", "Add"]
    assert list(out.graph.node[1].input) == ["a", "a"]
    check_same(m, out, [5])


def test_transposes_cancel_and_reshapes_collapse():
    nodes = [
        helper.make_node("Transpose", ["x"], ["t1"], perm=[0, 2, 1]),
        helper.make_node("Transpose", ["t1"], ["t2"], perm=[0, 2, 1]),
        helper.make_node("Reshape", ["t2", "s1"], ["r1"]),
        helper.make_node("Reshape", ["r1", "s2"], ["y"]),
    ]
    m = model(
        nodes,
        [x_info([2, 3, 4])],
        [x_info([4, 6], "y")],
        [("s1", np.array([6, 4], np.int64)), ("s2", np.array([4, 6], np.int64))],
    )
    out, _ = optimize(m, [], 8)
    assert ops(out) == ["Reshape"]
    check_same(m, out, [2, 3, 4])


def test_disabled_pass_does_not_run():
    m = model(
        [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])],
        [x_info([2, 5])],
        [x_info([2, 5], "y")],
    )
    out, log = optimize(m, ["fuse_silu"], 8)
    assert ops(out) == ["Sigmoid", "Mul"]
    assert all("fuse_silu" not in entry["changes"] for entry in log)


def test_optimize_is_deterministic():
    w, b = conv_weights()
    m = model(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"]),
            helper.make_node("Sigmoid", ["c"], ["s"]),
            helper.make_node("Mul", ["c", "s"], ["y"]),
        ],
        [x_info([1, 3, 6, 6])],
        [x_info([1, 4, 4, 4], "y")],
        [("w", w), ("b", b)],
    )
    first = optimize(m, [], 8)[0].SerializeToString(deterministic=True)
    second = optimize(m, [], 8)[0].SerializeToString(deterministic=True)
    assert first == second


def test_sum_becomes_a_chain_of_adds_and_dropout_with_an_unread_mask_goes():
    c = RNG.standard_normal((1, 3, 4, 4)).astype(np.float32)
    m = model(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("Dropout", ["r"], ["d", "mask"], name="drop"),
            helper.make_node("Sum", ["x", "d", "c"], ["s"], name="sum3"),
            helper.make_node("Sum", ["s"], ["y"], name="sum1"),
        ],
        [x_info([1, 3, 4, 4])],
        [x_info([1, 3, 4, 4], "y")],
        [("c", c)],
    )
    optimized, log = optimize(m, [], 4)
    assert ops(optimized) == ["Relu", "Add", "Add"]
    assert log[0]["changes"]["sum_to_add"] == 2 and log[0]["changes"]["remove_noops"] == 1
    check_same(m, optimized, [1, 3, 4, 4])


def test_dropout_whose_mask_is_read_stays():
    m = model(
        [
            helper.make_node("Dropout", ["x"], ["d", "mask"]),
            helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.FLOAT),
            helper.make_node("Add", ["d", "m"], ["y"]),
        ],
        [x_info([1, 4])],
        [x_info([1, 4], "y")],
    )
    optimized, _ = optimize(m, [], 4)
    assert "Dropout" in ops(optimized)
    check_same(m, optimized, [1, 4])


def test_a_large_constant_subgraph_that_makes_a_weight_is_folded():
    """Weights built by ConstantOfShape (as in the onnx package's light models) become constants
    of the Conv, however large; the same size of constant feeding data is left alone."""
    shape = np.array([256, 64, 9, 9], np.int64)  # 1.3 Mi elements, over the data limit
    value = helper.make_tensor("v", TensorProto.FLOAT, [1], [0.01])
    m = model(
        [
            helper.make_node("ConstantOfShape", ["s"], ["w"], value=value),
            helper.make_node("Conv", ["x", "w"], ["y"], pads=[4, 4, 4, 4]),
        ],
        [x_info([1, 64, 4, 4])],
        [x_info([1, 256, 4, 4], "y")],
        [("s", shape)],
    )
    optimized, _ = optimize(m, [], 4)
    assert ops(optimized) == ["Conv"]
    check_same(m, optimized, [1, 64, 4, 4], atol=1e-4)
    data = model(
        [
            helper.make_node("ConstantOfShape", ["s"], ["big"], value=value),
            helper.make_node("Add", ["x", "big"], ["y"]),
        ],
        [x_info([256, 64, 9, 9])],
        [x_info([256, 64, 9, 9], "y")],
        [("s", shape)],
    )
    optimized, _ = optimize(data, [], 4)
    assert "ConstantOfShape" in ops(optimized)


def test_a_standalone_batchnorm_becomes_a_per_channel_affine():
    c = 4
    bn = [
        RNG.uniform(0.5, 2, c).astype(np.float32),
        RNG.standard_normal(c).astype(np.float32),
        RNG.standard_normal(c).astype(np.float32),
        RNG.uniform(0.5, 2, c).astype(np.float32),
    ]
    m = model(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("BatchNormalization", ["r", "g", "b", "m", "v"], ["n"], epsilon=1e-3),
            helper.make_node("Relu", ["n"], ["y"]),
        ],
        [x_info([1, c, 5, 5])],
        [x_info([1, c, 5, 5], "y")],
        list(zip("gbmv", bn)),
    )
    optimized, log = optimize(m, [], 4)
    assert ops(optimized) == ["Relu", "Mul", "Add", "Relu"]
    assert log[0]["changes"]["batchnorm_to_affine"] == 1
    check_same(m, optimized, [1, c, 5, 5])


def test_a_run_of_per_channel_affines_becomes_one_scale_and_one_shift():
    """DenseNet's batch-norm (Mul, Add) then its Caffe Scale layer (Mul, Add), here with a Div and
    a Sub by a scalar too: one Mul and one Add compute it. A run whose middle tensor is read
    elsewhere, or by a constant that varies along another axis, is left alone."""
    c = 4
    per_channel = [RNG.uniform(0.5, 2, (c, 1, 1)).astype(np.float32) for _ in range(4)]
    m = model(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("Mul", ["r", "s1"], ["a"]),
            helper.make_node("Add", ["a", "t1"], ["b"]),
            helper.make_node("Div", ["b", "d"], ["e"]),
            helper.make_node("Mul", ["s2", "e"], ["f"]),
            helper.make_node("Add", ["f", "t2"], ["g"]),
            helper.make_node("Sub", ["g", "d"], ["h"]),
            helper.make_node("Relu", ["h"], ["y"]),
        ],
        [x_info([1, c, 5, 5])],
        [x_info([1, c, 5, 5], "y")],
        [("s1", per_channel[0]), ("t1", per_channel[1]), ("s2", per_channel[2]), ("t2", per_channel[3]),
         ("d", np.array(1.5, np.float32))],
    )  # fmt: skip
    optimized, log = optimize(m, [], 4)
    assert ops(optimized) == ["Relu", "Mul", "Add", "Relu"]
    assert log[0]["changes"]["merge_affines"] == 1
    check_same(m, optimized, [1, c, 5, 5])

    shared = model(
        [
            helper.make_node("Mul", ["x", "s1"], ["a"]),
            helper.make_node("Add", ["a", "t1"], ["b"]),
            helper.make_node("Mul", ["b", "s2"], ["f"]),
            helper.make_node("Add", ["f", "b"], ["y"]),  # b read twice: the Add stays
            helper.make_node("Mul", ["x", "rows"], ["z"]),  # one value per row
            helper.make_node("Mul", ["z", "s1"], ["w"]),
        ],
        [x_info([1, c, 5, 5])],
        [x_info([1, c, 5, 5], "y"), x_info([1, c, 5, 5], "w")],
        [("s1", per_channel[0]), ("t1", per_channel[1]), ("s2", per_channel[2]),
         ("rows", RNG.uniform(0.5, 2, (5, 1)).astype(np.float32))],
    )  # fmt: skip
    optimized, log = optimize(shared, [], 4)
    assert ops(optimized) == ["Mul", "Add", "Mul", "Add", "Mul", "Mul"]
    assert log[0]["changes"].get("merge_affines", 0) == 0


def test_a_channel_shuffle_becomes_a_4d_transpose():
    m = model(
        [
            helper.make_node("Reshape", ["x", "s5"], ["r"]),
            helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3, 4]),
            helper.make_node("Reshape", ["t", "s4"], ["y"]),
        ],
        [x_info([1, 12, 5, 7])],
        [x_info([1, 12, 5, 7], "y")],
        [("s5", np.array([1, 3, 4, 5, 7], np.int64)), ("s4", np.array([1, 12, 5, 7], np.int64))],
    )
    optimized, log = optimize(m, [], 4)
    assert log[0]["changes"]["merge_untouched_axes"] == 1
    (t,) = [n for n in optimized.graph.node if n.op_type == "Transpose"]
    assert list(t.attribute[0].ints) == [0, 2, 1, 3]
    shapes = {v.name: len(v.type.tensor_type.shape.dim) for v in optimized.graph.value_info}
    assert max(shapes.values()) == 4
    check_same(m, optimized, [1, 12, 5, 7])


def _conv1d_relu_chain():
    """x [4, 3, 16] -> Conv1d -> Relu -> Conv1d -> Relu -> y: conv1d_as_2d puts a Reshape and a
    Transpose after each Conv, between it and its Relu."""
    w1 = RNG.standard_normal((5, 3, 3)).astype(np.float32)
    w2 = RNG.standard_normal((6, 5, 3)).astype(np.float32)
    return model(
        [
            helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1]),
            helper.make_node("Relu", ["c1"], ["r1"]),
            helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1]),
            helper.make_node("Relu", ["c2"], ["y"]),
        ],
        [x_info([4, 3, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 6, 16])],
        [("w1", w1), ("w2", w2)],
    )


def test_a_clamp_after_moves_runs_next_to_its_conv():
    original = _conv1d_relu_chain()
    optimized, log = optimize(original, [], 8)
    assert any("clamps_before_moves" in it["changes"] for it in log)
    producers = {o: n for n in optimized.graph.node for o in n.output}
    for relu in (n for n in optimized.graph.node if n.op_type == "Relu"):
        assert producers[relu.input[0]].op_type == "Conv"  # nothing between a conv and its Relu
    # the moves between the two convs met and cancelled: conv, relu, conv, relu and the
    # moves into the first and out of the last
    assert ops(optimized).count("Transpose") <= 2
    check_same(original, optimized, [4, 3, 16])


def _clamp_stays_after_the_transpose(after: list) -> None:
    """x -> Conv -> Transpose -> `after` (reading the Transpose's output "t", making "y"): the
    clamp in `after` must stay where it is, and the graph compute what it did."""
    w = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    m = model(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Transpose", ["c"], ["t"], perm=[0, 2, 3, 1]),
            *after,
        ],
        [x_info([1, 3, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, 5, 4])],
        [("w", w)],
    )
    optimized, log = optimize(m, [], 8)
    assert not any("clamps_before_moves" in it["changes"] for it in log)
    check_same(m, optimized, [1, 3, 5, 5])


def test_a_clamp_whose_moved_input_is_read_elsewhere_stays():
    _clamp_stays_after_the_transpose(
        [helper.make_node("Relu", ["t"], ["r"]), helper.make_node("Add", ["t", "r"], ["y"])]
    )


def test_a_clip_with_bounds_the_graph_computes_stays_after_the_moves():
    _clamp_stays_after_the_transpose(
        [
            helper.make_node("ReduceMin", ["x"], ["lo"], keepdims=0),
            helper.make_node("Clip", ["t", "lo"], ["y"]),
        ]
    )


def test_a_transpose_that_moves_only_unit_axes_becomes_a_reshape():
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),  # [4, 1, 6] -> [1, 4, 6]: no move
        helper.make_node("Relu", ["t"], ["r"]),
        helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 1]),  # [1, 4, 6] -> [1, 6, 4]: a move
    ]
    m = model(nodes, [x_info([4, 1, 6])], [x_info([1, 6, 4], "y")])
    out, log = optimize(m, [], 8)
    assert any("unit_transposes_as_reshapes" in it["changes"] for it in log)
    assert ops(out).count("Transpose") == 1 and "Reshape" in ops(out)
    check_same(m, out, [4, 1, 6])


def _magnitude_between_transposes(second_perm):
    """x [4, 6, 5] -> Transpose -> two Slices of the middle axis -> Pow 2 each -> Add -> Sqrt ->
    Transpose by `second_perm` (the STFT magnitude conv1d_as_2d leaves in Silero VAD)."""
    const = [
        ("s0", np.array([0], np.int64)),
        ("e0", np.array([3], np.int64)),
        ("e1", np.array([6], np.int64)),
        ("ax", np.array([1], np.int64)),
        ("two", np.array(2.0, np.float32)),
    ]
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
        helper.make_node("Slice", ["t", "s0", "e0", "ax"], ["re"]),
        helper.make_node("Slice", ["t", "e0", "e1", "ax"], ["im"]),
        helper.make_node("Pow", ["re", "two"], ["re2"]),
        helper.make_node("Pow", ["im", "two"], ["im2"]),
        helper.make_node("Add", ["re2", "im2"], ["sum"]),
        helper.make_node("Sqrt", ["sum"], ["mag"]),
        helper.make_node("Transpose", ["mag"], ["y"], perm=second_perm),
    ]
    shape = [3, 6, 5] if second_perm == [1, 0, 2] else [5, 6, 3]
    return model(nodes, [x_info([6, 4, 5])], [x_info(shape, "y")], const)


def test_element_wise_ops_between_a_transpose_and_its_inverse_run_without_both():
    m = _magnitude_between_transposes([1, 0, 2])
    out, log = optimize(m, [], 8)
    assert any("transposes_through_elementwise" in it["changes"] for it in log)
    assert "Transpose" not in ops(out)
    check_same(m, out, [6, 4, 5])


def test_transposes_around_element_wise_ops_stay_where_the_second_is_not_the_inverse():
    m = _magnitude_between_transposes([2, 1, 0])
    out, log = optimize(m, [], 8)
    assert not any("transposes_through_elementwise" in it["changes"] for it in log)
    assert ops(out).count("Transpose") == 2
    check_same(m, out, [6, 4, 5])
