"""Stripes: a chain of layers whose feature maps are too large to stay in SRAM, run as horizontal
stripes that each go through the whole chain (Vela's cascading, TPU-MLIR's layer groups sliced
along H).

A chain is a run of ops on one NPU subgraph where each op's only data input is the op before's
result and that result has no other reader: convolutions (any group; transposed, of one group), lookup
tables, clamps, and adds or muls with a constant that is the same on every row. Where the chain's
maps are large (an op's input and output together over half the resident budget), the chain's last
result is cut into S row ranges; each range's rows are traced back through the chain (a
convolution needs (rows - 1) x stride + its kernel's extent rows of its input, less the padding it
adds), and the chain is written S times over those rows: the chain's ops on stripe-sized tensors
(a convolution pads only where its stripe meets the map's edge; a first convolution reads its rows
of the chain's input where it lies, a negative pad cropping the rest; any other first op reads
them through a Slice), and a Concat of the S results along H. Each stripe's intermediates are
1/S of the maps and stay resident, so the chain moves only its input and its result through
DRAM; rows at the seams are computed twice (the halo). Every output code is what the unstriped
chain computes: the rewrite changes where rows are computed, not how.

`stripe` returns the rewritten program (new ops carry their layer's node name, so per-layer
figures add up by layer) or None when no chain is that large; the code generator compiles both and
keeps the faster (compile.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npubuild.intmodel.fixedpoint import quantize_multiplier
from npubuild.intmodel.kernels import conv_pads
from npubuild.intmodel.program import ConcatAttrs, ConcatOp, IntegerModel, MoveOp, Op, Rescale
from npubuild.targets.backend.fusion import Fusion
from npubuild.targets.backend.memory import tensor_bytes
from npubuild.targets.backend.schedule import TransposeRows
from npubuild.targets.cpu_cost import op_work

MAX_STRIPES = 16
MIN_STRIPE_ROWS = 4  # fewer output rows per stripe and the halos cost more than the DRAM saved


@dataclass(frozen=True)
class Striping:
    program: IntegerModel
    arrays: dict
    shapes: dict
    plan: dict
    chains: list[dict]  # per chain striped: its layers and the stripe count, for the stats
    rows: dict[str, tuple[int, int]]  # each stripe tensor -> the rows [a, b) of the map it holds
    # the maps a stripe passes from one of its ops to the next (to stay resident: `stripe_spills`)
    intermediates: frozenset[str]
    halo_macs: int  # multiply-accumulates the stripes compute twice (rows at their seams)


def _rows_needed(op: Op, shapes: dict, arrays: dict, lo: int, hi: int) -> tuple[int, int, int, int]:
    """The input rows [a, b) that output rows [lo, hi) of `op` read, and the padding rows the op
    adds above and below them."""
    if op.kind != "conv":
        return lo, hi, 0, 0
    h_in = int(shapes[op.inputs[0]][2])
    kh = int(arrays[op.arrays.weight].shape[2])
    at = op.attrs
    if at.transpose:
        # the input rows its emitter reads for output rows [lo, hi); the padding returned is the
        # rows the stripe's own output crops above them (its pads' top)
        a, last = TransposeRows(op, h_in, kh)(lo, hi)
        return a, last + 1, lo + (at.pads or [0, 0, 0, 0])[0] - a * at.strides[0], 0
    sh, dh, pt = at.strides[0], at.dilations[0], _pads(op, shapes, arrays)[0]
    first = lo * sh - pt
    end = (hi - 1) * sh - pt + (kh - 1) * dh + 1
    a, b = max(first, 0), min(end, h_in)
    return a, b, a - first, end - b


def _pads(op: Op, shapes: dict, arrays: dict) -> list[int]:
    """A convolution's explicit pads [top, left, bottom, right] on its whole input."""
    return conv_pads(
        op.attrs, [int(d) for d in shapes[op.inputs[0]][2:]], list(arrays[op.arrays.weight].shape[2:])
    )


def _data(op: Op) -> list[str]:
    return [n for n in op.inputs if n and n not in op.constants]


def _eligible(op: Op, shapes: dict, arrays: dict) -> bool:
    """An op a stripe can run on a band of rows: the same rule on every row, one data input."""
    data = _data(op)
    if len(data) != 1 or len(op.outputs) != 1 or len(shapes.get(data[0], [])) != 4:
        return False
    if len(shapes.get(op.outputs[0], [])) != 4:
        return False
    if op.kind == "conv":
        # a transposed one of one group (its emitter's): rows of its output need bands of its input
        return len(arrays[op.arrays.weight].shape) == 4 and (not op.attrs.transpose or op.attrs.group == 1)
    if op.kind in ("lut", "clamp"):
        return True
    if op.kind in ("add", "mul"):
        # a constant operand that varies along H would need its own slice
        return all(np.ndim(arrays[k]) < 2 or np.shape(arrays[k])[-2] == 1 for k in op.constants.values())
    return False


def _chains(program: IntegerModel, arrays: dict, shapes: dict, plan: dict) -> list[list[int]]:
    """Maximal chains of eligible ops, each on one NPU subgraph, in execution order."""
    ops = program.ops
    readers = program.readers()
    subgraph = {i: k for k, sg in enumerate(plan["subgraphs"]) if sg["device"] == "npu" for i in sg["ops"]}
    outputs = set(program.outputs)
    ok = {i for i in subgraph if _eligible(ops[i], shapes, arrays)}

    def successor(i: int) -> int | None:
        y = ops[i].outputs[0]
        users = readers.get(y, [])
        if y in outputs or len(users) != 1 or users[0] not in ok or subgraph[users[0]] != subgraph[i]:
            return None
        return users[0]

    followed = {j for i in ok if (j := successor(i)) is not None}
    chains = []
    for sg in plan["subgraphs"]:
        for i in sg["ops"]:
            if i not in ok or i in followed:
                continue
            chain = [i]
            while (j := successor(chain[-1])) is not None:
                chain.append(j)
            chains.append(chain)
    return chains


def _stored_bytes(name: str, program: IntegerModel, shapes: dict, fused_away: frozenset[str]) -> int:
    if name in fused_away or name not in program.tensors:
        return 0
    return tensor_bytes(name, program.tensors, shapes)


def _plan_chain(
    chain: list[int],
    program: IntegerModel,
    shapes: dict,
    fused_away: frozenset[str],
    budget: int,
    to_the_end: bool,
    finer: bool,
) -> tuple[list[int], int] | None:
    """The part of the chain worth striping (from its first op whose input and output together
    exceed half the budget to its last such op, or `to_the_end` of the chain) and the stripe
    count: the fewest stripes that bring each op's input and output under half the budget, or
    with `finer` under a quarter (what else stays resident while a stripe runs, its other maps
    and the tensors other layers keep on chip, can leave half too little), or None."""
    ops = program.ops

    def live(i: int) -> int:
        op = ops[i]
        return _stored_bytes(_data(op)[0], program, shapes, fused_away) + _stored_bytes(
            op.outputs[0], program, shapes, fused_away
        )

    big = [k for k, i in enumerate(chain) if live(i) > budget // 2]
    if not big:
        return None
    part = chain[big[0] :] if to_the_end else chain[big[0] : big[-1] + 1]
    if len(part) < 2:
        return None
    peak = max(live(i) for i in part)
    rows = int(shapes[ops[part[-1]].outputs[0]][2])
    count = 1
    share = budget // 4 if finer else budget // 2
    while count < MAX_STRIPES and peak / count > share and rows // (count * 2) >= MIN_STRIPE_ROWS:
        count *= 2
    return (part, count) if count > 1 else None


def stripe(
    program: IntegerModel,
    arrays: dict,
    shapes: dict,
    plan: dict,
    fusion: Fusion,
    budget: int,
    to_the_end: bool = False,
    finer: bool = False,
) -> Striping | None:
    """The program with every chain whose maps exceed the resident `budget` striped (module
    docstring), or None when there is none. A chain's stripes end at its last large op, or with
    `to_the_end` at its last op: the smaller maps after a large one then stay in the stripes'
    SRAM too, which saves their DRAM round trip where residency does not hold them (DenseNet's
    3x3 convolution after a striped 1x1 one), at the cost of their halo rows. With `finer`, each
    chain runs in twice the stripes where its rows allow (`_plan_chain`)."""
    if budget <= 0:
        return None
    planned = []
    for chain in _chains(program, arrays, shapes, plan):
        found = _plan_chain(chain, program, shapes, fusion.fused_away, budget, to_the_end, finer)
        if found is not None:
            planned.append(found)
    if not planned:
        return None
    ops = list(program.ops)
    tensors = dict(program.tensors)
    arrays = dict(arrays)
    shapes = dict(shapes)
    replaced: dict[int, list[Op]] = {}
    dropped: set[int] = set()
    rows: dict[str, tuple[int, int]] = {}
    inner: set[str] = set()
    for part, count in planned:
        replaced[part[0]] = _striped(part, count, ops, tensors, arrays, shapes, rows, inner, len(replaced))
        dropped.update(part[1:])
    new_ops: list[Op] = []
    index: dict[int, list[int]] = {}
    for i, op in enumerate(ops):
        if i in dropped:
            index[i] = []
            continue
        block = replaced.get(i, [op])
        index[i] = list(range(len(new_ops), len(new_ops) + len(block)))
        new_ops.extend(block)
    subgraphs = [{**sg, "ops": [j for i in sg["ops"] for j in index[i]]} for sg in plan["subgraphs"]]
    return Striping(
        program=program.model_copy(update={"ops": new_ops, "tensors": tensors}),
        arrays=arrays,
        shapes=shapes,
        plan={**plan, "subgraphs": subgraphs},
        chains=[{"layers": [ops[i].label for i in part], "stripes": count} for part, count in planned],
        rows=rows,
        intermediates=frozenset(inner),
        halo_macs=sum(op_work(op, shapes, arrays)[0] for op in new_ops)
        - sum(op_work(op, shapes, arrays)[0] for op in ops),
    )


def _striped(
    part: list[int],
    count: int,
    ops: list[Op],
    tensors: dict,
    arrays: dict,
    shapes: dict,
    rows: dict,
    inner: set,
    k: int,
) -> list[Op]:
    """The ops that compute the chain `part` in `count` stripes: per stripe a Slice of its input
    (unless its first op is a convolution, which crops, or it reads all of it) and the chain's ops
    on their rows; then the Concat. `k` numbers the chain: two chains may read the same input,
    each through slices of its own. Adds each stripe tensor's rows to `rows`, and to `inner` the
    stripes' maps between their ops."""
    chain = [ops[i] for i in part]
    x, y = _data(chain[0])[0], chain[-1].outputs[0]
    height = int(shapes[y][2])
    cuts = [height * s // count for s in range(count + 1)]
    out: list[Op] = []
    pieces = []
    for s in range(count):
        # rows each op must produce, from the last op back to the chain's input
        spans = [(cuts[s], cuts[s + 1])]
        borders = []
        for op in reversed(chain):
            a, b, top, bottom = _rows_needed(op, shapes, arrays, *spans[0])
            spans.insert(0, (a, b))
            borders.insert(0, (top, bottom))
        a, b = spans[0]
        source = x
        if chain[0].kind == "conv" and not chain[0].attrs.transpose:
            # the first convolution reads its rows of x where x lies: a negative pad crops
            top, bottom = borders[0]
            borders[0] = (top - a, bottom - (int(shapes[x][2]) - b))
        elif (a, b) != (0, int(shapes[x][2])):
            source = f"{x}@chain{k}.input{s}"
            out.append(_row_slice(chain[0].node, x, source, a, b, arrays, shapes, tensors))
            rows[source] = (a, b)
        for j, op in enumerate(chain):
            result = op.outputs[0]
            mine = f"{result}@stripe{s}"
            lo, hi = spans[j + 1]
            shapes[mine] = [*shapes[result][:2], hi - lo, shapes[result][3]]
            rows[mine] = (lo, hi)
            tensors[mine] = tensors[result]
            data = _data(op)[0]
            inputs = [source if n == data else n for n in op.inputs]
            update: dict = {"inputs": inputs, "outputs": [mine]}
            if op.kind == "conv" and op.attrs.transpose:
                update["attrs"] = _transposed_band(op, shapes[source][2], hi - lo, borders[j][0], arrays)
            elif op.kind == "conv":
                pads = _pads(op, shapes, arrays)
                top, bottom = borders[j]
                update["attrs"] = op.attrs.model_copy(
                    update={"pads": [top, pads[1], bottom, pads[3]], "auto_pad": "NOTSET"}
                )
            out.append(op.model_copy(update=update))
            if j < len(chain) - 1:
                inner.add(mine)
            source = mine
        pieces.append(source)
    m0, shift = quantize_multiplier(1.0)
    same = Rescale(m0=m0, shift=shift, zin=tensors[y].zero_point, same=True)
    out.append(
        ConcatOp(
            kind="concat",
            node=chain[-1].node,
            op_type="Concat",
            inputs=pieces,
            outputs=[y],
            attrs=ConcatAttrs(axis=2, rescale=[same] * count),
            operand_params=[tensors[y]] * count,
        )
    )
    return out


def _transposed_band(op: Op, rows_in: int, rows_out: int, crop: int, arrays: dict):
    """A transposed convolution's attributes on a band of `rows_in` input rows making `rows_out`
    output rows, the first `crop` rows of its full output cropped: the bottom crop what is left,
    or output padding where the band's output ends short of the rows asked for."""
    at = op.attrs
    kh = int(arrays[op.arrays.weight].shape[2])
    pads = list(at.pads or [0, 0, 0, 0])
    padding = list(at.output_padding or [0, 0])
    full = (rows_in - 1) * at.strides[0] + (kh - 1) * at.dilations[0] + 1
    bottom = full - crop - rows_out
    pads[0], pads[2], padding[0] = crop, max(bottom, 0), max(-bottom, 0)
    return at.model_copy(update={"pads": pads, "output_padding": padding, "auto_pad": "NOTSET"})


def _row_slice(node: str, x: str, y: str, a: int, b: int, arrays: dict, shapes: dict, tensors: dict) -> Op:
    """Rows [a, b) of x (axis 2) as tensor y."""
    keys = {}
    for name, value in (("starts", a), ("ends", b), ("axes", 2)):
        key = f"{y}#{name}"
        arrays[key] = np.array([value], np.int64)
        keys[key] = key
    shapes[y] = [*shapes[x][:2], b - a, shapes[x][3]]
    tensors[y] = tensors[x]
    return MoveOp(
        kind="move", node=node, op_type="Slice", inputs=[x, *keys], outputs=[y], constants=keys, attrs={}
    )
