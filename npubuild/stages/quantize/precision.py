"""Per-layer precision tables: which layers a search chooses for, how a table becomes quantize
overrides, and the documented JSON format a user can also write by hand.

    {"version": 1, "layers": {"<node name>": "int8" | "int16" | "float", ...}}

Layers not listed keep the npu_model's default. A Reshape/Transpose/Split/MaxPool-like op, and a
ReLU/Clip fused into the MAC before it, follow the precision of the layer that feeds them.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx

from npubuild.errors import UserError
from npubuild.intmodel.ops import MAC_OPS, MOVE_OPS
from npubuild.stages.onnx_utils import tensor_readers
from npubuild.stages.quantize.planning import Planner, node_label

PRECISIONS = ("int8", "int16", "float")


def load_table(path: Path) -> dict[str, str]:
    try:
        data = json.loads(Path(path).read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"precision table is not valid JSON: {exc}") from None
    layers = data.get("layers") if isinstance(data, dict) else None
    if not isinstance(layers, dict):
        raise UserError('precision table needs {"version": 1, "layers": {"<node>": "int8|int16|float"}}')
    bad = {k: v for k, v in layers.items() if v not in PRECISIONS}
    if bad:
        name, value = next(iter(bad.items()))
        raise UserError(
            f"precision table: layer '{name}' has precision {value!r}; use one of {', '.join(PRECISIONS)}"
        )
    return dict(layers)


class Layers:
    """The search units of a model: integer-capable nodes that are not followers."""

    def __init__(self, model: onnx.ModelProto, stats_meta: dict, stats_arrays: dict, settings: dict):
        self.model = model
        planner = Planner(model, stats_meta, stats_arrays, settings)
        self.nodes = {node_label(n): n for n in model.graph.node}
        producers = {o: n for n in model.graph.node for o in n.output}
        consumers = tensor_readers(model.graph.node)
        self.follows: dict[str, str | None] = {}  # follower -> the node whose precision it takes
        units = []
        for n in model.graph.node:
            label = node_label(n)
            if not planner.choose(n).integer:
                continue
            data = [i for i in n.input if i and i in producers]
            producer = producers[data[0]] if data else None
            fused = (
                n.op_type in ("Relu", "Clip")
                and producer is not None
                and producer.op_type in MAC_OPS
                and len(consumers.get(producer.output[0], [])) == 1
            )
            if n.op_type in MOVE_OPS or fused:
                self.follows[label] = node_label(producer) if producer is not None else None
            else:
                units.append(label)
        self.units = units

    def expand(self, table: dict[str, str]) -> dict[str, str]:
        """The table plus its followers (which take their leader's precision); layers at the
        model's default are left out."""
        full: dict[str, str] = {}
        for label in self.nodes:
            if label in self.follows:
                leader = self.follows[label]
                if leader in full:
                    full[label] = full[leader]
            elif label in table:
                full[label] = table[label]
        return full

    def unknown(self, table: dict[str, str]) -> list[str]:
        return [name for name in table if name not in self.nodes]


def precision_overrides(table: dict[str, str]) -> list[dict]:
    """A precision table as quantize overrides (exact node names)."""
    out = []
    for node, precision in sorted(table.items()):
        override = {
            "match": _escape_glob(node),
            "op_type": None,
            "bits": None,
            "method": None,
            "keep_float": False,
        }
        if precision == "float":
            override["keep_float"] = True
        else:
            override["bits"] = 16 if precision == "int16" else 8
        out.append(override)
    return out


def _escape_glob(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[]" else c for c in name)
