"""What the scheduler and the emitters read: the integer model's tensors, shapes and arrays, the
allocation's addresses, the SRAM plan, and the pool the constants go into."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

from npubuild.intmodel.program import Op
from npubuild.targets.backend.commands import Step
from npubuild.targets.backend.memory import SramPlan, align, four, row_major
from npubuild.targets.isa import Instruction


@dataclass
class ConstantPool:
    """The constants section: arrays the NPU loads (weights, parameters, tables, indices), each
    stored once per key, aligned, at DRAM addresses after the tensors (`base`)."""

    base: int = 0
    data: bytearray = field(default_factory=bytearray)
    keys: dict[str, int] = field(default_factory=dict)

    def add(self, key: str, array: np.ndarray) -> int:
        """DRAM address of a constant array (deduplicated by key)."""
        if key not in self.keys:
            data = np.ascontiguousarray(array).tobytes()
            self.keys[key] = self.base + len(self.data)
            self.data += data + bytes(align(len(data)) - len(data))
        return self.keys[key]

    def mark(self) -> tuple[int, dict[str, int]]:
        return len(self.data), dict(self.keys)

    def rollback(self, mark: tuple[int, dict[str, int]]) -> None:
        """Forget what was added since `mark` (a trial emission's constants are not kept)."""
        del self.data[mark[0] :]
        self.keys = dict(mark[1])

    def image(self, load: Step) -> np.ndarray:
        """The bytes a constant load puts into SRAM, in SRAM order (its box, densely)."""
        a = load.args
        dims = [a[f"d{k}"] for k in range(4)]
        at = (
            a["dram"]
            - self.base
            + sum(
                np.arange(d).reshape([-1 if k == j else 1 for j in range(4)]) * a[f"s{k}"] * a["esize"]
                for k, d in enumerate(dims)
            )
        )
        at = (at[..., None] + np.arange(a["esize"])).reshape(-1)
        return np.frombuffer(self.data, np.uint8)[at]

    def compact(self, programs: list[list[Instruction]]) -> None:
        """Drop the entries no instruction reads (arrays whose every load went into a record) and
        close the gaps, rewriting each load's DRAM address into its entry's new place."""
        starts = sorted(set(self.keys.values()))
        ends = starts[1:] + [self.base + len(self.data)]
        owners = [  # each constant load and the start of the entry it reads
            (i, starts[bisect.bisect_right(starts, i.args["dram"]) - 1])
            for code in programs
            for i in code
            if i.op == "load" and i.args["space"] == 0 and i.args["dram"] >= self.base
        ]
        read = {start for _, start in owners}
        data, moved = bytearray(), {}
        for start, end in zip(starts, ends):
            if start in read:
                moved[start] = self.base + len(data)
                data += self.data[start - self.base : end - self.base]
        for i, start in owners:
            i.args["dram"] += moved[start] - start
        self.keys = {key: moved[at] for key, at in self.keys.items() if at in moved}
        self.data = data


@dataclass
class OpContext:
    tensors: dict
    shapes: dict[str, list[int]]
    arrays: dict[str, np.ndarray]
    sram: SramPlan
    addr: dict[str, int] = field(default_factory=dict)
    consts: ConstantPool = field(default_factory=ConstantPool)
    # tensors that are channel shuffles of the tensor at their address, read through (shuffles.py)
    shuffled: dict[str, int] = field(default_factory=dict)
    # tensors that are windows of the tensor their bytes are in (windows.py): its element strides
    windows: dict[str, list[int]] = field(default_factory=dict)

    def strides(self, name: str) -> list[int]:
        """The 4-D element strides of a data tensor where it lies: row-major, or for a window read
        through, those of the tensor it is a window of."""
        return self.windows.get(name) or row_major(four(self.shapes[name]))

    def bits(self, name: str) -> int:
        return self.tensors[name].bits

    def zero_point(self, name: str) -> int:
        return self.tensors[name].zero_point

    def operand(self, op: Op, name: str, bits: int) -> tuple[int, list[int], int]:
        """(DRAM address, 4-D shape, bits) of a data tensor or a constant operand."""
        consts = op.constants
        if name in consts:
            value = self.arrays[consts[name]]
            dtype = np.int8 if bits == 8 else np.int16
            return self.consts.add(f"{consts[name]}@{bits}", value.astype(dtype)), four(value.shape), bits
        return self.addr[name], four(self.shapes[name]), self.tensors[name].bits

    def operand_shape(self, op: Op, name: str) -> list[int]:
        """The 4-D shape of a data tensor or a constant operand (no constant is stored)."""
        consts = op.constants
        if name in consts:
            return four(self.arrays[consts[name]].shape)
        return four(self.shapes[name])

    def sum_operands(self, residual: Op, first: str) -> dict:
        """The operands of a residual Add run in another op's output path (format 4.0): its
        parameters with `first` (that op's result) as the first term, the Add being symmetric in
        its terms, and its sum's grid."""
        at = residual.attrs
        ours, theirs = (at.za, at.ma), (at.zb, at.mb)
        if residual.inputs[0] != first:
            ours, theirs = theirs, ours
        z = residual.outputs[0]
        return dict(
            add_za=ours[0], add_ma=ours[1], add_zb=theirs[0], add_mb=theirs[1],
            sum_zp=self.zero_point(z), sum_bits=self.bits(z),
        )  # fmt: skip

    def mac_params(self, op: Op) -> np.ndarray:
        """Per output channel: bias, M0, shift (int64 each, CHANNEL_PARAM_BYTES together)."""
        a = op.arrays
        bias, m0, shift = (self.arrays[k].astype(np.int64).reshape(-1) for k in (a.bias, a.m0, a.shift))
        return np.stack([bias, m0, shift], axis=1)

    def table_bytes(self, lut: Op) -> int:
        """The bytes of a lookup table's constant (`table`), without storing it."""
        entries, shifts = self.arrays[lut.arrays.table].size, self.tensors[lut.outputs[0]].channel_shifts
        return 2 * entries + len(shifts) if shifts else entries * (1 if self.bits(lut.outputs[0]) == 8 else 2)

    def table(self, lut: Op) -> tuple[int, int, int]:
        """(DRAM address, bytes, offset of the per-channel shifts or -1) of a lookup table as its
        instruction reads it: entries at the result's width, or for a per-channel result (format
        6.0) 16-bit entries followed by one int8 shift per channel."""
        y = lut.outputs[0]
        entries = self.arrays[lut.arrays.table]
        shifts = self.tensors[y].channel_shifts
        if not shifts:
            table = entries.astype(np.int8 if self.bits(y) == 8 else np.int16)
            key, shifts_at = f"{lut.arrays.table}#{self.bits(y)}", -1
        else:
            wide = entries.astype("<i2").view(np.uint8)
            table = np.concatenate([wide, np.asarray(shifts, np.int8).view(np.uint8)])
            key, shifts_at = f"{lut.arrays.table}#channels", wide.nbytes
        assert table.nbytes == self.table_bytes(lut)  # what the schedule reserved
        return self.consts.add(key, table), table.nbytes, shifts_at
