"""Early reductions: a convolution that reads a large map last, and makes a much smaller one, runs
as soon as its inputs exist, so the large map dies with its other readers.

A feature pyramid reads each backbone level twice: the next backbone layer reads it at once, the
pyramid's lateral 1x1 convolution only after the whole backbone has run (PP-OCRv4 det: a
48 x 80 x 80 level read again 50 ops later to make 12 x 80 x 80). In program order the level lives
across the backbone, so it is stored and loaded twice; run the lateral right after the level is
made and the level lives for two ops (it can stay on chip) and the quarter-size lateral result is
what crosses the backbone. The order is the program's otherwise: ops move only inside one NPU
subgraph, never past an op that makes one of their inputs.
"""

from __future__ import annotations

from npubuild.intmodel.program import IntegerModel

# a moved op's results together are at most this share of the bytes of the map it frees
REDUCTION = 0.5


def early_reductions(program: IntegerModel, plan: dict, nbytes) -> tuple[IntegerModel, dict]:
    """The program with each qualifying convolution moved up, and the plan's subgraphs renumbered
    to match. `nbytes(name)` is a tensor's size in bytes. A convolution qualifies when it is the
    last reader of a non-constant input that an earlier op also reads, its results (with the
    ops that only it feeds and that follow it directly: its activation, fused into it) are at most
    REDUCTION of that input's bytes, and every op between its earliest place and its own is in its
    NPU subgraph."""
    ops = list(range(len(program.ops)))
    subgraph = {i: k for k, sg in enumerate(plan["subgraphs"]) for i in sg["ops"]}
    npu = {i for sg in plan["subgraphs"] if sg["device"] == "npu" for i in sg["ops"]}
    producer = {n: j for j, op in enumerate(program.ops) for n in op.outputs}
    readers = program.readers()
    order = list(ops)
    place = {j: p for p, j in enumerate(order)}  # each op's position in `order`
    for i in ops:
        op = program.ops[i]
        if op.kind != "conv" or i not in npu:
            continue
        at = place[i]
        group = _with_tail(program, order, at)
        made = {n for j in group for n in program.ops[j].outputs}
        inputs = [n for j in group for n in program.ops[j].data_inputs if n not in made]
        earliest = max((place[producer[n]] + 1 for n in inputs if n in producer), default=0)
        if earliest >= at or any(
            subgraph.get(order[p]) != subgraph[i] for p in range(earliest, at + len(group))
        ):
            continue
        read_at = {n: sorted(place[j] for j in readers.get(n, [])) for n in inputs}
        freed = [n for n in op.inputs if n in read_at and read_at[n][-1] == at and read_at[n][0] < at]
        kept = sum(nbytes(n) for j in group for n in program.ops[j].outputs)
        if not any(kept <= REDUCTION * nbytes(n) for n in freed):
            continue
        order = order[:earliest] + group + [j for j in order[earliest:] if j not in group]
        place = {j: p for p, j in enumerate(order)}
    if order == ops:
        return program, plan
    moved = program.model_copy(update={"ops": [program.ops[j] for j in order]})
    renumbered = {
        **plan,
        "subgraphs": [{**sg, "ops": sorted(place[j] for j in sg["ops"])} for sg in plan["subgraphs"]],
    }
    return moved, renumbered


def _with_tail(program: IntegerModel, order: list[int], at: int) -> list[int]:
    """The op at `at` and the ops right after it that read only what the group makes (besides
    constants): its activation, which the code generator fuses into it."""
    group = [order[at]]
    made = set(program.ops[order[at]].outputs)
    for j in order[at + 1 :]:
        op = program.ops[j]
        data = op.data_inputs
        if not data or not all(n in made for n in data):
            break
        group.append(j)
        made.update(op.outputs)
    return group
