"""The work of each op of a model, for the precision search: MACs, output elements, and the
elements it reads and writes (which a layer moved to the CPU pays for; search/prices.py)."""

from __future__ import annotations

import numpy as np
import onnx

from npubuild.stages.onnx_utils import recorded_shapes
from npubuild.stages.quantize.graphinfo import node_label


def op_work(model: onnx.ModelProto) -> dict[str, dict]:
    """Per node: MACs (for MAC ops), output elements, and input+output bytes in int8."""
    shapes = recorded_shapes(model)
    consts = {t.name: list(t.dims) for t in model.graph.initializer}

    def size(name: str) -> int:
        s = shapes.get(name) or consts.get(name) or []
        return int(np.prod(s, dtype=np.int64)) if s else 0

    work = {}
    for n in model.graph.node:
        out = size(n.output[0]) if n.output else 0
        macs = 0
        if n.op_type in ("Conv", "ConvTranspose") and len(n.input) > 1 and n.input[1] in consts:
            w = consts[n.input[1]]
            per = int(np.prod(w[1:]))  # Cin/g * k...  (ConvTranspose: Cout/g * k)
            macs = out * per if n.op_type == "Conv" else size(n.input[0]) * per
        elif n.op_type in ("MatMul", "Gemm") and len(n.input) > 1:
            w = consts.get(n.input[1]) or shapes.get(n.input[1]) or [0]
            macs = out * int(w[0] if n.op_type == "MatMul" else w[-1])
        bytes_moved = sum(size(i) for i in n.input if i and i not in consts) + out
        work[node_label(n)] = {"macs": macs, "elements": out, "bytes": bytes_moved, "op_type": n.op_type}
    return work
