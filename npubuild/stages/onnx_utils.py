"""Small helpers over onnx protos shared by the stages."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import onnx

from npubuild.errors import UserError


def load_model(path: Path, what: str) -> onnx.ModelProto:
    data = path.read_bytes()
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception:  # protobuf raises DecodeError or RuntimeWarning-like errors depending on backend
        raise UserError(f"{what} is not a valid ONNX model (protobuf parse failed)") from None
    if not model.graph.node and not model.graph.output:
        raise UserError(f"{what} is not a valid ONNX model (no graph)")
    return model


def with_outputs(model: onnx.ModelProto, names) -> onnx.ModelProto:
    """A copy of the model that also returns these tensors (to observe intermediate values)."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    existing = {o.name for o in probe.graph.output}
    for name in names:
        if name not in existing:
            probe.graph.output.add().name = name
            existing.add(name)
    return probe


def save_model(model: onnx.ModelProto, path: Path) -> Path:
    path.write_bytes(model.SerializeToString(deterministic=True))
    return path


def default_opset(model: onnx.ModelProto) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return o.version
    return 0


def set_types(graph: onnx.GraphProto, types: dict[str, tuple[int, list[int]]]) -> None:
    """Record each tensor's (element type, shape) in the graph: in its output entry if it is a
    graph output, else in its value_info entry, which is replaced or, where there is none,
    appended (in the order of `types`)."""
    entries: dict[str, onnx.ValueInfoProto] = {}
    for value in graph.value_info:
        entries.setdefault(value.name, value)
    entries.update((value.name, value) for value in graph.output)
    for name, (elem, shape) in types.items():
        info = onnx.helper.make_tensor_value_info(name, elem, list(shape))
        if name in entries:
            entries[name].CopyFrom(info)
        else:
            graph.value_info.append(info)


def node_attributes(node: onnx.NodeProto) -> dict[str, Any]:
    """The node's attributes by name, as Python values (onnx.helper.get_attribute_value)."""
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def tensor_readers(nodes) -> dict[str, list[onnx.NodeProto]]:
    """Each tensor's reading nodes, in graph order (an absent optional input, "", is no tensor)."""
    found: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for name in node.input:
            if name:
                found.setdefault(name, []).append(node)
    return found


def recorded_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Each graph input's, output's and recorded intermediate's dims as the model states them (0
    for a symbolic dim, [] for a value with no shape)."""
    return {
        v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in [*model.graph.input, *model.graph.value_info, *model.graph.output]
    }


def dims(value_info: onnx.ValueInfoProto) -> list[int | str]:
    shape = value_info.type.tensor_type.shape
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in shape.dim]


def dtype_name(elem_type: int) -> str:
    return onnx.helper.tensor_dtype_to_np_dtype(elem_type).name if elem_type else "undefined"


def describe_values(values: Any) -> list[dict]:
    return [
        {"name": v.name, "shape": dims(v), "dtype": dtype_name(v.type.tensor_type.elem_type)} for v in values
    ]


def op_histogram(model: onnx.ModelProto) -> dict[str, int]:
    return dict(sorted(Counter(n.op_type for n in model.graph.node).items()))


def write_json(path: Path, value: Any) -> Path:
    path.write_text(json.dumps(value, indent=1, sort_keys=True, allow_nan=False) + "\n")
    return path
