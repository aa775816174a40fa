"""Lookup tables absorb the per-code ops after them.

A `lut` op maps each code of its input to an output code. An op that reads nothing but that
output and a constant scalar -- an add or a multiply by the scalar, a clamp -- computes each of its
codes from one code of the table's output, so from one code of the table's input: the table can
hold the composition. The codes are the same (every table entry goes through the absorbed op's own
integer rule, the one the golden interpreter and the simulator apply), the intermediate tensor is
no longer written, and the feature map is read once instead of two or three times, on the NPU as
in the golden interpreter. PP-LCNet's HardSwish followed by its learnable scale and bias (PP-OCRv4
det, 34 tables) is the common case.

The QDQ export is made from the integer model before this pass: it keeps every quantization point
of the float graph, which this pass does not move (the absorbed ops' roundings stay in the table).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from npubuild.intmodel.fixedpoint import add_codes, multiply_codes
from npubuild.intmodel.program import TensorQuant


def known_ranks(model) -> dict[str, int]:
    """The rank of every tensor of the ONNX model whose shape shape inference recorded."""
    infos = (*model.graph.input, *model.graph.value_info, *model.graph.output)
    return {
        vi.name: len(vi.type.tensor_type.shape.dim) for vi in infos if vi.type.tensor_type.HasField("shape")
    }


def absorb_into_tables(meta: dict, arrays: dict, ranks: dict[str, int]) -> tuple[dict, dict]:
    """The integer model (its header and arrays, as stored) with every chain of per-code ops after
    a `lut` folded into the table. `ranks`: the rank of each tensor whose rank is known (a
    constant with more axes than the tensor it is added to would broadcast it to a larger shape,
    which a table cannot)."""
    ops = [dict(op) for op in meta["ops"]]
    arrays = dict(arrays)
    tensors = dict(meta["tensors"])
    outputs = set(meta["outputs"])
    readers = Counter(i for op in ops for i in op["inputs"])
    reader = {i: op for op in ops for i in op["inputs"]}  # the reader, where there is only one
    absorbed: set[int] = set()
    for op in ops:
        if op["kind"] != "lut" or id(op) in absorbed:
            continue
        while True:
            y = op["outputs"][0]
            if y in outputs or readers[y] != 1 or tensors[y].get("channel_shifts"):
                break  # (a per-channel result's entries are not its codes: they are shifted)
            after = reader[y]
            rule = _per_code_rule(after, y, arrays, tensors, ranks.get(y))
            if rule is None:
                break
            key = op["arrays"]["table"]
            arrays[key] = rule(arrays[key].astype(np.int64)).astype(np.int32)
            op["outputs"] = list(after["outputs"])
            absorbed.add(id(after))
            del tensors[y]
    kept = [op for op in ops if id(op) not in absorbed]
    still_read = {key for op in kept for key in op.get("constants", {}).values()}
    for op in ops:
        if id(op) in absorbed:  # its constant scalar, unless another op reads the same array
            for key in set(op.get("constants", {}).values()) - still_read:
                del arrays[key]
    return {**meta, "ops": kept, "tensors": tensors}, arrays


def _per_code_rule(op: dict, y: str, arrays: dict, tensors: dict, rank: int | None):
    """The function of y's codes that `op` computes, when it reads only y and constant scalars;
    else None."""
    kind = op["kind"]
    if kind == "clamp":
        lo, hi = op["attrs"]["min"], op["attrs"]["max"]
        return lambda codes: np.clip(codes, lo, hi)
    if kind not in ("add", "mul") or len(op["inputs"]) != 2 or op["inputs"].count(y) != 1:
        return None
    constants = op.get("constants", {})
    other = next(i for i in op["inputs"] if i != y)
    if other not in constants:
        return None
    value = arrays[constants[other]]
    if value.size != 1 or value.ndim > (rank if rank is not None else 0):
        return None
    value = value.astype(np.int64).reshape(())
    y_first = op["inputs"][0] == y
    at, out = op["attrs"], tensors[op["outputs"][0]]
    # a per-channel result's codes on its base grid: the table's entries, which the lut shifts
    zero_point, bits = out["zero_point"], TensorQuant.model_validate(out).computed_bits

    def rule(codes: np.ndarray) -> np.ndarray:
        a, b = (codes, value) if y_first else (value, codes)
        if kind == "add":
            return add_codes(a, at["za"], at["ma"], b, at["zb"], at["mb"], zero_point, bits)
        return multiply_codes(a, at["za"], b, at["zb"], at["m0"], at["shift"], zero_point, bits)

    return rule
