"""Canonicalisation passes: rewrite ops with no integer form into ones that have one, the way the
exporters of other frameworks would have written them (a Sum as Adds, a standalone
BatchNormalization as Mul and Add, a 5-D channel shuffle as a 4-D transpose). Each returns its
number of rewrites, like every pass in passes.py, and the stage checks the result numerically."""

from __future__ import annotations

import numpy as np
import onnx

from npubuild.stages.optimize.graph import Graph, node_attr


def sum_to_add(g: Graph) -> int:
    """Sum of n inputs -> a chain of n - 1 Adds (same broadcasting), which have an integer form;
    a Sum of one input is its input."""
    changed = 0
    for node in list(g.nodes):
        if node.op_type != "Sum" or not node.input:
            continue
        if len(node.input) == 1:
            changed += int(g.bypass(node, node.input[0]))
            continue
        chain, acc = [], node.input[0]
        for k, x in enumerate(node.input[1:], start=1):
            out = node.output[0] if k == len(node.input) - 1 else g.fresh_name(f"{node.output[0]}_sum{k}")
            name = f"{node.name or node.output[0]}_add{k}"
            chain.append(onnx.helper.make_node("Add", [acc, x], [out], name=name))
            acc = out
        index = g.nodes.index(node)
        g.nodes[index : index + 1] = chain
        changed += 1
    return changed


def bn_affine(g: Graph, bn: onnx.NodeProto) -> tuple[np.ndarray, np.ndarray] | None:
    """An inference BatchNormalization as y = x * scale + shift per channel (float64)."""
    if any(o for o in bn.output[1:]) or len(bn.input) < 5:
        return None
    gamma, beta, mean, var = (g.constant(n) for n in bn.input[1:5])
    if any(v is None for v in (gamma, beta, mean, var)):
        return None
    scale = gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + node_attr(bn, "epsilon", 1e-5))
    return scale, beta.astype(np.float64) - mean.astype(np.float64) * scale


def batchnorm_to_affine(g: Graph) -> int:
    """A BatchNormalization no convolution absorbed (after a Concat, before a ReLU) -> Mul and Add
    by per-channel constants, which have integer forms (and fold into a convolution after it
    when one follows)."""
    changed = 0
    for bn in list(g.nodes):
        if bn.op_type != "BatchNormalization" or g.elem_type(bn.input[0]) != onnx.TensorProto.FLOAT:
            continue
        shape, affine = g.shape(bn.input[0]), bn_affine(g, bn)
        if affine is None or shape is None or len(shape) < 2:
            continue
        per_channel = (-1,) + (1,) * (len(shape) - 2)
        base = bn.name or bn.output[0]
        scale = g.add_constant(f"{base}.scale", affine[0].astype(np.float32).reshape(per_channel))
        shift = g.add_constant(f"{base}.shift", affine[1].astype(np.float32).reshape(per_channel))
        scaled = g.fresh_name(f"{bn.output[0]}_scaled")
        mul = onnx.helper.make_node("Mul", [bn.input[0], scale], [scaled], name=f"{base}_scale")
        add = onnx.helper.make_node("Add", [scaled, shift], [bn.output[0]], name=f"{base}_shift")
        index = g.nodes.index(bn)
        g.nodes[index : index + 1] = [mul, add]
        changed += 1
    return changed


def per_channel(value: np.ndarray | None, channels: int, rank: int) -> np.ndarray | None:
    """A constant that broadcasts over an NC... output as one value per channel, as a vector."""
    if value is None:
        return None
    if value.size == 1:
        return np.full(channels, value.reshape(-1)[0], dtype=np.float64)
    if value.ndim > rank:
        return None
    shape = (1,) * (rank - value.ndim) + tuple(value.shape)
    if shape[1] == channels and all(s == 1 for i, s in enumerate(shape) if i != 1):
        return value.reshape(-1).astype(np.float64)
    return None


def affine_terms(op_type: str, vector: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A Mul, Div, Add or Sub of a map by a per-channel `vector` as y = x * scale + shift."""
    ones, zeros = np.ones_like(vector), np.zeros_like(vector)
    return {
        "Mul": (vector, zeros),
        "Div": (1.0 / vector, zeros),
        "Add": (ones, vector),
        "Sub": (ones, -vector),
    }[op_type]


def _affine(g: Graph, node: onnx.NodeProto) -> tuple[str, np.ndarray, np.ndarray] | None:
    """(data input, scale, shift per channel, float64) of a Mul, Div, Add or Sub of a float map by
    a constant of one value per channel (or one value), whose output has the map's shape."""
    if (
        node.op_type not in ("Mul", "Div", "Add", "Sub")
        or len(node.input) != 2
        or g.elem_type(node.output[0]) != onnx.TensorProto.FLOAT
    ):
        return None
    sides = ((0, 1), (1, 0)) if node.op_type in ("Mul", "Add") else ((0, 1),)
    for data, const in sides:
        shape = g.shape(node.input[data])
        if shape is None or len(shape) < 2 or g.shape(node.output[0]) != shape:
            continue
        vector = per_channel(g.constant(node.input[const]), shape[1], len(shape))
        if vector is None:
            continue
        if node.op_type == "Div" and not np.all(vector):
            return None
        return (node.input[data], *affine_terms(node.op_type, vector))
    return None


def merge_affines(g: Graph) -> int:
    """A run of per-channel affine ops (Mul, Div, Add, Sub by one constant per channel) -> one Mul
    then one Add, or just one of them. DenseNet's batch-norm (as Mul and Add) then its Caffe Scale
    layer (another Mul and Add) is four passes over each map on an NPU and four roundings of its
    codes where one scale and one shift compute the same: x * (s1 s2) + (t1 s2 + t2)."""
    changed = 0
    producers, uses = g.producers(), g.consumers()
    runs = []
    for node in g.nodes:
        found = _affine(g, node)
        if found is None:
            continue
        before = producers.get(found[0])
        if before is not None and _affine(g, before) is not None and _joinable(g, before.output[0], uses):
            continue  # not a run's first op
        run = [node]
        while _joinable(g, run[-1].output[0], uses) and _affine(g, follower := uses[run[-1].output[0]][0]):
            run.append(follower)
        if len(run) > 2 or (len(run) == 2 and [_kind(n) for n in run] != ["scale", "shift"]):
            runs.append(run)
    for run in runs:
        x, scale, shift = _affine(g, run[0])
        for node in run[1:]:
            _, s, t = _affine(g, node)
            scale, shift = scale * s, shift * s + t
        rank = len(g.shape(x))
        per_channel = (-1,) + (1,) * (rank - 2)
        out, base, nodes = run[-1].output[0], run[0].name or run[0].output[0], []
        if not np.all(scale == 1.0):
            y = g.fresh_name(f"{out}_scaled") if np.any(shift) else out
            factor = g.add_constant(f"{base}.scale", scale.astype(np.float32).reshape(per_channel))
            nodes.append(onnx.helper.make_node("Mul", [x, factor], [y], name=f"{base}_scale"))
            x = y
        if np.any(shift) or not nodes:
            term = g.add_constant(f"{base}.shift", shift.astype(np.float32).reshape(per_channel))
            nodes.append(onnx.helper.make_node("Add", [x, term], [out], name=f"{base}_shift"))
        index = g.nodes.index(run[0])
        for node in run:
            g.nodes.remove(node)
        g.nodes[index:index] = nodes
        changed += 1
    return changed


def _kind(node: onnx.NodeProto) -> str:
    return "scale" if node.op_type in ("Mul", "Div") else "shift"


def _joinable(g: Graph, name: str, uses: dict) -> bool:
    """Whether the tensor between two affine ops can go: one reader, not an output, no grid of its
    own from a quantized model."""
    return len(uses.get(name, [])) == 1 and name not in g.output_names() and name not in g.qdq


def merge_untouched_axes(g: Graph) -> int:
    """Reshape to 5-D -> Transpose that keeps the last two axes in place -> Reshape (ShuffleNet's
    channel shuffle): the two trailing axes become one, so the transpose is 4-D, which the NPU
    moves (its DMA boxes are 4-D)."""
    changed = 0
    producers, uses = g.producers(), g.consumers()
    for t in list(g.nodes):
        perm = node_attr(t, "perm")
        shape = g.shape(t.input[0])
        if t.op_type != "Transpose" or perm is None or shape is None or len(shape) != 5:
            continue
        if list(perm[3:]) != [3, 4] or t.output[0] in g.output_names() or t.input[0] in g.output_names():
            continue
        reshape = producers.get(t.input[0])
        after = uses.get(t.output[0], [])
        if reshape is None or reshape.op_type != "Reshape" or len(uses.get(t.input[0], [])) != 1:
            continue
        if not after or any(u.op_type != "Reshape" or u.input[0] != t.output[0] for u in after):
            continue
        merged = (*shape[:3], shape[3] * shape[4])
        reshape.input[1] = g.add_constant(
            f"{reshape.name or reshape.output[0]}.shape", np.array(merged, np.int64)
        )
        for a in list(t.attribute):
            if a.name == "perm":
                t.attribute.remove(a)
        t.attribute.append(onnx.helper.make_attribute("perm", list(perm[:3]) + [3]))
        elem = g.elem_type(t.input[0])
        g.types[t.input[0]] = (elem, merged)
        g.types[t.output[0]] = (elem, tuple(merged[p] for p in list(perm[:3]) + [3]))
        changed += 1
    return changed


def _reshaped(g: Graph, x: str, shape, label: str) -> tuple[onnx.NodeProto, str]:
    out = g.fresh_name(f"{x}_{label}")
    target = g.add_constant(f"{out}.shape", np.array(shape, np.int64))
    return onnx.helper.make_node("Reshape", [x, target], [out], name=out), out


def squeeze_unit_axes(g: Graph) -> int:
    """A Transpose or Slice of a tensor of rank above 4 with axes of size 1 it does not slice
    (attention's [3, 1, heads, T, d] after splitting q, k and v) works on the tensor without
    them: Reshape (a free view), the 4-D op, Reshape back. The NPU's DMA boxes are 4-D."""
    changed = 0
    for node in list(g.nodes):
        if node.op_type not in ("Transpose", "Slice") or not node.input:
            continue
        shape, out_shape = g.shape(node.input[0]), g.shape(node.output[0])
        if shape is None or out_shape is None or len(shape) <= 4 or 0 in shape:
            continue
        rank = len(shape)
        if node.op_type == "Slice":
            if len(node.input) < 4 or not node.input[3]:
                continue
            axes = g.constant(node.input[3])
            if axes is None or any(g.constant(i) is None for i in node.input[1:] if i):
                continue
            sliced = {int(a) % rank for a in axes.reshape(-1)}
        else:
            sliced = set()
        unit = [a for a in range(rank) if shape[a] == 1 and a not in sliced]
        if not unit or rank - len(unit) > 4:
            continue
        kept = [a for a in range(rank) if a not in unit]
        before, x = _reshaped(g, node.input[0], [shape[a] for a in kept], "squeezed")
        inner = g.fresh_name(f"{node.output[0]}_squeezed")
        new = onnx.NodeProto()
        new.CopyFrom(node)
        new.input[0], new.output[0] = x, inner
        if node.op_type == "Transpose":
            perm = node_attr(node, "perm") or list(range(rank))[::-1]
            new_perm = [kept.index(p) for p in perm if p not in unit]
            del new.attribute[:]
            new.attribute.append(onnx.helper.make_attribute("perm", new_perm))
            inner_shape = [shape[a] for a in [p for p in perm if p not in unit]]
        else:
            remapped = [kept.index(int(a) % rank) for a in g.constant(node.input[3]).reshape(-1)]
            new.input[3] = g.add_constant(f"{inner}.axes", np.array(remapped, np.int64))
            inner_shape = [out_shape[a] for a in kept]
        after = onnx.helper.make_node(
            "Reshape",
            [inner, g.add_constant(f"{node.output[0]}.shape", np.array(out_shape, np.int64))],
            [node.output[0]],
            name=f"{node.name or node.output[0]}_unsqueezed",
        )
        index = g.nodes.index(node)
        g.nodes[index : index + 1] = [before, new, after]
        elem = g.elem_type(node.input[0])
        g.types[x] = (elem, tuple(shape[a] for a in kept))
        g.types[inner] = (elem, tuple(inner_shape))
        changed += 1
    return changed


def conv1d_as_2d(g: Graph) -> int:
    """A 1-D convolution (audio, sequence models: [N, C, L] with a [O, C/g, K] weight) is the 2-D
    one with a [O, C/g, 1, K] weight over [1, C, N, L]: the N rows of a batch become the image's
    rows, which a kernel one row high never mixes (Silero VAD convolves 16 frames at once). The
    NPU's convolution is 2-D and single-batch, as Vela and TPU-MLIR lower Conv1D; the Transposes
    around it are data moves, and plain Reshapes (free views) when N is 1."""
    changed = 0
    for node in list(g.nodes):
        if node.op_type != "Conv" or len(node.input) < 2:
            continue
        weight = g.constant(node.input[1])
        shape, out_shape = g.shape(node.input[0]), g.shape(node.output[0])
        if weight is None or weight.ndim != 3 or shape is None or len(shape) != 3 or out_shape is None:
            continue
        if node_attr(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            continue  # onnx shape inference has already turned most of these into pads
        (n, c, length), (_, o, out_length) = shape, out_shape
        elem = g.elem_type(node.input[0])
        before: list[onnx.NodeProto] = []
        x = node.input[0]
        if n > 1:
            rows = g.fresh_name(f"{x}_rows")
            before.append(onnx.helper.make_node("Transpose", [x], [rows], name=rows, perm=[1, 0, 2]))
            g.types[rows] = (elem, (c, n, length))
            x = rows
        reshape, x = _reshaped(g, x, [1, c, n, length], "as_2d")
        before.append(reshape)
        g.types[x] = (elem, (1, c, n, length))
        inner = g.fresh_name(f"{node.output[0]}_2d")
        g.types[inner] = (elem, (1, o, n, out_length))
        pads = node_attr(node, "pads") or [0, 0]
        conv = onnx.helper.make_node(
            "Conv",
            [x, g.add_constant(f"{node.input[1]}_2d", weight[:, :, None, :]), *node.input[2:]],
            [inner],
            name=node.name or inner,
            kernel_shape=[1, int(weight.shape[2])],
            strides=[1, *(node_attr(node, "strides") or [1])],
            dilations=[1, *(node_attr(node, "dilations") or [1])],
            pads=[0, pads[0], 0, pads[1]],
            group=node_attr(node, "group") or 1,
        )
        after: list[onnx.NodeProto] = []
        if n > 1:
            back, y = _reshaped(g, inner, [o, n, out_length], "rows")
            g.types[y] = (elem, (o, n, out_length))
            after += [
                back,
                onnx.helper.make_node("Transpose", [y], [node.output[0]], name=f"{y}_t", perm=[1, 0, 2]),
            ]
        else:
            target = g.add_constant(f"{node.output[0]}.shape", np.array(out_shape, np.int64))
            after.append(
                onnx.helper.make_node("Reshape", [inner, target], [node.output[0]], name=f"{inner}_1d")
            )
        index = g.nodes.index(node)
        g.nodes[index : index + 1] = [*before, conv, *after]
        changed += 1
    return changed


def softmax_to_last_axis(g: Graph) -> int:
    """A Softmax over an axis that is not the last (YOLOv8's distribution focal loss head: over
    16 bins on axis 1 of [1, 16, 4, anchors]) is Transpose (swap that axis with the last),
    Softmax over the last axis, the same Transpose back: the NPU's Softmax reduces along rows, and
    the Transposes are data moves."""
    changed = 0
    for node in list(g.nodes):
        if node.op_type != "Softmax" or (node.domain or "") != "":
            continue
        shape = g.shape(node.input[0])
        if shape is None or len(shape) < 2:
            continue
        rank = len(shape)
        axis = int(node_attr(node, "axis", -1)) % rank
        if axis == rank - 1:
            continue
        perm = list(range(rank))
        perm[axis], perm[-1] = perm[-1], perm[axis]  # its own inverse
        swapped = tuple(shape[p] for p in perm)
        elem = g.elem_type(node.input[0])
        rows, probabilities = g.fresh_name(f"{node.input[0]}_rows"), g.fresh_name(f"{node.output[0]}_rows")
        g.types[rows] = g.types[probabilities] = (elem, swapped)
        index = g.nodes.index(node)
        g.nodes[index : index + 1] = [
            onnx.helper.make_node("Transpose", [node.input[0]], [rows], name=rows, perm=perm),
            onnx.helper.make_node(
                "Softmax", [rows], [probabilities], name=node.name or probabilities, axis=-1
            ),
            onnx.helper.make_node(
                "Transpose", [probabilities], [node.output[0]], name=f"{probabilities}_back", perm=perm
            ),
        ]
        changed += 1
    return changed


def _interpolation_matrix(node: onnx.NodeProto, g: Graph, size_in: int, size_out: int, scale: float | None):
    """M such that resizing one axis of x (this node's mode and coordinates) is x @ M: the
    node's own Resize applied to the identity's rows, by onnx's reference evaluator."""
    from onnx.reference import ReferenceEvaluator

    rows = np.eye(size_in, dtype=np.float32).reshape(1, size_in, 1, size_in)
    if scale is not None:
        how = {"scales": np.array([1, 1, 1, scale], np.float32)}
    else:
        how = {"sizes": np.array([1, size_in, 1, size_out], np.int64)}
    inputs = ["x", "", *(["scales"] if scale is not None else ["", "sizes"])]
    resize = onnx.helper.make_node("Resize", inputs, ["y"])
    resize.attribute.extend(node.attribute)
    graph = onnx.helper.make_graph(
        [resize],
        "axis",
        [],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [
            onnx.numpy_helper.from_array(rows, "x"),
            *(onnx.numpy_helper.from_array(v, k) for k, v in how.items()),
        ],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)])
    out = ReferenceEvaluator(model).run(None, {})[0]
    return np.ascontiguousarray(out.reshape(size_in, size_out), dtype=np.float32)


def linear_resize_as_matmuls(g: Graph) -> int:
    """A linear (bilinear) Resize of an N x C x H x W tensor is separable: x @ Mw resizes the
    width, and the same on the transposed tensor with Mh the height, where each M is the
    interpolation's constant [in, out] matrix (two nonzeros a column). MatMuls with constant
    weights and Transposes are NPU work; the NPU's resize instruction is nearest only (ViT
    saliency's decoder: one 128 -> 224 Resize, 10 M multiply-accumulates of 7.6 G)."""
    changed = 0
    for node in list(g.nodes):
        if node.op_type != "Resize" or node_attr(node, "mode", b"nearest") not in (b"linear", "linear"):
            continue
        transform = node_attr(node, "coordinate_transformation_mode", b"half_pixel")
        if transform in (b"tf_crop_and_resize", "tf_crop_and_resize") or any(
            a.name in ("antialias", "axes", "keep_aspect_ratio_policy") for a in node.attribute
        ):
            continue
        shape, out_shape = g.shape(node.input[0]), g.shape(node.output[0])
        if shape is None or out_shape is None or len(shape) != 4 or tuple(shape[:2]) != tuple(out_shape[:2]):
            continue
        scales = g.constant(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if scales is not None and scales.size == 0:
            scales = None
        if scales is None and (len(node.input) < 4 or g.constant(node.input[3]) is None):
            continue
        (n, c, h, w), (_, _, h_out, w_out) = shape, out_shape
        elem = g.elem_type(node.input[0])
        new: list[onnx.NodeProto] = []
        x = node.input[0]
        if w_out != w or (scales is not None and scales[3] != 1):
            across = _interpolation_matrix(node, g, w, w_out, None if scales is None else float(scales[3]))
            wide = g.fresh_name(f"{node.output[0]}_w") if h_out != h else node.output[0]
            new.append(onnx.helper.make_node("MatMul", [x, g.add_constant(f"{wide}.mw", across)], [wide]))
            g.types[wide] = (elem, (n, c, h, w_out))
            x = wide
        if h_out != h or (scales is not None and scales[2] != 1):
            down = _interpolation_matrix(node, g, h, h_out, None if scales is None else float(scales[2]))
            t, tall = g.fresh_name(f"{node.output[0]}_t"), g.fresh_name(f"{node.output[0]}_th")
            new += [
                onnx.helper.make_node("Transpose", [x], [t], perm=[0, 1, 3, 2]),
                onnx.helper.make_node("MatMul", [t, g.add_constant(f"{tall}.mh", down)], [tall]),
                onnx.helper.make_node("Transpose", [tall], [node.output[0]], perm=[0, 1, 3, 2]),
            ]
            g.types[t], g.types[tall] = (elem, (n, c, w_out, h)), (elem, (n, c, w_out, h_out))
        if not new:
            continue
        index = g.nodes.index(node)
        g.nodes[index : index + 1] = new
        changed += 1
    return changed


MOVES = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten"})
CLAMPS = frozenset({"Relu", "Clip"})


def clamps_before_moves(g: Graph) -> int:
    """A Relu or Clip after data moves (Reshape, Transpose, Squeeze, Unsqueeze, Flatten) of a
    result nothing else reads runs before the moves instead: an element-wise clamp commutes with
    moving elements. Next to the op that computes the values, it fuses into that op's output
    path and the op's grid is chosen for the clamped values. The case: conv1d_as_2d leaves a
    Reshape and a Transpose between each of Silero VAD's encoder Convs and its Relu, so each int8
    grid spanned the negative half the Relu then dropped, and the moves between two convs could
    not cancel (with the Relu moved up they meet the next conv's and cancel_transpose_reshape
    removes both)."""
    changed = 0
    for clamp in list(g.nodes):
        if clamp.op_type not in CLAMPS or clamp not in g.nodes:
            continue
        if any(bound and g.constant(bound) is None for bound in clamp.input[1:]):
            continue  # a Clip whose bounds are computed: they may not exist yet before the moves
        producers, inputs = g.producers(), g.input_names()
        chain, source = [], clamp.input[0]
        while (move := producers.get(source)) is not None and move.op_type in MOVES:
            if not _single_use(g, source):
                break
            chain.append(move)
            source = move.input[0]
        if not chain or source in inputs or source not in producers or not _single_use(g, source):
            continue
        # chain[0] made the clamp's input, chain[-1] reads `source`: the clamp now reads `source`
        # and the moves carry its result, under the name the clamp's readers know
        clamped = g.fresh_name(f"{source}_{clamp.op_type.lower()}")
        clamp_output = clamp.output[0]
        clamp.input[0], clamp.output[0] = source, clamped
        chain[-1].input[0] = clamped
        chain[0].output[0] = clamp_output
        g.nodes.remove(clamp)
        g.nodes.insert(g.nodes.index(chain[-1]), clamp)
        changed += 1
    return changed


def _single_use(g: Graph, name: str) -> bool:
    """Whether one node reads `name` and it is not a graph output."""
    return len(g.consumers().get(name, [])) == 1 and name not in g.output_names()


def pools_before_widening_convs(g: Graph) -> int:
    """GlobalAveragePool(Conv(x)) -> Conv(GlobalAveragePool(x)) where the convolution is pointwise
    (1 x 1, stride 1, no padding, one group) and widens its input (more output channels than
    input ones): a pointwise convolution is the same affine map at every pixel, so the mean of its
    outputs is its output for the mean pixel, bias included. The pool then reads the narrower map,
    and the wide one is no longer needed whole before anything can use it. The case: each level of
    PP-OCRv4 det's feature pyramid widens a lateral map (12 channels at 120 x 120) to 96 and
    squeezes and excites the result; its pool needed the whole 1.4 MB map before the gate could
    multiply it, so the map made a DRAM round trip. The convolution itself stays where other ops
    read its result; the pooled pixel's convolution is a second one, on one pixel."""
    changed = 0
    for pool in list(g.nodes):
        if pool.op_type != "GlobalAveragePool" or pool not in g.nodes:
            continue
        conv = g.producers().get(pool.input[0])
        if conv is None or not _pointwise_widening(g, conv):
            continue
        pooled = g.fresh_name(f"{conv.input[0]}_pooled")
        early = onnx.helper.make_node(
            "GlobalAveragePool", [conv.input[0]], [pooled], name=g.fresh_name(pool.name)
        )
        late = onnx.helper.make_node(
            "Conv", [pooled, *conv.input[1:]], [pool.output[0]], name=g.fresh_name(f"{conv.name}_pooled")
        )
        at = g.nodes.index(pool)
        g.nodes[at : at + 1] = [early, late]
        changed += 1
    return changed


def _pointwise_widening(g: Graph, conv: onnx.NodeProto) -> bool:
    """A Conv whose output pixel is one affine map of its input pixel, with constant weights of
    more output channels than input ones."""
    if conv.op_type != "Conv" or len(conv.output) != 1:
        return False
    weight = g.constant(conv.input[1])
    if weight is None or weight.ndim != 4 or tuple(weight.shape[2:]) != (1, 1):
        return False
    if len(conv.input) > 2 and conv.input[2] and g.constant(conv.input[2]) is None:
        return False
    plain = (
        node_attr(conv, "group", 1) == 1
        and all(s == 1 for s in node_attr(conv, "strides", [1, 1]))
        and not any(node_attr(conv, "pads", [0, 0, 0, 0]))
        and node_attr(conv, "auto_pad", b"NOTSET") in (b"NOTSET", b"VALID", "NOTSET", "VALID")
    )
    return plain and weight.shape[0] > weight.shape[1]
