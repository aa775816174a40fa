"""Which integer-model ops run on the NPU and which on the CPU, and in what subgraphs.

An op goes to the NPU when every constraint of `support.NPU` holds for it on this target (op type
and widths supported, shapes the engines address, a tiling that fits SRAM); otherwise to the CPU,
with the first failing constraint's reason. Ops are then ordered into subgraphs: a topological
order that, whenever it can, keeps running ops of the device it is on, so that NPU<->CPU
transitions are as few as the dependencies allow.
"""

from __future__ import annotations

from npubuild.intmodel.program import IntegerModel, Op
from npubuild.targets.spec import TargetSpec
from npubuild.targets.support import OpView, npu_blocker


def order(ops: list[Op], devices: list[str]) -> list[dict]:
    """Subgraphs [{"device", "ops": [index...]}]: a topological order that stays on one device
    while any op of it is ready."""
    deps: list[set[int]] = []
    last_writer: dict[str, int] = {}
    readers: dict[str, set[int]] = {}
    for i, op in enumerate(ops):
        # read after write, and (for in-place quantize ops) write after read and write
        d = {last_writer[n] for n in op.inputs if n in last_writer}
        for n in op.outputs:
            if n in last_writer:
                d.add(last_writer[n])
            d |= readers.get(n, set())
        d.discard(i)
        deps.append(d)
        for n in op.inputs:
            readers.setdefault(n, set()).add(i)
        for n in op.outputs:
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


def partition(program: IntegerModel, arrays: dict, shapes: dict, target: TargetSpec, fits=None) -> dict:
    """Every op's device and reason, then the subgraphs. `fits(op)`, when given, says whether the
    code generator can tile an op the NPU supports into this target's SRAM at all."""
    ops = program.ops
    devices, fallbacks = [], []
    for op in ops:
        reason = npu_blocker(OpView(op, program, arrays, shapes, target, fits))
        devices.append("cpu" if reason else "npu")
        if reason:
            fallbacks.append({"node": op.label, "kind": op.kind, "reason": reason})
    subgraphs = order(ops, devices)
    return {
        "target": target.name,
        "subgraphs": subgraphs,
        "fallbacks": fallbacks,
        "npu_ops": devices.count("npu"),
        "cpu_ops": devices.count("cpu"),
        "transitions": max(len(subgraphs) - 1, 0),
    }
