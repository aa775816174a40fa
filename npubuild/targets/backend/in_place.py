"""Tiles that read and write resident tensors where they live (lowering.py's module docstring):
an on-chip copy of contiguous resident bytes into or out of a tile buffer is dropped and the
compute's operand is the resident address."""

from __future__ import annotations

from npubuild.targets.backend.commands import InTile, Step, Tile, box_bytes
from npubuild.targets.isa import INPUT_PADS, LOAD_PADS, border_code, far_box, far_span


def _contiguous(step: Step) -> InTile | None:
    """The tile-buffer offset of an on-chip copy (`space` 1) of a dense box: a load of contiguous
    bytes of a resident tensor (with borders it adds, possibly) or a store of them, which the
    compute can address where they are."""
    a = step.args
    if a["space"] != 1 or not isinstance(a["sram"], InTile):
        return None
    dims = far_box(a)
    strides = [a[f"s{k}"] for k in range(4)]
    dense = 1
    for k in (3, 2, 1, 0):
        if dims[k] > 1 and strides[k] != dense:
            return None
        dense *= dims[k]
    return a["sram"]


def in_place(tile: Tile, written: list[tuple[int, int]] | None = None) -> Tile:
    """The tile with its on-chip copies of contiguous resident bytes dropped and its compute's operands
    pointing at the resident tensors (module docstring). Only where the operands are unambiguous:
    each dropped copy's buffer offset is a compute operand exactly, no other operand points into
    its bytes, and no input and the output share an offset (a compute in place in its buffer). A
    copy that pads its box is dropped only where it is a conv's or pool's input and pads with the
    code the op's own borders hold: the compute then takes the borders (INPUT_PADS). `written`
    (a tile of an op of several): the resident bytes the op's tiles store, which no copy of its
    own is dropped for, unless the tile stores exactly those bytes itself (an element-wise
    result in place: it reads and writes them where they live)."""
    if tile.compute is None or tile.store_after != frozenset({"compute"}):
        return tile
    where: dict[InTile, int] = {}  # a dropped copy's buffer offset -> the resident address
    borders: dict[str, int] = {}
    kept = []
    for load in tile.loads:
        offset = _contiguous(load)
        pads = [load.args[p] for p in LOAD_PADS]
        if any(pads) and offset is not None:
            compute = tile.compute
            if (
                borders
                or offset != compute.args.get("src")
                or load.args["pad_value"] != border_code(compute.op, compute.args)
            ):
                offset = None  # the copy stays: not the op's input, or padded with another code
            else:
                borders = dict(zip(INPUT_PADS, pads))
        if offset is not None and written is not None:
            start, end = far_span(load.args, "dram")
            others = list(written)
            if tile.store is not None and tile.store.args["space"] == 1:
                # an element-wise result in its operand's place (allocation.py): this tile writes
                # back exactly the bytes it reads, and element k only reads element k
                own = far_span(tile.store.args, "dram")
                if own == (start, end) and own in others:
                    others.remove(own)
            if any(s < end and start < e for s, e in others):
                offset = None  # another tile of the op writes those bytes: read a copy
        if offset is None or offset in where:
            kept.append(load)
        else:
            where[offset] = load.args["dram"]
    out = _contiguous(tile.store) if tile.store is not None else None
    if out is not None and out in where:
        return tile
    dropped = [*where, *([out] if out is not None else [])]
    if not dropped:  # (the usual tile: before the operands are listed)
        return tile
    operands = [v for v in tile.compute.args.values() if isinstance(v, InTile)]
    if any(o not in operands for o in dropped):
        return tile
    sizes = {}
    for load in tile.loads:
        if load.args["sram"] in where:
            sizes[load.args["sram"]] = box_bytes(load)
    if out is not None:
        sizes[out] = box_bytes(tile.store)
    for v in operands:
        for offset, size in sizes.items():
            if v != offset and offset.offset <= v.offset < offset.offset + size:
                return tile  # an operand inside a dropped copy's bytes
    if out is not None:
        where[out] = tile.store.args["dram"]
    args = {k: where.get(v, v) if isinstance(v, InTile) else v for k, v in tile.compute.args.items()}
    return Tile(
        tile.buffers,
        kept,
        Step(tile.compute.op, {**args, **borders}),
        None if out is not None else tile.store,
        tile.store_after,
    )
