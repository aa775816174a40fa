"""Upsamples read through: a nearest Resize by whole factors (output row r is input row r // fh,
column c is column c // fw) that only element-wise adds and muls read moves nothing. Its readers
load their operand straight from the Resize's input with a box that repeats each element: for a
tile of whole output maps (k channels of H2 x W2), one load of dims (k * H, fh, W, fw) with
element strides (W, 0, 1, 0) writes the upsampled channels densely into SRAM (a channel's rows
merge with the channel axis since the tile holds all of them). PP-OCR det's FPN adds each
level's map to the one above it upsampled 2x: at 480 x 480 the 120 x 120 x 96 Resize stored 1.38
MB and took 48,857 cycles of span before its Add read it back.

The DMA traffic is counted as the box's bytes (each source element is fetched once per copy it
makes), as for any load; what goes away is the Resize's own reads and writes. The reader's tiles
must hold whole output maps (`schedule.binary`), which an element-wise op's tiling gives when one
channel fits: `upsample_views` takes a Resize only where a channel of its result, with the other
operand's and the sum's, takes at most `WHOLE_MAP_SHARE` of SRAM.
"""

from __future__ import annotations

import numpy as np

from npubuild.intmodel.program import IntegerModel, Op
from npubuild.targets.backend.fusion import Fusion
from npubuild.targets.backend.memory import esize
from npubuild.targets.backend.schedule import resize_indices

UPSAMPLE_READERS = ("add", "mul")
WHOLE_MAP_SHARE = 1 / 8


def whole_factors(op: Op, shapes: dict) -> tuple[int, int] | None:
    """(fh, fw) where a nearest Resize of one 4-D image repeats every input row fh times and every
    column fw times (whole factors, and a coordinate transform that is that repetition); else None.
    A band of whole repeats is then the Resize of a band of its input by the same rule
    (stripe_rows.py)."""
    x, y = op.inputs[0], op.outputs[0]
    if len(shapes.get(x, [])) != 4 or len(shapes.get(y, [])) != 4:
        return None
    (n, c, h, w), (n2, c2, h2, w2) = ([int(d) for d in shapes[t]] for t in (x, y))
    if n != 1 or n2 != 1 or c2 != c or h2 % h or w2 % w:
        return None
    fh, fw = h2 // h, w2 // w
    rows, cols = resize_indices(op, [h, w], [h2, w2])
    if not (np.array_equal(rows, np.arange(h2) // fh) and np.array_equal(cols, np.arange(w2) // fw)):
        return None  # another coordinate transform than whole-factor repetition
    return fh, fw


def upsample_views(
    program: IntegerModel, shapes: dict, plan: dict, fusion: Fusion, sram_bytes: int, strided=frozenset()
) -> dict[int, tuple[int, int]]:
    """{Resize op index: (fh, fw)} for the nearest Resizes on the NPU whose results are read
    through: whole factors, the input's grid, an input whose bytes are row-major (not among
    `strided`: windows and shuffles read through), no network output, and every reader an
    element-wise add or mul on the NPU that runs as its own instruction and reads it as a
    whole-shaped operand."""
    npu = {i for sg in plan["subgraphs"] if sg["device"] == "npu" for i in sg["ops"]}
    readers = program.readers()
    outputs, tensors = set(program.outputs), program.tensors
    found: dict[int, tuple[int, int]] = {}
    for i in sorted(npu):
        op = program.ops[i]
        if op.kind != "resize_nearest" or len(op.outputs) != 1:
            continue
        x, y = op.inputs[0], op.outputs[0]
        if x not in tensors or y in outputs or tensors.get(y) != tensors[x] or x in fusion.fused_away:
            continue
        if x in strided:
            continue  # its readers' loads assume the input row-major
        factors = whole_factors(op, shapes)
        if factors is None:
            continue
        fh, fw = factors
        h2, w2 = (int(d) for d in shapes[y][2:])
        users = readers.get(y, [])
        if not users or 3 * h2 * w2 * max(esize(tensors[y].bits), 2) > sram_bytes * WHOLE_MAP_SHARE:
            continue
        if all(_reads_whole(program, j, y, shapes, npu, fusion) for j in users):
            found[i] = (fh, fw)
    return found


def _reads_whole(program: IntegerModel, j: int, name: str, shapes: dict, npu: set, fusion: Fusion) -> bool:
    op = program.ops[j]
    return (
        j in npu
        and op.kind in UPSAMPLE_READERS
        and j not in fusion.absorbed
        and j not in fusion.residual  # a mul's chained Add loads its own operands
        and op.inputs.count(name) == 1
        and [int(d) for d in shapes[op.outputs[0]]] == [int(d) for d in shapes[name]]
    )
