"""The virtual NPU's instruction set: encoding, decoding, static checks and the listing.

An instruction is an 8-byte header, then its operands as signed 64-bit little-endian integers:

    opcode u8 | wait u8 (token mask) | signal u8 (token id, 0xFF none) | nargs u8 | reserved u32

Every opcode has a fixed operand list (OPERANDS below, documented in docs/npu.md). Each
instruction goes to one engine's in-order queue; `wait` names the tokens (0-7) it waits for and
`signal` the token it sets when done, which is how a DMA load of the next tile overlaps the
computation of this one.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from npubuild.targets.npub import FORMAT_MAJOR, NpubError

HEAD = struct.Struct("<BBBBI")
NO_SIGNAL = 0xFF
TOKENS = 8

_BOX = ("d0", "d1", "d2", "d3")
_TWO_BOXES = (
    *("a", "a0", "a1", "a2", "a3", "a_bits"),
    *("b", "b0", "b1", "b2", "b3", "b_bits"),
    *("dst", "o0", "o1", "o2", "o3", "out_bits"),
)
# The borders a load pads its SRAM box with (pad_value), in the order of INPUT_PADS below
LOAD_PADS = ("pad_top", "pad_bottom", "pad_left", "pad_right")
# A residual Add's parameters in the output path of a conv or a mul (format 4.0 on)
SUM_OPERANDS = ("add_za", "add_ma", "add_zb", "add_mb", "sum_zp", "sum_bits")
# Borders a conv or pool adds around the box it reads (format 5.0 on): the box at `src` is
# in_h - top - bottom rows by in_w - left - right columns, read as if padded to in_h x in_w
INPUT_PADS = ("in_pad_top", "in_pad_bottom", "in_pad_left", "in_pad_right")
OUTPUT_CLAMP = ("min", "max")
# A clamp of a conv's residual sum (format 7.0 on): a ReLU after the Add in its output path
SUM_CLAMP = ("sum_min", "sum_max")
OPERANDS: dict[str, tuple[str, ...]] = {
    "load": (
        "space",
        "dram",
        "sram",
        "esize",
        *_BOX,
        "s0",
        "s1",
        "s2",
        "s3",
        *LOAD_PADS,
        "pad_value",
    ),
    "store": ("space", "sram", "dram", "esize", *_BOX, "s0", "s1", "s2", "s3"),
    "conv": (
        "src",
        "in_c",
        "in_h",
        "in_w",
        "in_bits",
        "in_zp",
        "weights",
        "params",
        "dst",
        "out_c",
        "out_h",
        "out_w",
        "out_bits",
        "out_zp",
        "kh",
        "kw",
        "sh",
        "sw",
        "dh",
        "dw",
        "group",
        "min",
        "max",
        "transpose",
        "crop_top",
        "crop_left",
        "lut",
        "lut_offset",
        "lut_bits",
        "mapping",  # how the MAC array takes the convolution (MAPPINGS); format 2.0 on
        "lut_shift",  # the output table's entry is (y + lut_offset) >> lut_shift; format 3.0 on
        # format 4.0 on: a residual Add in the output path (res >= 0): the result z = the element-
        # wise add of the (activated) output y, at zero point add_za and multiplier add_ma, and the
        # res_bits codes at `res`, at add_zb and add_mb, onto a sum_bits grid of zero point sum_zp
        "res",
        "res_bits",
        *SUM_OPERANDS,
        *INPUT_PADS,
        # format 6.0 on: the output table's 16-bit entry shifted right per output channel, by the
        # int8 shifts at lut_shifts (one per channel of the tile; -1: none) onto lut_bits codes
        "lut_shifts",
        # format 7.0 on: the residual Add's sum clamped to [sum_min, sum_max] (a ReLU after it)
        *SUM_CLAMP,
    ),
    "matmul": (
        "src",
        "m",
        "k",
        "in_bits",
        "in_zp",
        "weights",
        "params",
        "dst",
        "n",
        "out_bits",
        "out_zp",
        "min",
        "max",
    ),
    # add and mul read two 4-D boxes that broadcast to the output box; format 5.0 on, the codes
    # they write are clamped to [min, max] (a ReLU or Clip in the output path)
    "add": (*_TWO_BOXES, "za", "ma", "zb", "mb", "out_zp", *OUTPUT_CLAMP),
    # format 4.0 on: then_add 1 adds operand a (add_term 0) or b (1) to the product, as "add" adds
    # (the product at add_za, add_ma; the term at add_zb, add_mb), onto sum_bits codes at sum_zp
    "mul": (
        *(*_TWO_BOXES, "za", "zb", "m0", "shift", "out_zp", "then_add", "add_term", *SUM_OPERANDS),
        *OUTPUT_CLAMP,
    ),
    "requant": ("src", "n", "in_bits", "in_zp", "m0", "shift", "dst", "out_bits", "out_zp"),
    # shift: 3.0 on; 6.0 on, with shifts >= 0 the entries are 16-bit and each run of `per`
    # elements (a channel of the tile) is shifted right by the next int8 at shifts onto out_bits
    "lut": ("src", "n", "in_bits", "table", "offset", "dst", "out_bits", "shift", "shifts", "per"),
    "clamp": ("src", "n", "bits", "min", "max", "dst"),
    "gap": (
        "src",
        "c",
        "hw",
        "in_bits",
        "in_zp",
        "acc",
        "first",
        "last",
        "m0",
        "shift",
        "dst",
        "out_bits",
        "out_zp",
    ),
    "pool": (
        "src",
        "c",
        "in_h",
        "in_w",
        "in_bits",
        "in_zp",
        "kh",
        "kw",
        "sh",
        "sw",
        "dh",
        "dw",
        "mode",
        "params",
        "dst",
        "out_h",
        "out_w",
        "out_bits",
        "out_zp",
        *INPUT_PADS,
    ),
    "resize": ("src", "c", "in_h", "in_w", "bits", "index", "dst", "out_h", "out_w"),
    "end": (),
    # row reductions over the last axis (npubuild/intmodel/rowwise.py); codes after `end` keep
    # the older opcodes' numbers
    "softmax": ("src", "rows", "n", "in_bits", "table", "table_len", "rshift", "dst", "out_bits"),
    "layernorm": ("src", "rows", "n", "in_bits", "in_zp", "eps", "params", "dst", "out_bits", "out_zp"),
    # MatMul of two activations: [m, k] (codes at a) x [k, n] (codes at b), one multiplier
    "bmm": (
        *("a", "m", "k", "a_bits", "za", "b", "n", "b_bits", "zb"),
        *("dst", "out_bits", "out_zp", "m0", "shift"),
    ),
}
OPCODES = {name: i + 1 for i, name in enumerate(OPERANDS)}
# How a convolution occupies the R x C MAC array (docs/npu.md, "Mappings"): "channels" puts output
# channels across the columns and the reduction (input channels x taps) across the rows;
# "depthwise" puts channels across the columns and one channel's taps down its column, each column
# fed its own channel; "spatial" gives each of several output positions its own set of columns
# when a layer has fewer output channels than the array has columns. The numbers are the encoding.
MAPPINGS = {"channels": 0, "depthwise": 1, "spatial": 2}
# Older streams lack the operands added since, which decode as their old meaning: format 1.x had
# no conv mapping (every conv mapped "channels"), 2.x no table shifts (one entry per code), 3.x no
# residual Add in a conv's output path or chained onto a mul (on a conv res, res_bits and the
# sum's operands; on a mul then_add, add_term and the sum's), 4.x no input borders on a conv or
# a pool (their input tile was padded in SRAM), and no clamp on an add's or a mul's output (a
# ReLU after them was an op of its own), 5.x no per-channel shifts after a table, 6.x no clamp
# of a conv's residual sum (a ReLU after a fused residual Add was an op of its own).
RESIDUAL_OPERANDS = 2 + len(SUM_OPERANDS)
CHANNEL_SHIFT_OPERANDS = {"conv": ("lut_shifts",), "lut": ("shifts", "per")}  # format 6.0 on
_FORMAT_6 = {**OPERANDS, "conv": OPERANDS["conv"][: -len(SUM_CLAMP)]}
_FORMAT_5 = {
    **_FORMAT_6,
    **{op: _FORMAT_6[op][: -len(extra)] for op, extra in CHANNEL_SHIFT_OPERANDS.items()},
}
_FORMAT_4 = {
    **_FORMAT_5,
    "conv": _FORMAT_5["conv"][: -len(INPUT_PADS)],
    "pool": _FORMAT_5["pool"][: -len(INPUT_PADS)],
    "add": _FORMAT_5["add"][: -len(OUTPUT_CLAMP)],
    "mul": _FORMAT_5["mul"][: -len(OUTPUT_CLAMP)],
}
_NO_CHAIN = {**_FORMAT_4, "mul": _FORMAT_4["mul"][:-RESIDUAL_OPERANDS]}
_CONV_3 = _FORMAT_4["conv"][:-RESIDUAL_OPERANDS]
_LEGACY_OPERANDS = {
    1: {**_NO_CHAIN, "conv": _CONV_3[:-2], "lut": _FORMAT_5["lut"][:-1]},
    2: {**_NO_CHAIN, "conv": _CONV_3[:-1], "lut": _FORMAT_5["lut"][:-1]},
    3: {**_NO_CHAIN, "conv": _CONV_3},
    4: _FORMAT_4,
    5: _FORMAT_5,
    6: _FORMAT_6,
}
NO_RESIDUAL = {
    "res": -1,
    "res_bits": 8,
    "then_add": 0,
    "add_term": 0,
    **dict.fromkeys(SUM_OPERANDS, 0),
    "sum_bits": 8,
}
NO_PADS = dict.fromkeys(INPUT_PADS, 0)
NO_CHANNEL_SHIFTS = {"lut_shifts": -1, "shifts": -1, "per": 0}
NO_CLAMP = {"min": -(1 << 15), "max": (1 << 15) - 1}  # wider than any code an add or mul writes
NO_SUM_CLAMP = dict(zip(SUM_CLAMP, NO_CLAMP.values()))
_LEGACY_DEFAULTS = {
    "mapping": MAPPINGS["channels"],
    "lut_shift": 0,
    "shift": 0,
    **NO_RESIDUAL,
    **NO_PADS,
    **NO_CLAMP,
    **NO_CHANNEL_SHIFTS,
    **NO_SUM_CLAMP,
}
NAMES = {v: k for k, v in OPCODES.items()}


def far_box(a: dict) -> list[int]:
    """The box a load copies from, or a store copies to, the far memory: a load's SRAM box less
    the borders it pads (a store has none)."""
    get = a.get  # (written out: the code generator's searches call this millions of times)
    rows = a["d2"] - get("pad_top", 0) - get("pad_bottom", 0)
    return [a["d0"], a["d1"], rows, a["d3"] - get("pad_left", 0) - get("pad_right", 0)]


def far_span(a: dict, side: str) -> tuple[int, int]:
    """The bytes [start, end) a load's source or a store's destination (`side`: "dram", an SRAM
    address where `space` is 1) spans: a strided box counts from its first element to its last."""
    dims = far_box(a)
    if min(dims) <= 0:
        return (a[side], a[side])
    last = sum((d - 1) * a[f"s{k}"] for k, d in enumerate(dims))
    return (a[side], a[side] + (last + 1) * a["esize"])


def input_box(op: str, a: dict) -> tuple[int, int, int]:
    """The box a conv or pool reads at `src`: [channels, in_h, in_w] less its borders (format 5.0)."""
    channels = a["in_c"] if op == "conv" else a["c"]
    rows = a["in_h"] - a["in_pad_top"] - a["in_pad_bottom"]
    return channels, rows, a["in_w"] - a["in_pad_left"] - a["in_pad_right"]


def conv_weight_shape(a: dict) -> tuple[int, int, int, int]:
    """The int8 weights a conv reads at `weights`: [out_c, in_c / group, kh, kw], or for a
    transposed conv [in_c, out_c / group, kh, kw]."""
    group = max(a["group"], 1)
    if a["transpose"]:
        return a["in_c"], a["out_c"] // group, a["kh"], a["kw"]
    return a["out_c"], a["in_c"] // group, a["kh"], a["kw"]


def table_entries(in_bits: int, shift: int) -> int:
    """The entries of a lookup table with one per 2^shift codes of an `in_bits` input."""
    return 2 ** max(in_bits - shift, 0)


def entry_bits(code_bits: int, channel_shifts: int) -> int:
    """The width of a lookup table's entries: its codes', or 16 where the instruction shifts them
    per channel (`channel_shifts` >= 0: conv's `lut_shifts`, lut's `shifts`; format 6.0)."""
    return 16 if channel_shifts >= 0 else code_bits


def border_code(op: str, a: dict) -> int | None:
    """The code a conv's or pool's input borders hold (format 5.0): a conv's and an average pool's
    zero point, a max pool's lowest code; None where an instruction takes no borders (a
    transposed conv, every other op)."""
    if op == "conv" and not a["transpose"]:
        return a["in_zp"]
    if op == "pool":
        return a["in_zp"] if a["mode"] else -(1 << (a["in_bits"] - 1))
    return None


ENGINES = {
    "load": "dma_in",
    "store": "dma_out",
    "conv": "mac",
    "matmul": "mac",
    "add": "vector",
    "mul": "vector",
    "requant": "vector",
    "lut": "vector",
    "clamp": "vector",
    "gap": "vector",
    "pool": "vector",
    "resize": "vector",
    "softmax": "vector",
    "layernorm": "vector",
    "bmm": "mac",
    "end": "control",
}


@dataclass
class Instruction:
    op: str
    args: dict[str, int]
    wait: int = 0
    signal: int = NO_SIGNAL
    # what the cycle model works out for it, per target (cycles.Timeline): the code generator's
    # searches cost each instruction of a stream again for every alternative they weigh, and an
    # instruction's operands do not change once it is emitted (`dataclasses.replace` of its wait
    # or signal makes a new one, with an empty memo)
    timing: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def encode(self) -> bytes:
        names = OPERANDS[self.op]
        values = [int(self.args[n]) for n in names]
        head = HEAD.pack(OPCODES[self.op], self.wait, self.signal, len(names), 0)
        return head + struct.pack(f"<{len(values)}q", *values)

    def listing(self) -> str:
        sync = []
        if self.wait:
            sync.append("wait=" + ",".join(str(t) for t in range(TOKENS) if self.wait >> t & 1))
        if self.signal != NO_SIGNAL:
            sync.append(f"signal={self.signal}")
        args = " ".join(f"{k}={_fmt(k, v)}" for k, v in self.args.items())
        return f"{self.op:<8}{args}" + (f"  [{' '.join(sync)}]" if sync else "")


def _fmt(name: str, value: int) -> str:
    if name in (
        "dram",
        "sram",
        "src",
        "dst",
        "a",
        "b",
        "weights",
        "params",
        "table",
        "acc",
        "index",
        "shifts",
    ):
        return f"0x{value:x}"
    return str(value)


def encode(program: list[Instruction]) -> bytes:
    return b"".join(i.encode() for i in program)


def decode(code: bytes, format_major: int = FORMAT_MAJOR) -> list[Instruction]:
    """Parse a whole stream; anything malformed is an NpubError (never another exception).
    A stream of an older format gets the operands it lacks filled in with their old meaning."""
    operands = _LEGACY_OPERANDS.get(format_major, OPERANDS)
    out, at = [], 0
    while at < len(code):
        if at + HEAD.size > len(code):
            raise NpubError(f"instruction stream truncated at byte {at}")
        opcode, wait, signal, nargs, reserved = HEAD.unpack_from(code, at)
        op = NAMES.get(opcode)
        if op is None:
            raise NpubError(f"unknown opcode {opcode} at byte {at}")
        names = operands[op]
        if nargs != len(names) or reserved:
            raise NpubError(f"'{op}' at byte {at} has {nargs} operands, expected {len(names)}")
        if signal != NO_SIGNAL and signal >= TOKENS:
            raise NpubError(f"'{op}' at byte {at} signals token {signal}; there are {TOKENS}")
        at += HEAD.size
        if at + 8 * nargs > len(code):
            raise NpubError(f"instruction stream truncated in '{op}' at byte {at}")
        values = struct.unpack_from(f"<{nargs}q", code, at)
        at += 8 * nargs
        args = dict(zip(names, values))
        for name in OPERANDS[op][len(names) :]:
            args[name] = _LEGACY_DEFAULTS[name]
        out.append(Instruction(op, args, wait, signal))
    if not out or out[-1].op != "end":
        raise NpubError("instruction stream does not finish with 'end'")
    if any(i.op == "end" for i in out[:-1]):
        raise NpubError("'end' before the end of an instruction stream")
    return out


def subgraph_program(binary, sg: dict, k: int) -> list[Instruction]:
    """NPU subgraph `k`'s instruction stream (`sg`: its metadata entry), decoded from the
    binary's code section; NpubError where its span lies outside the section."""
    start, size = sg["code"]
    if start + size > len(binary.code):
        raise NpubError(f"subgraph {k}: instruction stream outside the code section")
    return decode(binary.code[start : start + size], binary.version[0])
