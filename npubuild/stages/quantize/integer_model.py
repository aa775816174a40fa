"""The integer model as quantize stores it (quantized.npq): the planned program, its JSON header
and its arrays. Shared by the quantize stage and the precision probe's confirmations."""

from __future__ import annotations

import numpy as np

from npubuild.stages.onnx_utils import default_opset
from npubuild.stages.quantize.encoding import build_program


def build_integer_model(model, stats_meta: dict, stats_arrays: dict, params: dict, range_cache=None):
    """The program, its JSON header and its arrays, as stored in quantized.npq."""
    program = build_program(model, stats_meta, stats_arrays, params, range_cache)
    initializers = {t.name for t in model.graph.initializer}
    meta = {
        "version": 1,
        "inputs": [i.name for i in model.graph.input if i.name not in initializers],
        "outputs": [o.name for o in model.graph.output],
        "ops": program.ops,
        **({"pixel_inputs": program.pixel_inputs} if program.pixel_inputs else {}),
        "tensors": program.tensors,
        "float_nodes": program.float_nodes,
        "opset": default_opset(model),
        "functions": [],
    }
    arrays = dict(program.arrays)
    for i, f in enumerate(model.functions):
        key = f"function/{i}"
        arrays[key] = np.frombuffer(f.SerializeToString(deterministic=True), dtype=np.uint8)
        meta["functions"].append(key)
    return program, meta, arrays
