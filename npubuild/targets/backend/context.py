"""What the scheduler and the emitters read: the integer model's tensors, shapes and arrays, the
allocation's addresses, the SRAM plan, and the pool the constants go into."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

from npubuild.intmodel.program import Op
from npubuild.targets.backend.commands import Step
from npubuild.targets.backend.memory import SramPlan, align, four, row_major, space
from npubuild.targets.isa import Instruction


@dataclass
class Added:
    """What a trial added to a constant pool since a mark (`ConstantPool.rollback`)."""

    keys: dict[str, int]
    starts: list[int]
    entries: list[tuple[int, np.ndarray]]
    end: int


@dataclass
class ConstantPool:
    """The constants section: arrays the NPU loads (weights, parameters, tables, indices), each
    stored once per key, aligned, at DRAM addresses after the tensors (`base`).

    The grouping search emits an op several times and forgets each trial (`rollback`), so the
    pool keeps each entry as the array it was given (the section's bytes are put together once,
    `data`), and an entry a trial adds again with the same bytes keeps its version: what is worked
    out from an entry's bytes (a record of several, `records`) is then reused, never from bytes
    that a key had in another trial (a resize's index array differs with its tile's rows)."""

    base: int = 0
    keys: dict[str, int] = field(default_factory=dict)
    # (each part's offset and `source`) -> (the record's key, its bytes): constants.pack_constants
    records: dict[tuple, tuple[str, np.ndarray]] = field(default_factory=dict)
    _starts: list[int] = field(default_factory=list)  # each entry's address, ascending
    _entries: list[tuple[int, np.ndarray]] = field(default_factory=list)  # (version, bytes) of each
    _end: int = 0  # bytes the entries take, each aligned
    _seen: dict[str, tuple[int, np.ndarray]] = field(default_factory=dict)  # a key's last version
    _versions: int = 0

    def add(self, key: str, array: np.ndarray) -> int:
        """DRAM address of a constant array (deduplicated by key)."""
        if key not in self.keys:
            data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
            if not data.flags.owndata and data.base is not array:
                data = data.copy()  # a view of an array somebody may still change
            seen = self._seen.get(key)
            if seen is not None and seen[1].shape == data.shape and np.array_equal(seen[1], data):
                version, data = seen
            else:
                self._versions += 1
                version = self._versions
                self._seen[key] = (version, data)
            self.keys[key] = self.base + self._end
            self._starts.append(self.keys[key])
            self._entries.append((version, data))
            self._end += align(len(data))
        return self.keys[key]

    @property
    def data(self) -> bytearray:
        """The section's bytes: each entry at its address, zeros between."""
        out = bytearray(self._end)
        for at, (_, data) in zip(self._starts, self._entries):
            out[at - self.base : at - self.base + len(data)] = data.tobytes()
        return out

    def mark(self) -> int:
        return len(self._entries)

    def rollback(self, mark: int) -> Added:
        """Forget what was added since `mark` (a trial emission's constants are not kept); what
        was forgotten, for `retake`."""
        if mark >= len(self._entries):
            return Added({}, [], [], self._end)
        end = self._end
        self._end = self._starts[mark] - self.base
        dropped = set(self._starts[mark:])
        kept, forgot = {}, {}
        for key, at in self.keys.items():
            (forgot if at in dropped else kept)[key] = at
        self.keys = kept
        added = Added(forgot, self._starts[mark:], self._entries[mark:], end)
        del self._starts[mark:], self._entries[mark:]
        return added

    def retake(self, added: Added) -> None:
        """Add again what a rollback to the pool's present mark forgot: the pool is then as the
        trial left it (the trial's commands name those addresses), without emitting it anew."""
        self.keys.update(added.keys)
        self._starts += added.starts
        self._entries += added.entries
        self._end = added.end

    def source(self, load: Step) -> tuple:
        """What a constant load reads, named by its entry's version rather than its address (which
        a rollback may give to other bytes): the version, the offset into the entry and the box."""
        a = load.args
        k = bisect.bisect_right(self._starts, a["dram"]) - 1
        box = tuple(a[f"{n}{i}"] for n in "ds" for i in range(4))
        return (self._entries[k][0], a["dram"] - self._starts[k], a["esize"], *box)

    def image(self, load: Step) -> np.ndarray:
        """The bytes a constant load puts into SRAM, in SRAM order (its box, densely)."""
        a = load.args
        e = a["esize"]
        dims = [a[f"d{k}"] for k in range(4)]
        strides = [a[f"s{k}"] * e for k in range(4)]
        k = bisect.bisect_right(self._starts, a["dram"]) - 1
        start = a["dram"] - self._starts[k] if k >= 0 else -1
        last = start + sum((d - 1) * s for d, s in zip(dims, strides)) + e - 1
        if start < 0 or min(strides) < 0 or last >= len(self._entries[k][1]):
            raise IndexError(f"constant load at {a['dram']:#x} outside its entry")
        data = self._entries[k][1]
        box = np.lib.stride_tricks.as_strided(data[start:], (*dims, e), (*strides, 1), writeable=False)
        return np.array(box, copy=True).reshape(-1)

    def compact(self, programs: list[list[Instruction]]) -> None:
        """Drop the entries no instruction reads (arrays whose every load went into a record) and
        close the gaps, rewriting each load's DRAM address into its entry's new place."""
        starts = self._starts
        owners = [  # each constant load and the start of the entry it reads
            (i, starts[bisect.bisect_right(starts, i.args["dram"]) - 1])
            for code in programs
            for i in code
            if i.op == "load" and i.args["space"] == 0 and i.args["dram"] >= self.base
        ]
        read = {start for _, start in owners}
        kept_starts, kept, moved, end = [], [], {}, 0
        for start, entry in zip(starts, self._entries):
            if start in read:
                moved[start] = self.base + end
                kept_starts.append(self.base + end)
                kept.append(entry)
                end += align(len(entry[1]))
        for i, start in owners:
            i.args["dram"] += moved[start] - start
        self.keys = {key: moved[at] for key, at in self.keys.items() if at in moved}
        self._starts, self._entries, self._end = kept_starts, kept, end


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
    # upsamples read through (upsamples.py): their input and its (row, column) factors
    upsampled: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    # tables loaded once into SRAM kept for them (pinning.py): `table_key` -> SRAM address; the
    # ops' constants and tiles lie below the lowest
    pinned: dict[str, int] = field(default_factory=dict)
    # the MAC array's columns: a banded convolution's chunks are as wide (schedule.band_chunk);
    # 0 where no code is made (the partition's fit test)
    mac_cols: int = 0
    _weight_use: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def weight_use(self, name: str) -> np.ndarray:
        """[output channels, input channels]: where a convolution's weights (array `name`) are
        not all zero. Kept: the grouping search emits each convolution several times a compile."""
        if name not in self._weight_use:
            weight = self.arrays[name]
            self._weight_use[name] = np.any(weight.reshape(weight.shape[:2] + (-1,)) != 0, axis=2)
        return self._weight_use[name]

    def strides(self, name: str) -> list[int]:
        """The 4-D element strides of a data tensor where it lies: row-major, or for a window read
        through, those of the tensor it is a window of."""
        return self.windows.get(name) or row_major(four(self.shapes[name]))

    def resident(self, name: str) -> bool:
        """Whether a tensor lies in the resident SRAM area (no address yet: not resident)."""
        return space(self.addr.get(name, 0))[0] == 1

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

    def table_key(self, lut: Op) -> str:
        """The constant pool's key of a lookup table as its instruction reads it (`table`)."""
        if self.tensors[lut.outputs[0]].channel_shifts:
            return f"{lut.arrays.table}#channels"
        return f"{lut.arrays.table}#{self.bits(lut.outputs[0])}"

    def table(self, lut: Op) -> tuple[int, int, int]:
        """(DRAM address, bytes, offset of the per-channel shifts or -1) of a lookup table as its
        instruction reads it: entries at the result's width, or for a per-channel result (format
        6.0) 16-bit entries followed by one int8 shift per channel."""
        y = lut.outputs[0]
        entries = self.arrays[lut.arrays.table]
        shifts = self.tensors[y].channel_shifts
        if not shifts:
            table = entries.astype(np.int8 if self.bits(y) == 8 else np.int16)
            shifts_at = -1
        else:
            wide = entries.astype("<i2").view(np.uint8)
            table = np.concatenate([wide, np.asarray(shifts, np.int8).view(np.uint8)])
            shifts_at = wide.nbytes
        key = self.table_key(lut)
        assert table.nbytes == self.table_bytes(lut)  # what the schedule reserved
        return self.consts.add(key, table), table.nbytes, shifts_at
