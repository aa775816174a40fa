"""SRAM and DRAM arithmetic every back-end phase shares: alignment, 4-D shapes, the layout of one
op's SRAM (constants, then two tile buffers), and the error of an op that cannot be tiled."""

from __future__ import annotations

import math
from dataclasses import dataclass

ALIGN = 64
# A tensor kept in SRAM between the ops of one NPU subgraph has this bit in its address.
SRAM_FLAG = 1 << 40
# Per output channel, the requantization parameters a MAC layer loads with its weights: bias, M0
# and shift, each int64 (see OpContext.mac_params).
CHANNEL_PARAM_BYTES = 3 * 8


class DoesNotFit(Exception):
    """No tiling of the op fits the SRAM it is given (or the engines cannot address its shapes)."""


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def four(shape) -> list[int]:
    shape = [int(s) for s in shape]
    return [1] * (4 - len(shape)) + shape


def row_major(shape4) -> list[int]:
    strides, acc = [0] * 4, 1
    for i in range(3, -1, -1):
        strides[i] = acc
        acc *= shape4[i]
    return strides


def esize(bits: int) -> int:
    return 1 if bits == 8 else 2


def tensor_bytes(name: str, tensors: dict, shapes: dict) -> int:
    """The bytes a tensor of the integer model takes in memory (its codes, 1 or 2 bytes each)."""
    return math.prod(int(d) for d in shapes[name]) * esize(tensors[name].bits)


def halve(n: int) -> int:
    return max(1, (n + 1) // 2)


def space(address: int) -> tuple[int, int]:
    """(memory space, address): resident tensors carry SRAM_FLAG in their address."""
    return (1, address - SRAM_FLAG) if address >= SRAM_FLAG else (0, address)


@dataclass(frozen=True)
class SramPlan:
    """How an op's SRAM is laid out. With `const_slot` 0, its constants (weights, parameters,
    tables) sit at the bottom, then its working space, then two tile buffers (ping-pong: the DMA
    fills one while the engines work on the other). With `const_slot` > 0, two constant slots of
    that size come first and alternate between weight chunks, so the next chunk's weights load
    while this one computes. `tiles` is the SRAM left for all that once resident tensors took the
    top."""

    tiles: int
    const_slot: int = 0

    def consts_fit(self, fixed: int) -> bool:
        return not self.const_slot or fixed <= self.const_slot

    def fits(self, fixed: int, per_tile: int, scratch: int = 0) -> bool:
        if self.const_slot:
            room = self.tiles - 2 * self.const_slot - align(scratch)
            return fixed <= self.const_slot and 2 * align(per_tile) <= room
        return align(fixed + scratch) + 2 * align(per_tile) <= self.tiles

    def buffers(self, fixed: int, per_tile: int, scratch: int = 0) -> tuple[int, int]:
        """SRAM addresses of the two tile buffers: after `fixed` bytes of constants, or after the
        two constant slots (and `scratch` bytes of the op's own working space)."""
        if not self.fits(fixed, per_tile, scratch):
            raise DoesNotFit
        base = 2 * self.const_slot + align(scratch) if self.const_slot else align(fixed + scratch)
        return base, base + align(per_tile)

    def scratch_base(self) -> int:
        """Where an op's working space (not constants) starts: above the slots when there are any."""
        return 2 * self.const_slot
