"""Group boundaries by interval dynamic programming (issue 19 part 2; TPU-MLIR's LayerGroup): how
much SRAM each stretch of layers leaves to resident tensors, rather than one share for the whole
network.

A resident budget trades resident tensors (no DRAM round trip between layers) against tile space
(fewer, larger tiles: fewer halos, weight reloads and DMA latencies). Which side wins differs
along a network: an early layer on wide maps wants its tiles large, a late narrow one wants its
neighbours' results kept. The grouping search compiles the network at each budget of its grid;
each op's span in those binaries is its cost at that budget. The op sequence is then cut into
intervals, each with one budget, minimising the sum of its ops' spans plus, at each cut where the
budget falls, the DRAM time of storing and reloading the tensors that cross the cut and no longer
fit (the interval's boundary is then a group boundary).
Viterbi over (position, budget) solves it exactly for that cost; the code generator then compiles
the budgets it found (`allocation.allocate`'s `caps`: each op's tiles get the SRAM its interval's
budget leaves) and keeps the binary only if the cycle model finds it faster, like every choice of
the search.
"""

from __future__ import annotations

from npubuild.intmodel.program import IntegerModel
from npubuild.targets.backend.memory import tensor_bytes


def crossing_bytes(program: IntegerModel, shapes: dict, sequence: list[int]) -> list[int]:
    """For each position p of the NPU op sequence, the bytes of tensors made before p and read at
    p or after (within the sequence): what a group boundary just before p stores and reloads."""
    made: dict[str, int] = {}
    last: dict[str, int] = {}
    for p, i in enumerate(sequence):
        op = program.ops[i]
        for n in op.inputs:
            if n in made:
                last[n] = p  # positions only grow
        for n in op.outputs:
            if n and n in program.tensors:
                made[n] = p
    delta = [0] * (len(sequence) + 1)
    for n, p in made.items():
        if n in last and last[n] > p:
            size = tensor_bytes(n, program.tensors, shapes) if n in shapes else 0
            delta[p + 1] += size
            delta[last[n] + 1] -= size
    out, running = [], 0
    for p in range(len(sequence)):
        running += delta[p]
        out.append(running)
    return out


def interval_budgets(
    spans: dict[int, list[int]], crossing: list[int], dram_bytes_per_cycle: float
) -> list[int]:
    """The budget of each position minimising the sum of spans[budget][position] plus, at each
    position p where the budget falls from a to b, the DRAM time of storing and reloading what no
    longer fits: 2 x max(0, min(crossing[p], a) - b) / dram_bytes_per_cycle (Viterbi). A budget
    that rises keeps what was resident (a tensor lies in the top bytes of the area, which the
    larger budget includes)."""
    budgets = sorted(spans)
    cost = {b: spans[b][0] for b in budgets}
    back: list[dict[int, int]] = []
    for p in range(1, len(crossing)):
        step, new = {}, {}
        for b in budgets:
            moves = {a: cost[a] + 2 * max(0, min(crossing[p], a) - b) / dram_bytes_per_cycle for a in budgets}
            step[b] = min(budgets, key=lambda a: (moves[a], a != b, a))
            new[b] = moves[step[b]] + spans[b][p]
        back.append(step)
        cost = new
    b = min(budgets, key=lambda k: (cost[k], k))
    chosen = [b]
    for step in reversed(back):
        b = step[b]
        chosen.append(b)
    return chosen[::-1]
