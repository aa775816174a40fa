"""Which integer-model ops run on the NPU and which on the CPU, and in what subgraphs.

An op goes to the NPU when the target supports its ONNX op type and the widths of its tensors,
and the back end has an instruction sequence for it; otherwise to the CPU, with the reason. Ops
are then ordered into subgraphs: a topological order that, whenever it can, keeps running ops of
the device it is on, so that NPU<->CPU transitions are as few as the dependencies allow.
"""

from __future__ import annotations

from npubuild.targets.spec import TargetSpec

# integer op kinds and the ONNX op types the target must list for them
_KIND_OPS = {
    "conv": None,  # Conv / ConvTranspose, by the op's op_type
    "matmul": None,
    "add": None,
    "mul": None,
    "concat": ("Concat",),
    "global_avgpool": ("GlobalAveragePool",),
    "avgpool": ("AveragePool",),
    "resize_nearest": ("Resize",),
    "lut": None,
    "clamp": None,
}
_ALIASES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")
_COPIES = ("Transpose", "Slice", "Split")
_MOVES = _ALIASES + _COPIES + ("MaxPool",)


def _rank_ok(shapes: dict, names) -> bool:
    return all(len(shapes.get(n, [])) <= 4 for n in names if n)


def fallback_reason(op: dict, program: dict, arrays: dict, shapes: dict, target: TargetSpec) -> str | None:
    """None if the op can run on this target's NPU, else why not (one short sentence)."""
    kind = op["kind"]
    tensors = program["tensors"]
    if kind == "float":
        return f"{op['op_type']} has no integer form (it stays float)"
    if kind == "quantize":
        return "float-to-integer conversion of a network input or a float result"
    widths = {f"int{tensors[n]['bits']}" for n in [*op["inputs"], *op["outputs"]] if n in tensors}
    missing = sorted(widths - set(target.activation_dtypes))
    if missing:
        return f"{target.name} has no {', '.join(missing)} activations"
    op_type = op.get("op_type")
    if kind in ("conv", "matmul", "add", "mul", "lut") or (kind == "move" and op_type):
        if op_type not in target.supported_ops and op_type not in ("Div", "Sub", "Relu", "Clip"):
            return f"{target.name} does not support {op_type}"
    needed = _KIND_OPS.get(kind)
    if needed and not any(t in target.supported_ops for t in needed):
        return f"{target.name} does not support {needed[0]}"
    data = [n for n in op["inputs"] if n and n not in op.get("constants", {})]
    if not _rank_ok(shapes, data + op["outputs"]):
        return "tensors of rank above 4"
    if kind == "conv":
        rank = len(shapes.get(op["inputs"][0], []))
        if rank != 4:
            return f"only 2-D convolutions run on the NPU (this one is {rank - 2}-D)"
        if op["attrs"]["transpose"] and op["attrs"]["group"] != 1:
            return "grouped ConvTranspose"
        if shapes[op["inputs"][0]][0] != 1:
            return "convolutions with batch > 1"
    if kind == "matmul" and len(shapes.get(op["inputs"][0], [])) < 1:
        return "MatMul of a scalar"
    if kind == "resize_nearest":
        src, dst = shapes[op["inputs"][0]], shapes[op["outputs"][0]]
        if len(src) != 4 or src[:2] != dst[:2]:
            return "Resize that changes batch or channels"
    if kind in ("global_avgpool", "avgpool") and len(shapes.get(op["inputs"][0], [])) != 4:
        return f"{kind} on a tensor that is not N x C x H x W"
    if kind == "move":
        if op_type not in _MOVES:
            return f"{op_type} is not a data movement the DMA engines do"
        if op_type == "MaxPool" and len(shapes.get(op["inputs"][0], [])) != 4:
            return "MaxPool on a tensor that is not N x C x H x W"
        if op_type == "Slice" and any(int(s) <= 0 for s in slice_steps(op, arrays)):
            return "Slice with a non-positive step"
    return None


def slice_steps(op: dict, arrays: dict) -> list:
    inputs, consts = op["inputs"], op.get("constants", {})
    if len(inputs) > 4 and inputs[4] in consts:
        return [int(v) for v in arrays[consts[inputs[4]]]]
    return [1]


def order(ops: list[dict], devices: list[str]) -> list[dict]:
    """Subgraphs [{"device", "ops": [index...]}]: a topological order that stays on one device
    while any op of it is ready."""
    deps: list[set[int]] = []
    last_writer: dict[str, int] = {}
    readers: dict[str, set[int]] = {}
    for i, op in enumerate(ops):
        # read after write, and (for in-place quantize ops) write after read and write
        d = {last_writer[n] for n in op["inputs"] if n in last_writer}
        for n in op["outputs"]:
            if n in last_writer:
                d.add(last_writer[n])
            d |= readers.get(n, set())
        d.discard(i)
        deps.append(d)
        for n in op["inputs"]:
            readers.setdefault(n, set()).add(i)
        for n in op["outputs"]:
            last_writer[n] = i
            readers[n] = set()
    done: set[int] = set()
    remaining = list(range(len(ops)))
    subgraphs: list[dict] = []
    current = devices[0] if ops else "cpu"
    while remaining:
        ready = [i for i in remaining if deps[i] <= done]
        here = [i for i in ready if devices[i] == current]
        if not here:
            current = "npu" if current == "cpu" else "cpu"
            continue
        i = here[0]
        if not subgraphs or subgraphs[-1]["device"] != current:
            subgraphs.append({"device": current, "ops": []})
        subgraphs[-1]["ops"].append(i)
        done.add(i)
        remaining.remove(i)
    return subgraphs


def partition(program: dict, arrays: dict, shapes: dict, target: TargetSpec, fits=None) -> dict:
    """Every op's device and reason, then the subgraphs. `fits(op)`, when given, says whether the
    code generator can tile an op the NPU supports into this target's SRAM at all."""
    ops = program["ops"]
    devices, fallbacks = [], []
    for op in ops:
        reason = fallback_reason(op, program, arrays, shapes, target)
        if reason is None and fits is not None and not fits(op):
            reason = f"does not fit {target.name}'s {target.sram_kib} KiB SRAM even in the smallest tile"
        devices.append("cpu" if reason else "npu")
        if reason:
            fallbacks.append({"node": op.get("node", op["outputs"][0]), "kind": op["kind"], "reason": reason})
    subgraphs = order(ops, devices)
    return {
        "target": target.name,
        "subgraphs": subgraphs,
        "fallbacks": fallbacks,
        "npu_ops": devices.count("npu"),
        "cpu_ops": devices.count("cpu"),
        "transitions": max(len(subgraphs) - 1, 0),
    }
