"""import: load and check an ONNX model, pin dynamic dims, upgrade the opset, infer shapes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from npubuild.errors import UserError, one_line
from npubuild.stages.onnx_utils import (
    default_opset,
    describe_values,
    dims,
    load_model,
    node_attributes,
    op_histogram,
    save_model,
    set_types,
    with_outputs,
    write_json,
)


def _pin_inputs(model: onnx.ModelProto, declared: dict[str, list[int]]) -> None:
    initializers = {t.name for t in model.graph.initializer}
    graph_inputs = [i for i in model.graph.input if i.name not in initializers]
    names = [i.name for i in graph_inputs]
    for name in declared:
        if name not in names:
            raise UserError(f"input_shapes names '{name}', but the model's inputs are {names}")
    for value in graph_inputs:
        shape = value.type.tensor_type.shape
        current = dims(value)
        want = declared.get(value.name)
        if want is None:
            dynamic = [i for i, d in enumerate(current) if not isinstance(d, int) or d <= 0]
            if dynamic or not value.type.tensor_type.HasField("shape"):
                example = [d if isinstance(d, int) and d > 0 else "N" for d in current]
                raise UserError(
                    f"input '{value.name}' has dynamic dimension {dynamic[0] if dynamic else '(rank)'} "
                    f'({current}); declare input_shapes = {{"{value.name}": {example}}} in onnx_model'
                )
            continue
        if len(want) != len(current) and value.type.tensor_type.HasField("shape"):
            raise UserError(
                f"input_shapes['{value.name}'] has rank {len(want)}, the model's input has {current}"
            )
        for i, (have, new) in enumerate(zip(current, want)):
            if isinstance(have, int) and have > 0 and have != new:
                raise UserError(
                    f"input_shapes['{value.name}'] sets dim {i} to {new}, but the model fixes it to {have}"
                )
        del shape.dim[:]
        for d in want:
            shape.dim.add().dim_value = d
    # Let shape inference recompute everything downstream of the pinned inputs.
    del model.graph.value_info[:]
    for out in model.graph.output:
        if out.type.tensor_type.HasField("shape"):
            out.type.tensor_type.ClearField("shape")


def _constant_inputs_to_initializers(model: onnx.ModelProto) -> None:
    """Old IR versions list initializers as graph inputs too; they are constants, not inputs."""
    initializers = {t.name for t in model.graph.initializer}
    keep = [i for i in model.graph.input if i.name not in initializers]
    if len(keep) != len(model.graph.input):
        del model.graph.input[:]
        model.graph.input.extend(keep)


_DATA_DEPENDENT_OPS = {"NonZero", "NonMaxSuppression", "Unique", "TopK", "Compress", "Loop", "If", "Scan"}


def _static(value: onnx.ValueInfoProto) -> bool:
    t = value.type.tensor_type
    return t.HasField("shape") and all(isinstance(d, int) and d > 0 for d in dims(value)) and t.elem_type != 0


def _complete_shapes_by_execution(model: onnx.ModelProto) -> int:
    """Fill in shapes that onnx's inference could not derive (e.g. Shape->Cast->Reshape chains).

    With every input dim pinned, a shape depends on data only through data-dependent ops; we refuse
    those rather than record a shape that holds for zeros only.
    """
    graph = model.graph
    known = {v.name: v for v in [*graph.input, *graph.value_info, *graph.output]}
    initializers = {t.name for t in graph.initializer}
    missing = []
    for node in graph.node:
        for name in node.output:
            if name and name not in initializers and not (name in known and _static(known[name])):
                missing.append(name)
    if not missing:
        return 0
    culprits = [n for n in graph.node if n.op_type in _DATA_DEPENDENT_OPS]
    if culprits:
        first = culprits[0]
        raise UserError(
            f"shape inference could not derive static shapes for {missing[:3]}: {first.op_type} "
            f"'{first.name or first.output[0]}' makes shapes depend on data (control flow or "
            "data-dependent sizes have no fixed NPU schedule)"
        )
    results = _run_on_zeros(with_outputs(model, missing))
    arrays = {name: np.asarray(results[name]) for name in missing}
    set_types(graph, {n: (onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in arrays.items()})
    return len(missing)


# Protocol buffers cannot hold more; a larger model has to stay in external data, which we refuse.
_MAX_EMBEDDED = (2 << 30) - (64 << 20)


def _run_on_zeros(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Every output of `model` for all-zero inputs, computed by onnxruntime. onnxruntime is the
    float reference of every later stage (optimize's check, calibration, evaluation), so a model
    it cannot load or run is the model's problem, said here in one line, not a later crash."""
    from npubuild.stages.feeds import session

    initializers = {t.name for t in model.graph.initializer}
    feeds = {}
    for value in model.graph.input:
        if value.name not in initializers:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
            feeds[value.name] = np.zeros([int(d) for d in dims(value)], dtype=dtype)
    try:
        reference = session(model)
        names = [o.name for o in reference.get_outputs()]
        return dict(zip(names, reference.run(names, feeds)))
    except Exception as exc:  # onnxruntime's own types (Fail, InvalidGraph, NotImplemented, ...)
        raise UserError(f"onnxruntime (the float reference) cannot run the model: {one_line(exc)}") from None


def _refuse_empty_maps(model: onnx.ModelProto) -> None:
    """A floating-point tensor with a dimension of 0 (a window larger than its padded input, a
    stride past the map's end) holds no values: every op after it computes nothing, and no later
    stage has a schedule for it. Integer tensors (shape arithmetic) and 1-D ones (an empty Resize
    scales or roi) may be empty on purpose."""
    floats = {
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.FLOAT16,
        onnx.TensorProto.DOUBLE,
        onnx.TensorProto.BFLOAT16,
    }
    values = {v.name: v for v in [*model.graph.value_info, *model.graph.output]}
    for node in model.graph.node:
        for name in node.output:
            value = values.get(name)
            if value is None or value.type.tensor_type.elem_type not in floats:
                continue
            shape = dims(value)
            if len(shape) >= 2 and 0 in shape:  # (1-D: an empty Resize scales or roi, on purpose)
                raise UserError(
                    f"{node.op_type} '{node.name or name}' makes '{name}' of shape {shape}, which holds no "
                    "values: nothing after it can be computed"
                )


_WINDOWED = {"Conv", "MaxPool", "AveragePool", "LpPool"}


def _refuse_windows_past_their_input(model: onnx.ModelProto) -> None:
    """A convolution or pool whose window (dilated) is larger than its padded input along an axis
    has no output position by ONNX's formula, yet onnx's shape inference and onnxruntime round
    the negative quotient towards zero and make one; what that position holds is not defined, so
    the model is refused rather than computed one way here and another there."""
    values = {v.name: v for v in [*model.graph.input, *model.graph.value_info, *model.graph.output]}
    weights = {t.name: list(t.dims) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type not in _WINDOWED or not node.input or node.input[0] not in values:
            continue
        attrs = node_attributes(node)
        if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            continue  # SAME_* pads to fit; VALID of a window past the input is caught by inference
        spatial = dims(values[node.input[0]])[2:]
        kernel = attrs.get("kernel_shape") or (
            weights.get(node.input[1], [])[2:] if len(node.input) > 1 else []
        )
        if not spatial or len(kernel) != len(spatial) or not all(isinstance(d, int) for d in spatial):
            continue
        nd = len(kernel)
        pads = list(attrs.get("pads") or [0] * 2 * nd)
        dilations = list(attrs.get("dilations") or [1] * nd)
        for i in range(nd):
            padded = spatial[i] + pads[i] + pads[i + nd]
            span = (kernel[i] - 1) * dilations[i] + 1
            if padded < span:
                raise UserError(
                    f"{node.op_type} '{node.name or node.output[0]}': its window spans {span} along axis "
                    f"{2 + i}, more than its padded input's {padded}: no output position is defined"
                )


def _tensors_of(graph: onnx.GraphProto):
    """Every tensor a graph holds: initializers and attribute tensors, subgraphs included."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _tensors_of(attr.g)
            for sub in attr.graphs:
                yield from _tensors_of(sub)


def _embed_external_data(model: onnx.ModelProto, files: dict[str, Path]) -> int:
    """Move external data into the model, reading only the files the BUILD declared (`data` of
    onnx_model; `files` maps the location a tensor names to its copy). Never the working
    directory, never a path that leaves the model's folder. Returns the bytes embedded."""
    total = 0
    for tensor in _tensors_of(model.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        path = files.get(location)
        if path is None:
            raise UserError(
                f"tensor '{tensor.name}' keeps its data in the external file '{location}', which the "
                "onnx_model does not declare: list it in 'data' (beside the model file)"
            )
        try:
            offset = int(info.get("offset", "0"))
            length = int(info["length"]) if "length" in info else path.stat().st_size - offset
        except ValueError:
            raise UserError(f"tensor '{tensor.name}': bad external-data offset or length {info}") from None
        if offset < 0 or length < 0 or offset + length > path.stat().st_size:
            raise UserError(
                f"tensor '{tensor.name}': external data [{offset}, {offset + length}) lies outside "
                f"'{location}' ({path.stat().st_size} bytes)"
            )
        if tensor.data_type != onnx.TensorProto.STRING:
            itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
            expected = int(np.prod(tensor.dims, dtype=np.int64)) * itemsize
            if expected != length:
                raise UserError(
                    f"tensor '{tensor.name}': its external data has {length} bytes, its shape "
                    f"{list(tensor.dims)} needs {expected}"
                )
        total += length
        if total > _MAX_EMBEDDED:
            raise UserError("the model's external data exceeds 2 GiB, more than an ONNX file can embed")
        with open(path, "rb") as f:
            f.seek(offset)
            tensor.raw_data = f.read(length)
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT
    return total


def run(params: dict, inputs: dict[str, Path], outdir: Path) -> dict[str, Path]:
    model = load_model(inputs["model"], "the model file")
    if not model.graph.output:
        raise UserError("the model has no outputs: nothing to compute")
    data = {name.removeprefix("data/"): path for name, path in inputs.items() if name.startswith("data/")}
    _embed_external_data(model, data)
    opset_before = default_opset(model)
    nodes_before = len(model.graph.node)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise UserError(f"the model fails the ONNX checker: {one_line(exc)}") from None
    warnings: list[str] = []
    # Convert the model as it was written: before IR version 4 initializers had to be listed as
    # graph inputs too, and the converter checks the model by its own IR version's rules.
    if opset_before < params["opset"]:
        try:
            model = onnx.version_converter.convert_version(model, params["opset"])
        except Exception as exc:
            raise UserError(
                f"cannot upgrade the model from opset {opset_before} to {params['opset']}: {one_line(exc)}"
            ) from None
    if model.ir_version < 7:
        model.ir_version = 7
    _constant_inputs_to_initializers(model)
    _pin_inputs(model, params["input_shapes"])
    try:
        model = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    except Exception as exc:
        raise UserError(f"shape inference failed: {one_line(exc)}") from None
    # Tensors whose static shape onnx's inference could not derive; read from one run instead.
    shapes_from_execution = _complete_shapes_by_execution(model)
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:
        raise UserError(f"the imported model fails the ONNX checker: {one_line(exc)}") from None
    if not shapes_from_execution:
        _run_on_zeros(model)  # (a run for shapes above has already shown that onnxruntime can)
    _refuse_empty_maps(model)
    _refuse_windows_past_their_input(model)
    for out in model.graph.output:
        if any(not isinstance(d, int) or d <= 0 for d in dims(out)):
            warnings.append(f"output '{out.name}' has no static shape after inference: {dims(out)}")
    # Weights may be initializers or (in Paddle exports) Constant nodes; count both.
    tensors = [
        *model.graph.initializer,
        *(a.t for n in model.graph.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"),
    ]
    parameters = int(sum(np.prod(t.dims, dtype=np.int64) for t in tensors))
    summary = {
        "nodes_in_file": nodes_before,
        "nodes": len(model.graph.node),
        "ops": op_histogram(model),
        "opset_before": opset_before,
        "opset": default_opset(model),
        "inputs": describe_values(model.graph.input),
        "outputs": describe_values(model.graph.output),
        "parameters": parameters,
        "shapes_from_execution": shapes_from_execution,
        "warnings": warnings,
    }
    return {
        "model": save_model(model, outdir / "canonical.onnx"),
        "summary": write_json(outdir / "import.json", summary),
    }
