"""The high-level tile command stream: what an op does, tile by tile, before synchronisation.

An emitter describes an op as `ConstLoads` (a group of constant loads into the constant area) and
`Tile`s (loads into one tile buffer, one compute, one store back). SRAM operands are given
relative to where they will be: `InTile(offset)` inside the tile's buffer, `InConst(offset)`
inside the current constant area. `lowering.py` turns the stream into instructions: it picks the
buffer of each tile, the tokens each instruction waits for and signals, and the constant slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from npubuild.targets.backend.memory import esize, space
from npubuild.targets.isa import LOAD_PADS


@dataclass(frozen=True)
class InTile:
    """An SRAM address `offset` bytes into the tile's buffer."""

    offset: int = 0


@dataclass(frozen=True)
class InConst:
    """An SRAM address `offset` bytes into the constant area the op's last constant group used."""

    offset: int = 0


@dataclass
class Step:
    """One instruction without its synchronisation: the opcode and its operands."""

    op: str
    args: dict


@dataclass
class ConstLoads:
    """Constant loads that form one group: the last one signals that the constants are in."""

    loads: list[Step]


@dataclass
class Tile:
    """One tile: its loads (the last signals that the input is in), a compute, a store. The
    store waits for the steps named in `store_after` ('compute', 'load')."""

    buffers: tuple[int, int]
    loads: list[Step]
    compute: Step | None = None
    store: Step | None = None
    store_after: frozenset[str] = field(default_factory=lambda: frozenset({"compute"}))


Command = ConstLoads | Tile


def transfer(op: str, sram, far: int, bits: int, box, strides, start, **args) -> Step:
    """A load or store of a 4-D box; `far` (a DRAM address, or a resident tensor's flagged SRAM
    address) is that of the tensor whose element `start` the box begins at. `bits` 32 and 64 are
    index and parameter arrays."""
    e = esize(bits) if bits in (8, 16) else bits // 8
    at = sum(int(a) * int(b) for a, b in zip(start, strides))
    where, origin = space(far + at * e)
    d0, d1, d2, d3 = box
    s0, s1, s2, s3 = strides
    # written out, in the operands' listing order: every tile of every trial comes through here
    step = {"space": where, "dram": origin, "sram": sram, "esize": e, "d0": d0, "d1": d1, "d2": d2, "d3": d3}
    step.update(s0=s0, s1=s1, s2=s2, s3=s3, **args)
    return Step(op, step)


def load(sram, dram: int, bits: int, box, strides, start, pads=(0, 0, 0, 0), value: int = 0) -> Step:
    """Load a box of `box` (SRAM dims incl. padding) whose unpadded part starts at `start`."""
    pad = dict(zip(LOAD_PADS, pads))
    return transfer("load", sram, dram, bits, box, strides, start, **pad, pad_value=value)


def store(sram, dram: int, bits: int, box, strides, start) -> Step:
    return transfer("store", sram, dram, bits, box, strides, start)


def box_bytes(step: Step) -> int:
    """Bytes of a load's or store's SRAM box (padding included)."""
    a = step.args
    return a["d0"] * a["d1"] * a["d2"] * a["d3"] * a["esize"]


def const_load(offset: int, addr: int, nbytes: int, pinned_at: int | None = None) -> Step:
    """`nbytes` of constants (weights, parameters, tables) to `offset` in the constant area, or
    to SRAM address `pinned_at` of their own (a pinned table: pinning.py; `is_pinned`)."""
    sram = InConst(offset) if pinned_at is None else pinned_at
    return load(sram, addr, 8, [1, 1, 1, nbytes], [0, 0, 0, 1], [0, 0, 0, 0])


def is_pinned(step: Step) -> bool:
    """A constant load to SRAM of its own (a pinned table) rather than to the constant area: its
    destination is a plain SRAM address, not an `InConst` offset."""
    return not isinstance(step.args["sram"], InConst)


def const_box(offset: int, addr: int, box, strides, start) -> Step:
    """A strided constant load (a block of a weight matrix's columns)."""
    return load(InConst(offset), addr, 8, box, strides, start)
