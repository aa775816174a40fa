"""One NPU subgraph through the back end's per-op phases: schedule each op (with the tile split
the cycle model finds fastest), emit its tile commands, lower them into the subgraph's stream."""

from __future__ import annotations

from npubuild.intmodel.program import Op
from npubuild.targets.backend import emit_data, emit_mac, emit_rows, emit_vector
from npubuild.targets.backend.allocation import Allocation
from npubuild.targets.backend.commands import Command, Step
from npubuild.targets.backend.constants import pack_constants
from npubuild.targets.backend.context import Added, OpContext
from npubuild.targets.backend.fusion import Fusion
from npubuild.targets.backend.lowering import Lowering
from npubuild.targets.backend.memory import DoesNotFit, SramPlan, align
from npubuild.targets.backend.schedule import OpSchedule, schedule
from npubuild.targets.backend.split_memo import SplitMemo
from npubuild.targets.cycles import conv_mapping, end_cycle
from npubuild.targets.isa import Instruction

# Row splits of the largest fitting tile that `choose_split` tries, and the cycles a split must save
# per instruction it adds (more instructions: a larger binary and a slower simulator).
PIPELINE_SPLITS = (1, 2, 4, 8)
PIPELINE_INSTRUCTION_CYCLES = 0
PIPELINE_MIN_GAIN = 0.02

EMITTERS = {
    "conv": emit_mac.conv,
    "matmul": emit_mac.matmul,
    "batch_matmul": emit_mac.batch_matmul,
    "add": emit_vector.binary,
    "mul": emit_vector.binary,
    "lut": emit_vector.lut,
    "clamp": emit_vector.clamp,
    "global_avgpool": emit_vector.global_avgpool,
    "avgpool": emit_vector.avgpool,
    "concat": emit_data.concat,
    "resize_nearest": emit_data.resize_nearest,
    "softmax": emit_rows.rows_op,
    "layernorm": emit_rows.rows_op,
}


def fits(ctx: OpContext, op: Op) -> bool:
    """Whether some tiling of the op fits the SRAM (the code generator's part of NPU support)."""
    try:
        schedule(ctx, op)
    except DoesNotFit:
        return False
    return True


def emit(
    ctx: OpContext,
    op: Op,
    sched: OpSchedule | None,
    target: dict,
    activation: Op | None = None,
    residual: Op | None = None,
    clamp: Op | None = None,
) -> list[Command]:
    if sched is None:
        return []
    if op.kind == "move":
        if op.op_type == "MaxPool":
            return emit_vector.pool(ctx, op, sched, maxpool=True)
        return emit_data.copy(ctx, op, sched)
    if op.kind == "conv":
        commands = emit_mac.conv(ctx, op, sched, activation, residual, clamp)
        return pack_constants(ctx.consts, map_convolutions(commands, target))
    if op.kind in ("add", "mul"):  # with a chained residual Add or a clamp, if fusion gave them
        return pack_constants(ctx.consts, emit_vector.binary(ctx, op, sched, residual, clamp))
    return pack_constants(ctx.consts, EMITTERS[op.kind](ctx, op, sched))


def map_convolutions(commands: list[Command], target: dict) -> list[Command]:
    """Each conv tile's mapping onto the MAC array (cycles.conv_mapping), written into its step."""
    for command in commands:
        step = getattr(command, "compute", None)
        if isinstance(step, Step) and step.op == "conv":
            step.args["mapping"] = conv_mapping(step.args, target)
    return commands


def lower_subgraph(
    ctx: OpContext,
    ops: list[Op],
    indices: list[int],
    fusion: Fusion,
    allocation: Allocation,
    target: dict,
    join: bool = False,
    fresh: bool = False,
    splits: SplitMemo | None = None,
) -> tuple[list[Instruction], list[tuple[int, Op]]]:
    """The subgraph's instructions and where each of its ops starts; with `join`, weight-bound ops
    load their constants with the group before; with `fresh`, every constant group loads into
    SRAM of its own (lowering.py); `splits`, the splits chosen in earlier compiles of the same
    program (split_memo.py)."""
    splits = splits if splits is not None else SplitMemo()
    lowering = Lowering(ctx.sram, target=target, join=join, fresh=fresh)
    whole = ctx.sram
    for i in indices:
        # an interval that leaves resident tensors less SRAM gives its ops' tiles the rest
        # (below the pinned tables, if any: pinning.py)
        tiles = min([allocation.tile_sram_at.get(i, whole.tiles), *ctx.pinned.values()])
        ctx.sram = SramPlan(tiles, whole.const_slot)
        op = ops[i]
        if i in fusion.absorbed or i in allocation.views:
            lowering.add_op(op, [])  # applied by the convolution before it, or a view of its input
            continue
        activation = ops[fusion.activation[i]] if i in fusion.activation else None
        residual = ops[fusion.residual[i]] if i in fusion.residual else None
        clamp = ops[fusion.clamp[i]] if i in fusion.clamp else None
        fused = (activation, residual, clamp)
        schedules = tilings(ctx, op, activation, residual)
        key = splits.key(ctx, op, fused, schedules, lowering)
        split, chosen = splits.get(key, lowering), None
        if split is None:
            split, fresh_bytes, chosen = choose_split(ctx, op, schedules, *fused, lowering, target)
            splits.put(key, split, fresh_bytes)
        if chosen is not None:  # the trial's commands, and its constants taken back into the pool
            commands, added = chosen
            ctx.consts.retake(added)
        else:
            commands = emit(ctx, op, schedules[split], target, *fused)
        lowering.add_op(op, commands)
    ctx.sram = whole
    return lowering.finish()


def tilings(
    ctx: OpContext, op: Op, activation: Op | None, residual: Op | None
) -> dict[int, OpSchedule | None]:
    """The op's schedule at each split of PIPELINE_SPLITS that fits (DoesNotFit where one tile
    does not)."""
    found = {}
    for split in PIPELINE_SPLITS:
        try:
            found[split] = schedule(ctx, op, split, activation, residual)
        except DoesNotFit:
            if split == 1:
                raise
    return found


def choose_split(
    ctx: OpContext,
    op: Op,
    schedules: dict[int, OpSchedule | None],
    activation: Op | None,
    residual: Op | None,
    clamp: Op | None,
    lowering: Lowering,
    target: dict,
) -> tuple[int, int, tuple[list[Command], Added] | None]:
    """The split of the op's largest fitting tile (`schedules`: tilings) that the cycle model finds
    fastest. One tile leaves the DMA nothing to overlap; more tiles pipeline load, compute and
    store, but each costs a DMA latency and an instruction to simulate. Also the bytes of a
    fresh constant area (lowering.py) the trials' constants took past the stream's end: a
    trial's constants past the area end the compile (DoesNotFit), so a split is only reused
    where the area has as much room (SplitMemo). And the chosen trial's commands with the
    constants it added to the pool (each trial's are taken out again): emitting is
    deterministic, so emitting the chosen split anew would give those commands and constants."""
    best: tuple[int, int, tuple[list[Command], Added]] | None = None
    fresh_bytes = 0
    tried: set[OpSchedule | None] = set()
    for split, sched in schedules.items():
        if sched in tried:
            continue  # a tile too small to split further: the same commands, no fewer cycles
        tried.add(sched)
        mark = ctx.consts.mark()
        try:
            commands = emit(ctx, op, sched, target, activation, residual, clamp)
        except DoesNotFit:
            if split == 1:
                raise
            continue
        finally:  # a trial's constants (resize indices per row block) are not kept
            added = ctx.consts.rollback(mark)
        trial = lowering.trial()
        trial.add_op(op, commands)
        if lowering.fresh:
            fresh_bytes = max(fresh_bytes, trial.fresh_end - align(lowering.fresh_end))
        if not trial.code:
            break
        cost = end_cycle(trial.code, target) + PIPELINE_INSTRUCTION_CYCLES * len(trial.code)
        if best is None or cost < best[0] * (1 - PIPELINE_MIN_GAIN):
            best = (cost, split, (commands, added))
    return (best[1], fresh_bytes, best[2]) if best else (1, fresh_bytes, None)
