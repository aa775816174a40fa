"""The integer model as quantize stores it (quantized.npq): the planned program, its JSON header
and its arrays, lookup tables having absorbed the per-code ops after them (absorb.py). Shared by
the quantize stage, the precision probe's confirmations and the search's prices."""

from __future__ import annotations

import numpy as np

from npubuild.stages.onnx_utils import default_opset
from npubuild.stages.quantize.absorb import absorb_into_tables, known_ranks
from npubuild.stages.quantize.encoding import build_program


def build_integer_model(
    model, stats_meta: dict, stats_arrays: dict, params: dict, range_cache=None, absorb: bool = True
):
    """The program, its JSON header and its arrays, as stored in quantized.npq (absorb=False:
    before lookup tables absorb the per-code ops after them, the form the QDQ export mirrors)."""
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
    if absorb:
        meta, arrays = absorb_into_tables(meta, arrays, known_ranks(model))
    return program, meta, arrays
