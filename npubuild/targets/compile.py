"""Partition plan + integer model -> a .npub binary, its listing and its statistics.

The driver of the back end (`targets/backend/`): for each grouping choice, fusion, allocation
(verified), then every NPU subgraph scheduled, emitted and lowered, every CPU subgraph exported;
the choice with the least estimated latency wins, and `package.py` writes it out.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import onnx

from npubuild.intmodel.program import IntegerModel
from npubuild.targets import npub
from npubuild.targets.backend.allocation import Residency, allocate, verify_allocation
from npubuild.targets.backend.context import ConstantPool, OpContext
from npubuild.targets.backend.fusion import Fusion, fuse
from npubuild.targets.backend.intervals import crossing_bytes, interval_budgets
from npubuild.targets.backend.memory import ALIGN, DoesNotFit, SramPlan, align, tensor_bytes
from npubuild.targets.backend.pinning import pin, pinned_tables
from npubuild.targets.backend.pipeline import fits, lower_subgraph
from npubuild.targets.backend.reorder import early_reductions
from npubuild.targets.backend.split_memo import SplitMemo
from npubuild.targets.backend.stripes import Striping, stripe
from npubuild.targets.cpu import CpuSubgraph
from npubuild.targets.cpu_cost import op_work
from npubuild.targets.disasm import disassemble
from npubuild.targets.package import Assembly
from npubuild.targets.partition import partition
from npubuild.targets.spec import TargetSpec

# Shares of SRAM the grouping search tries to reserve for tensors kept on chip between layers. The
# grid stops at half (YOLOv8n on vnpu-s once gained 4% past it for a stream 2.4x as long; at 3/4 it
# now gains nothing there, nor on the example's det); past it the search goes on only while the
# top share tried is where the fastest choice keeps its tensors: the same choice with the share
# halfway to all of the SRAM, up to MAX_RESIDENT_SHARE (PP-OCRv4 det at 480 on vnpu-m, whose
# 1.4 MB pyramid maps do not fit half: 1,686,311 -> 1,565,557 cycles at 7/8, DRAM 7.54x -> 6.74x
# the compulsory bytes).
RESIDENT_SHARES = (0.0, 0.25, 0.5)
MAX_RESIDENT_SHARE = 0.875
# Shares of the rest that each of the two constant slots takes (0: no prefetch of the next weights).
CONST_SLOT_SHARES = (0.0, 0.125, 0.25)
# Fresh constants (`_refine`): tried where the constants take at most this share of the SRAM the
# resident tensors leave, in an area this many bytes larger than the constants section (each
# group starts aligned; a subgraph may load a record twice)
FRESH_CONSTANTS_MAX = 0.5
FRESH_CONSTANTS_SLACK = 4096
# A resident budget whose fastest grid choice is within this of the fastest overall is refined too
# (compile_npub): the refinements have gained up to 8% on one budget.
REFINE_WITHIN = 0.1
# a striped program's refinements are tried where its first binary is within this of its resident
# budget's fastest unstriped one (docs/npu.md, "Stripes")
STRIPED_WITHIN = 0.02
# Among grouping choices within 1% of the fastest, the one whose DRAM bytes fall by more (as a share
# of the fastest's) than its cycles rise: DRAM bytes are energy and the bandwidth the host shares,
# and two choices that close in time are one in any measurement (shufflenet on vnpu-m: +0.3% cycles
# for 2.2x -> 1.7x the compulsory bytes), but a DRAM saving smaller than the time it costs is no
# trade (ZFNet-512: +0.69% cycles for 0.09% fewer bytes, a whole 1.5x roofline's margin).
DRAM_TIE = 0.01


def model_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    shapes = {}
    for v in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        shapes[v.name] = [d.dim_value for d in v.type.tensor_type.shape.dim]
    for t in model.graph.initializer:
        shapes[t.name] = list(t.dims)
    return shapes


def input_dtypes(model: onnx.ModelProto) -> dict[str, str]:
    """The network inputs that are not float32 (token ids, lengths), by name: numpy dtype names."""
    initializers = {t.name for t in model.graph.initializer}
    dtypes = {}
    for v in model.graph.input:
        elem = v.type.tensor_type.elem_type
        if v.name not in initializers and elem != onnx.TensorProto.FLOAT:
            dtypes[v.name] = onnx.helper.tensor_dtype_to_np_dtype(elem).name
    return dtypes


def plan_partition(program: IntegerModel, arrays: dict, model: onnx.ModelProto, target: TargetSpec) -> dict:
    """partition(), with every op the NPU supports asked whether some tiling of it fits this SRAM:
    one that does not goes to the CPU with that reason."""
    shapes = model_shapes(model)
    ctx = OpContext(program.tensors, shapes, arrays, SramPlan(target.sram_kib * 1024))
    return partition(program, arrays, shapes, target, lambda op: fits(ctx, op))


def compile_npub(
    program: IntegerModel,
    arrays: dict,
    model: onnx.ModelProto,
    target: TargetSpec,
    plan: dict,
    reuse_dram: bool = True,
    group: bool = True,
    resident_shares: tuple[float, ...] = RESIDENT_SHARES,
    fresh: bool = True,
) -> tuple[bytes, str, dict]:
    """The binary with the least estimated latency over the grouping choices (or one within DRAM_TIE
    of it that saves a larger share of DRAM traffic than it costs in cycles): how much SRAM
    keeps intermediates on chip (layers whose tensors stay there form one group, no DRAM round
    trip; `resident_shares`, the shares of SRAM tried) versus how much is left for tiles, and
    at each share whether chains of layers whose maps exceed it run in row stripes
    (stripes.py). Where early reductions (backend/reorder.py) change the order of the ops, the
    choices are compiled in both orders. Without grouping (or when checking every op's result),
    every tensor goes through DRAM. Without `fresh`, no choice has fresh constants (the precision
    search's price compiles: docs/mixed-precision.md, "Cost estimate")."""
    # (the splits the cycle model chose, reused across the search's compiles: split_memo.py)
    options = (reuse_dram, group, resident_shares, fresh, SplitMemo())
    results, tried = _grouping_search(program, arrays, model, target, plan, *options)
    if group and reuse_dram:  # the order only matters where tensors may stay on chip
        shapes = model_shapes(model)
        moved, moved_plan = early_reductions(
            program, plan, lambda n: tensor_bytes(n, program.tensors, shapes)
        )
        if moved is not program:
            more, more_tried = _grouping_search(moved, arrays, model, target, moved_plan, *options)
            results += more
            tried += [{**t, "early_reductions": True} for t in more_tried]
    # the fastest, or among those within DRAM_TIE of it the one whose share of DRAM bytes saved
    # most exceeds its share of cycles lost
    fastest = min(results, key=lambda r: (_cycles(r), r[1]["dram_bytes"]))[1]
    close = [r for r in results if _cycles(r) <= fastest["estimated_cycles"] * (1 + DRAM_TIE)]

    def trade(r: tuple) -> tuple:
        # (a program with no NPU op at all takes no cycles and moves no bytes)
        cycles = _cycles(r) / max(fastest["estimated_cycles"], 1)
        dram = r[1]["dram_bytes"] / max(fastest["dram_bytes"], 1)
        return cycles + dram, r[1]["dram_bytes"], _cycles(r)

    data, stats = min(close, key=trade)
    stats["grouping_search"] = tried
    # (the listing of the chosen binary only: disassembling each attempt's was 9% of a compile)
    return data, disassemble(npub.read(data)), stats


def _grouping_search(
    program: IntegerModel,
    arrays: dict,
    model: onnx.ModelProto,
    target: TargetSpec,
    plan: dict,
    reuse_dram: bool,
    group: bool,
    resident_shares: tuple[float, ...],
    fresh: bool,
    splits: SplitMemo,
) -> tuple[list[tuple[bytes, dict]], list[dict]]:
    """Every grouping choice compiled for this order of the ops: the results, and what each was."""
    grouping = group and reuse_dram
    shares = [(r, c) for r in resident_shares for c in CONST_SLOT_SHARES] if grouping else [(0.0, 0.0)]
    results: list[tuple[bytes, dict]] = []
    choices: list[Grouping] = []  # what each result was compiled with
    tried: list[dict] = []
    seen: set[tuple] = set()

    def budget_of(share: float) -> int:  # a share of SRAM in bytes
        return int(share * target.sram_kib * 1024)

    def attempt(choice: Grouping) -> None:
        if _identity(choice) in seen:
            return  # (a refinement may reach a choice compiled before)
        seen.add(_identity(choice))
        try:
            result = _compile(program, arrays, model, target, plan, reuse_dram, grouping, choice, splits)
        except DoesNotFit:
            return
        stats = result[1]
        tried.append(
            {
                "resident_bytes": choice.resident_bytes,
                "const_slot_bytes": stats["const_slot_bytes"],
                "striped_chains": len(stats["stripes"]),
                "stripes": [chain["stripes"] for chain in stats["stripes"]],
                **({"stripe_spills": stats["stripe_spills"]} if choice.striping else {}),
                "residency": choice.residency,
                "join_constants": choice.join_constants,
                **({"fresh_constants": choice.fresh_constants} if choice.fresh_constants else {}),
                **({"in_place": True} if choice.in_place else {}),
                "intervals": len(set(dict(choice.caps).values())),
                **({"pinned_tables": stats["pinned_tables"]} if choice.pin_tables else {}),
                "estimated_cycles": stats["estimated_cycles"],
                "dram_bytes": stats["dram_bytes"],
            }
        )
        results.append(result)
        choices.append(choice)

    for share, const_share in shares:
        attempt(Grouping(budget_of(share), const_share))
    if grouping:
        # chains too large for a resident budget run in stripes (stripes.py), tried with the
        # constant slot that was fastest unstriped at that budget
        budgets = [budget_of(share) for share in resident_shares]
        grid = _fastest_by(choices, results, lambda c: c.resident_bytes)
        budgets = [b for b in budgets if b in grid]
        for finer in (False, True):
            if finer:
                # twice the stripes where the fastest striped program's maps did not all stay
                # resident (PP-OCRv4 det's stem at 16 bits; at 8 bits no corpus model's)
                striped = _fastest_by(choices, results, lambda c: c.resident_bytes if c.striping else None)
                budgets = sorted(b for b, k in striped.items() if results[k][1]["stripe_spills"])
            for budget, striping in stripings(program, arrays, model, plan, budgets, finer):
                attempt(dataclasses.replace(choices[grid[budget]], striping=striping))
                # and in lifetime order at once: a striped program's intermediates live one stripe
                # each, and whether it beats its budget unstriped (which decides its refinements)
                # often shows only in that order (PP-OCRv4 det's stem at 16 bits: 6.8% behind
                # in definition order, 5.4% ahead in lifetime order)
                attempt(dataclasses.replace(choices[grid[budget]], striping=striping, residency="lifetime"))
                # the stripes of a chain reading a table each load it: pinned, once (pinning.py)
                attempt(dataclasses.replace(choices[grid[budget]], striping=striping, pin_tables="shared"))
        # more SRAM for resident tensors than the grid's top share, while that is where the
        # fastest choice so far keeps them (RESIDENT_SHARES): the same choice with the share
        # halfway to all of the SRAM, its striped program as it is and its chains striped anew.
        # Such a choice is kept only where it moves no more DRAM bytes than the fastest on the
        # grid: SRAM for resident tensors is for fewer round trips (DenseNet-121 on vnpu-m found
        # 1.6% fewer cycles at 3/4 for 2.23x the compulsory bytes against 1.65x)
        share = max(resident_shares)
        top = budget_of(share)
        on_grid = min(range(len(results)), key=lambda k: _cycles(results[k]), default=None)
        grid_bytes = results[on_grid][1]["dram_bytes"] if on_grid is not None else 0

        def past_grid() -> None:
            _keep_past_grid(choices, results, top, grid_bytes)

        while results and share < MAX_RESIDENT_SHARE:
            fastest = choices[min(range(len(results)), key=lambda k: _cycles(results[k]))]
            if fastest.resident_bytes != budget_of(share):
                break
            share = (share + 1) / 2
            budget = budget_of(share)
            attempt(dataclasses.replace(fastest, resident_bytes=budget))
            # and its chains striped for that budget (coarser stripes: fewer halo rows)
            for _, striping in stripings(program, arrays, model, plan, [budget], False):
                attempt(dataclasses.replace(fastest, resident_bytes=budget, striping=striping))
            past_grid()
        # each stretch of layers its own budget (intervals.py), from the grid's per-op spans
        intervals = _interval_choice(program, model, plan, target, choices, results)
        if intervals is not None:
            attempt(intervals)
        # refined around the fastest choice of every resident budget whose fastest is within
        # REFINE_WITHIN of the fastest overall: a refinement gains up to 8%, so another budget
        # can end ahead (ShuffleNet on vnpu-m: 1/4 of SRAM, 5% behind 1/2 before, 3% ahead after)
        # (each striping of a budget counts as a budget of its own: which of them ends ahead after
        # its refinements is not known before them)
        if results:
            # the interval choice is compiled once, not refined (compile time; docs/npu.md)
            leaders = _fastest_by(choices, results, lambda c: None if c.caps else _family(c))
            fastest_first = min(_cycles(results[k]) for k in leaders.values())
            unstriped = _fastest_by(choices, results, _unstriped_budget)
            for family, k in sorted(leaders.items(), key=lambda item: item[1]):
                # a striping is refined where it starts within STRIPED_WITHIN of its budget
                # unstriped (compile time; DenseNet's starts 0.1% behind, ends 1.4% ahead)
                plain = unstriped.get(family[0])
                striped = choices[k].striping is not None and plain is not None
                if striped and _cycles(results[k]) > _cycles(results[plain]) * (1 + STRIPED_WITHIN):
                    continue
                if _cycles(results[k]) <= fastest_first * (1 + REFINE_WITHIN):
                    _refine(choices, results, attempt, family, budget_of(1.0) if fresh else 0)
            past_grid()
    return results, tried


def _keep_past_grid(choices: list[Grouping], results: list, top: int, grid_bytes: int) -> None:
    """Drop (in place) the results of choices whose resident budget is past the grid's `top` and
    that move more DRAM bytes than `grid_bytes` (the fastest grid choice's)."""
    keep = [
        k
        for k, choice in enumerate(choices)
        if choice.resident_bytes <= top or results[k][1]["dram_bytes"] <= grid_bytes
    ]
    choices[:] = [choices[k] for k in keep]
    results[:] = [results[k] for k in keep]


PinTables = Literal["", "shared", "every"]


@dataclass(frozen=True)
class Grouping:
    """One choice the grouping search compiles: the resident budget, each constant slot's share of
    the SRAM left for ops, the striped program (if any) and the residency order."""

    resident_bytes: int
    const_share: float = 0.0
    striping: Striping | None = None
    residency: Residency = "definition"
    # weight-bound ops' constants join the group before theirs (backend/lowering.py)
    join_constants: bool = False
    # (op index, resident bytes it leaves) where intervals of ops have budgets of their own
    # (backend/intervals.py); resident_bytes is then the largest
    caps: tuple[tuple[int, int], ...] = ()
    # tables several ops read load once into SRAM set aside for them (backend/pinning.py);
    # "every": the tables one op reads as well, which then load early and take no slot's turn
    pin_tables: PinTables = ""
    # element-wise results take their dying operand's resident bytes (backend/allocation.py)
    in_place: bool = False
    # bytes of one constant area in place of the two slots, each constant group in bytes of its
    # own (lowering.py); 0: the slots (const_share)
    fresh_constants: int = 0


def _cycles(result: tuple[bytes, dict]) -> int:
    return result[1]["estimated_cycles"]


def _fastest_by(choices: list[Grouping], results: list, key) -> dict:
    """For each value of key(choice) (None: left out), the index of its fastest result."""
    fastest: dict = {}
    for k, choice in enumerate(choices):
        group = key(choice)
        if group is not None and (
            group not in fastest or _cycles(results[k]) < _cycles(results[fastest[group]])
        ):
            fastest[group] = k
    return fastest


def _unstriped_budget(choice: Grouping) -> int | None:
    """A choice's resident budget where it is a plain one (no stripes, no interval budgets)."""
    return choice.resident_bytes if choice.striping is None and not choice.caps else None


def _family(choice: Grouping) -> tuple:
    """A choice's resident budget, striped program (by identity: each budget's stripings are made
    once) and interval budgets, which the refinements keep."""
    return choice.resident_bytes, id(choice.striping), choice.caps


def _refine(choices: list[Grouping], results: list, attempt, family: tuple, fresh_sram: int) -> None:
    """The refinements of the fastest choice of one resident budget and striping, each from the
    fastest so far of that family: constant slots halfway to their neighbours on the grid; the
    resident tensors claiming SRAM shortest-lived first; weight-bound ops' constants joining the
    group before (backend/lowering.py; it needs constant slots); tables pinned, with the constant
    slots halfway to their neighbours again; element-wise results in place; every constant group
    in SRAM of its own (fresh constants), where they fit half of `fresh_sram` less the resident
    tensors (0: not tried)."""

    def fastest() -> int:  # the index of the family's fastest result so far
        here = [k for k, c in enumerate(choices) if _family(c) == family]
        return min(here, key=lambda k: _cycles(results[k]))

    def best() -> Grouping:
        return choices[fastest()]

    base = best()
    for finer in _between(base.const_share, CONST_SLOT_SHARES):
        attempt(dataclasses.replace(base, const_share=finer))
    if family[0]:
        attempt(dataclasses.replace(best(), residency="lifetime"))
    if (base := best()).const_share:
        attempt(dataclasses.replace(base, join_constants=True))
    # tables several ops read pinned (backend/pinning.py), which needs its own constant slots: a
    # table no longer goes into one (the example's det: 96 KiB slots -> 48 KiB, 969,328 -> 964,137
    # cycles); then every table, each loading as early as the estimate finds best and leaving the
    # slots' turns to weights (Silero VAD: its square root's 16-bit table, and its 8-bit squares'
    # tables held a slot its encoder's weights waited for)
    for tables in ("shared", "every"):
        pinned = dataclasses.replace(best(), pin_tables=tables)
        attempt(pinned)
        if any(c.pin_tables == tables and _family(c) == family for c in choices):
            for finer in _between(pinned.const_share, CONST_SLOT_SHARES):
                attempt(dataclasses.replace(pinned, const_share=finer))
    # element-wise results where their dying operands lie (backend/allocation.py): one map's bytes
    # fewer while such an op runs, but the pairs' places change where the rest fit (PP-OCRv4 det
    # 480's pyramid region 1.6% slower with them, the example det's 0.3% faster), so a refinement
    if family[0]:
        attempt(dataclasses.replace(best(), in_place=True))
    # every constant in SRAM of its own, where they all fit a share of what the ops have
    # (lowering.py, "fresh constants"); sized by the constants section of the fastest so far
    k = fastest()
    need = results[k][1].get("constant_bytes", 0)
    if 0 < need <= FRESH_CONSTANTS_MAX * (fresh_sram - choices[k].resident_bytes):
        attempt(dataclasses.replace(choices[k], fresh_constants=need + FRESH_CONSTANTS_SLACK))


def _identity(choice: Grouping) -> tuple:
    """What tells choices apart (a striped program by identity, as `_family`)."""
    return (
        *(getattr(choice, f.name) for f in dataclasses.fields(choice) if f.name != "striping"),
        id(choice.striping),
    )


def _interval_choice(
    program: IntegerModel,
    model: onnx.ModelProto,
    plan: dict,
    target: TargetSpec,
    choices: list,
    results: list,
) -> Grouping | None:
    """The choice whose intervals of ops each have the resident budget that intervals.py finds
    cheapest, from the spans of each op in the fastest unstriped binary of each budget; None where
    that is one budget throughout (a choice already compiled)."""
    fastest = _fastest_by(choices, results, _unstriped_budget)
    if len(fastest) < 2:
        return None
    sequence = [i for sg in plan["subgraphs"] if sg["device"] == "npu" for i in sg["ops"]]
    if not sequence:
        return None
    spans: dict[int, list[int]] = {}
    for budget, k in fastest.items():
        by_label: dict[str, int] = {}
        for row in results[k][1]["layers"]:
            by_label[row["node"]] = by_label.get(row["node"], 0) + row["end"] - row["start"]
        spans[budget] = [by_label.pop(program.ops[i].label, 0) for i in sequence]
    crossing = crossing_bytes(program, model_shapes(model), sequence)
    chosen = interval_budgets(spans, crossing, target.dram_bytes_per_cycle)
    if len(set(chosen)) == 1:
        return None
    best = min(fastest.values(), key=lambda k: _cycles(results[k]))
    return dataclasses.replace(
        choices[best], resident_bytes=max(chosen), caps=tuple(zip(sequence, chosen)), residency="definition"
    )


def _between(share: float, grid: tuple[float, ...]) -> list[float]:
    """The shares halfway between `share` and its neighbours on `grid` (above the last: halfway to
    twice it; a share between two grid points, itself a refinement, has those two)."""
    below = [g for g in sorted(grid) if g < share]
    above = min((g for g in grid if g > share), default=2 * share)
    return ([(below[-1] + share) / 2] if below else []) + ([(share + above) / 2] if above > share else [])


def stripings(
    program: IntegerModel,
    arrays: dict,
    model: onnx.ModelProto,
    plan: dict,
    budgets: list[int],
    finer: bool = False,
) -> list[tuple[int, Striping]]:
    """For each resident budget, the programs with its regions that do not fit it striped, where
    there are any: chains alone, then regions that branch and join as well (where that differs:
    striping a join is not always faster, PP-OCRv4 det's squeeze-excite tails), then regions
    through max pools as well (stripes.py); each striped up to the region's last large op, and
    (where that differs) to its end; with `finer`, the first of each in twice the stripes
    (docs/npu.md, "Finer stripes")."""
    shapes = model_shapes(model)
    fusion = fuse(program, plan, shapes)
    found = []
    for budget in budgets:
        # (twice the stripes is the same program where the rows per stripe or MAX_STRIPES stop it)
        # (joins, pools); chains through pools are not tried (compile time; no corpus model's
        # fastest was one)
        kinds = [(False, False), (True, False), (True, True)]
        coarse = (
            [stripe(program, arrays, shapes, plan, fusion, budget, joins=j, pools=p) for j, p in kinds]
            if finer
            else []
        )
        seen = [s.chains for s in coarse if s is not None]
        for joins, pools in kinds:
            # (a region through pools to its end: no corpus model's fastest, for a third more
            # compiles on DenseNet-121)
            for to_the_end in (False,) if finer or pools else (False, True):
                striping = stripe(
                    program, arrays, shapes, plan, fusion, budget, to_the_end, finer, joins, pools
                )
                if striping is not None and striping.chains not in seen:
                    seen.append(striping.chains)
                    found.append((budget, striping))
    return found


def _multiplies_16_bit(program: IntegerModel, op) -> bool:
    """Whether a MAC op multiplies a 16-bit operand (its input; either side of a product of two
    activations): the array runs it at `int16_rate` (cycles.array_rate)."""
    operands = op.inputs[:2] if op.kind == "batch_matmul" else op.inputs[:1]
    return op.kind in ("conv", "matmul", "batch_matmul") and any(
        t in program.tensors and program.tensors[t].bits == 16 for t in operands
    )


def _compile(
    program: IntegerModel,
    arrays: dict,
    model: onnx.ModelProto,
    target: TargetSpec,
    plan: dict,
    reuse_dram: bool,
    fused: bool,
    choice: Grouping,
    splits: SplitMemo | None = None,
) -> tuple[bytes, dict]:
    striping, resident_bytes = choice.striping, choice.resident_bytes
    shapes = model_shapes(model)
    # the network's multiply-accumulates, and those on a 16-bit operand, for the roofline bounds
    # (Assembly.finish), counted once per op on the program before any striping
    network_ops = [program.ops[i] for sg in plan["subgraphs"] if sg["device"] == "npu" for i in sg["ops"]]
    work = [(op_work(op, shapes, arrays)[0], _multiplies_16_bit(program, op)) for op in network_ops]
    network_macs = (sum(m for m, _ in work), sum(m for m, wide in work if wide))
    if striping is not None:  # chains run in row stripes (stripes.py): another program, same codes
        program, arrays, shapes, plan = striping.program, striping.arrays, striping.shapes, striping.plan
    ops = program.ops
    # fused intermediates never exist, so the every-op check compiles without fusion
    fusion = fuse(program, plan, shapes) if fused else Fusion()
    tables: dict[str, int] = {}
    if choice.pin_tables:
        npu_ops = [i for sg in plan["subgraphs"] if sg["device"] == "npu" for i in sg["ops"]]
        context = OpContext(program.tensors, shapes, arrays, SramPlan(0))
        every = choice.pin_tables == "every"
        tables = pinned_tables(context, ops, npu_ops, fusion, every=every)
        if not tables or (every and tables == pinned_tables(context, ops, npu_ops, fusion)):
            raise DoesNotFit  # nothing (more) to pin: a choice compiled already (known before allocating)
    allocation = allocate(
        program,
        arrays,
        shapes,
        plan,
        target.sram_kib * 1024,
        fusion,
        reuse_dram,
        resident_bytes,
        choice.residency,
        dict(choice.caps) or None,
        choice.in_place,
    )
    verify_allocation(allocation)
    consts = ConstantPool(base=allocation.tensor_area)
    ctx = OpContext(
        program.tensors,
        shapes,
        arrays,
        SramPlan(allocation.tile_sram),
        allocation.addr,
        consts,
        allocation.shuffled,
        allocation.windows,
        upsampled=allocation.upsampled,
        mac_cols=target.mac_cols,
    )
    if tables:
        ctx.pinned = pin(tables, allocation.tile_sram)
    tiles = min([allocation.tile_sram, *ctx.pinned.values()])
    const_slot = int(choice.const_share * tiles) // ALIGN * ALIGN
    if choice.fresh_constants:  # one area for all constants: two "slots" that add up to it
        const_slot = align(-(-choice.fresh_constants // 2))
    sram = ctx.sram = SramPlan(tiles, const_slot)
    dtypes = {**input_dtypes(model), **{n: "uint8" for n in program.pixel_inputs}}
    assembly = Assembly(program, arrays, shapes, target, plan, allocation, dtypes)
    lowered = {
        k: lower_subgraph(
            ctx,
            ops,
            sg["ops"],
            fusion,
            allocation,
            assembly.target_fields,
            choice.join_constants,
            bool(choice.fresh_constants),
            splits,
        )
        for k, sg in enumerate(plan["subgraphs"])
        if sg["device"] == "npu"
    }
    consts.compact([code for code, _ in lowered.values()])
    for k, sg in enumerate(plan["subgraphs"]):
        if sg["device"] == "npu":
            assembly.add_npu(k, *lowered[k])
        else:
            cpu = CpuSubgraph(model, program, arrays, k)
            for i in sg["ops"]:
                cpu.add_op(ops[i], assembly.states)
                for o in ops[i].outputs:
                    if o and o in cpu.current:
                        assembly.states[o] = cpu.current[o][1]
            assembly.add_cpu(k, cpu)
    data, stats = assembly.finish(bytes(consts.data), sram, *network_macs)
    stats["stripes"] = striping.chains if striping is not None else []
    if ctx.pinned:
        stats["pinned_tables"] = len(ctx.pinned)
    if striping is not None:
        stats["halo_macs"] = striping.halo_macs
        # the stripes' maps between their ops that did not stay resident (finer stripes' cue)
        stats["stripe_spills"] = sum(
            1 for n in striping.intermediates if n in allocation.addr and n not in allocation.resident
        )
    return data, stats
