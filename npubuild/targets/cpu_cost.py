"""The host CPU's share of the latency estimate (docs/npu.md, "CPU cost model"): what the CPU
subgraphs cost and what each hand-over between the NPU and the CPU costs, from the target's
`cpu_gmacs`, `cpu_gelements` and `transition_us`.

A deliberately simple, documented model: an op on the CPU costs its multiply-accumulates at
`cpu_gmacs` (convolutions, matrix products) plus the elements it reads and writes at
`cpu_gelements`; each change of device between consecutive subgraphs costs `transition_us`
(cache maintenance, an interrupt, the driver's round trip). It is an estimate for comparing plans
and gating regressions, not a measurement of any particular CPU.
"""

from __future__ import annotations

import math

from npubuild.intmodel.program import IntegerModel, Op
from npubuild.targets.spec import TargetSpec

_MAC_TYPES = ("Conv", "ConvTranspose", "MatMul", "Gemm")


def _size(shape) -> int:
    return math.prod(int(d) for d in shape) if shape else 1


def op_work(op: Op, shapes: dict, arrays: dict) -> tuple[int, int]:
    """(multiply-accumulates, elements read and written) of one op."""
    elements = sum(_size(shapes.get(n, [])) for n in [*op.data_inputs, *[o for o in op.outputs if o]])
    out = _size(shapes.get(op.outputs[0], [])) if op.outputs and op.outputs[0] else 0
    weight_shape = None
    if op.kind in ("conv", "matmul"):
        weight_shape = list(arrays[op.arrays.weight].shape)
    elif op.kind == "float" and op.op_type in _MAC_TYPES and len(op.inputs) > 1:
        w = op.inputs[1]
        weight_shape = list(arrays[op.constants[w]].shape) if w in op.constants else shapes.get(w)
    elif op.kind == "batch_matmul":
        weight_shape = shapes.get(op.inputs[1])
    if not weight_shape:
        return 0, elements
    if op.op_type == "ConvTranspose" or (op.kind == "conv" and op.attrs.transpose):
        # each input element scatters into (output channels per group) x kernel outputs
        return _size(shapes.get(op.inputs[0], [])) * _size(weight_shape[1:]), elements
    if op.op_type == "Conv" or op.kind == "conv":
        return out * _size(weight_shape[1:]), elements  # input channels per group x kernel
    # a matrix product: the inner dimension per output
    return out * (int(weight_shape[-2]) if len(weight_shape) >= 2 else 1), elements


def cpu_estimate(program: IntegerModel, arrays: dict, shapes: dict, plan: dict, target: TargetSpec) -> dict:
    """Milliseconds on the CPU, the number of NPU/CPU hand-overs and their milliseconds."""
    macs = elements = 0
    for sg in plan["subgraphs"]:
        if sg["device"] != "cpu":
            continue
        for i in sg["ops"]:
            m, e = op_work(program.ops[i], shapes, arrays)
            macs, elements = macs + m, elements + e
    transitions = plan["transitions"]  # consecutive subgraphs are on different devices
    cpu_ms = macs / (target.cpu_gmacs * 1e6) + elements / (target.cpu_gelements * 1e6)
    return {
        "cpu_macs": macs,
        "cpu_elements": elements,
        "cpu_latency_ms": cpu_ms,
        "transitions": transitions,
        "transition_ms": transitions * target.transition_us / 1000.0,
    }
