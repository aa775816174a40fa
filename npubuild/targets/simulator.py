"""The instruction-level simulator: executes an NPU instruction stream on numpy memories.

SRAM and DRAM are byte arrays. Every instruction reads and writes them exactly as docs/npu.md
says; the arithmetic is the golden interpreter's (the same exact-integer kernels and the one
rounding rule), applied to the tiles the code generator chose, so a wrong tile, halo, padding,
offset or stride shows up as a mismatch against the integer model.

A batch of images runs as that many NPUs executing the same stream in lockstep: each memory holds
one row of bytes per image, every view has the images first, and one numpy (or onnxruntime) call
does an instruction for all of them. A stream has no branches and its addresses are in the
instructions, so each row computes exactly what a lone NPU would; the per-instruction cost of
interpreting the stream, most of a small image's time, is paid once per batch. An operand that
should be a constant (weights, requantization parameters, index tables) is checked to be the same
in every row; where a stream made them differ, that instruction runs image by image.

Counters (per image): instructions per engine, bytes moved by DMA, MACs, and the SRAM high-water
mark.
"""

from __future__ import annotations

import math
from collections import Counter
from functools import lru_cache

import numpy as np

from npubuild.intmodel.codes import centred_bound, elementwise, looked_up, per_code, qrange, saturate
from npubuild.intmodel.fixedpoint import OutputRule, add_codes, channel_shifted, multiply_codes, requantize
from npubuild.intmodel.kernels import conv_sums, conv_transpose_accumulate, window_max, windows
from npubuild.intmodel.ortconv import ExactConvs
from npubuild.intmodel.program import ConvGeometry
from npubuild.intmodel.rowwise import EPS_CODES_MAX, layernorm_rows, softmax_rows
from npubuild.targets.cycles import Timeline, engine
from npubuild.targets.isa import (
    INPUT_PADS,
    LOAD_PADS,
    MAPPINGS,
    Instruction,
    border_code,
    conv_weight_shape,
    entry_bits,
    far_box,
    input_box,
    table_entries,
)
from npubuild.targets.npub import NpubError
from npubuild.targets.sim_memory import DTYPES, Memory, Uneven, common_row


def _look_up(
    table: np.ndarray, x: np.ndarray, offset: int, what: str, x_range: tuple[int, int], shift: int = 0
) -> np.ndarray:
    """table[(x + offset) >> shift] in each image's own table ([rows, entries]; x [rows, ...], its
    values known to lie in x_range: then the bounds check needs no pass over x when the range
    fits)."""
    if shift:  # one entry per 2^shift codes: index by the entry
        x = np.right_shift(np.add(x, offset, dtype=np.int32), shift)
        x_range = ((x_range[0] + offset) >> shift, (x_range[1] + offset) >> shift)
        offset = 0
    return _indexed(table, x, offset, what, x_range)


def _indexed(
    table: np.ndarray, x: np.ndarray, offset: int, what: str, x_range: tuple[int, int]
) -> np.ndarray:
    """table[x + offset] in each image's own table, x's values known to lie in x_range."""
    inside = 0 <= x_range[0] + offset and x_range[1] + offset < table.shape[1]
    if x.size and not inside and (int(x.min()) + offset < 0 or int(x.max()) + offset >= table.shape[1]):
        raise NpubError(f"{what} index outside its table")
    try:  # the usual case, one table for all: a plain gather, several times take_along_axis's speed
        one = common_row(table)
    except Uneven:
        index = np.add(x, offset, dtype=np.int32).reshape(x.shape[0], -1)
        return np.take_along_axis(table, index, axis=1).reshape(x.shape)
    return looked_up(one, x, offset)


def _clamped(codes: np.ndarray, a: dict, bits: int) -> np.ndarray:
    """An add's or mul's codes clamped to its [min, max] (format 5.0: a ReLU in its output path),
    as the clamp instruction clamps; a clamp wider than the codes changes nothing."""
    lowest, highest = qrange(bits)
    if a["min"] <= lowest and a["max"] >= highest:
        return codes
    return saturate(np.clip(codes.astype(np.int64), a["min"], a["max"]), bits)


@lru_cache(maxsize=1024)
def _geometry(sh: int, sw: int, dh: int, dw: int, group: int, pads: tuple[int, ...]) -> ConvGeometry:
    """A conv instruction's geometry (frozen, so shared by every instruction alike: a validated
    model per instruction cost more than the tile's arithmetic on small tiles)."""
    return ConvGeometry(strides=[sh, sw], dilations=[dh, dw], pads=list(pads), group=group)


# what a load's tile holds, given its source bytes: its shape, strides, element size and padding
_LOAD_FIELDS = (
    *("esize", "d0", "d1", "d2", "d3", "s0", "s1", "s2", "s3"),
    *(*LOAD_PADS, "pad_value"),
)

ESIZE_BITS = {1: 8, 2: 16, 4: 32, 8: 64}


class Simulator:
    def __init__(
        self, sram_bytes: int, dram_bytes: int, target: dict | None = None, batch: int = 1, threads: int = 1
    ):
        self.batch = batch
        self.sram = Memory("SRAM", sram_bytes, batch)
        self.dram = Memory("DRAM", dram_bytes, batch)
        self.counts: Counter = Counter()
        self.target = target
        self._static: dict[int, tuple[list[Instruction], dict[str, int]]] = {}
        # onnxruntime sessions, named by the weights' address; `threads` each: a batch's
        # convolutions are large enough to share out
        self._exact_convs = ExactConvs(threads)
        self._requant_tables: dict[tuple, np.ndarray] = {}
        self._output_rules: dict[tuple, OutputRule] = {}  # by the parameters' token and output
        self._boxes: dict[tuple, tuple] = {}  # (id(args), padded) -> (args, checked DMA geometry)

    def use_rows(self, first: int, rows: int) -> None:
        """Run the next instructions on images first .. first + rows - 1 of the batch."""
        if not (0 <= first and rows >= 1 and first + rows <= self.batch):
            raise ValueError(f"rows {first}..{first + rows} of a batch of {self.batch}")
        for memory in (self.sram, self.dram):
            memory.first, memory.rows = first, rows

    # --- DMA ------------------------------------------------------------------------------------
    def _dram_box(self, a: dict, padded: bool = True) -> tuple[np.ndarray, tuple, Memory, int]:
        """The far side of a DMA (its elements, extents without the padding, memory, end); its
        checked geometry is kept per instruction: a stream runs the same DMAs every time."""
        known = self._boxes.get((id(a), padded))
        if known is None or known[0] is not a:
            known = self._boxes[(id(a), padded)] = (a, *self._box_geometry(a, padded))
        _, inner, strides, far, end, dtype = known
        return far.strided(a["dram"], dtype, inner, strides), inner, far, end

    def _box_geometry(self, a: dict, padded: bool) -> tuple[tuple, tuple, Memory, int, np.dtype]:
        esize = a["esize"]
        if esize not in (1, 2, 4, 8):
            raise NpubError(f"DMA element size {esize}")
        inner = tuple(far_box(a)) if padded else (a["d0"], a["d1"], a["d2"], a["d3"])
        strides = (a["s0"], a["s1"], a["s2"], a["s3"])
        if any(d < 0 for d in inner) or any(s < 0 for s in strides) or a["dram"] < 0:
            raise NpubError("DMA with a negative extent, stride or address")
        far = {0: self.dram, 1: self.sram}.get(a["space"])
        if far is None:
            raise NpubError(f"DMA memory space {a['space']}")
        span = sum((d - 1) * s for d, s in zip(inner, strides)) + 1 if all(inner) else 0
        end = a["dram"] + span * esize
        if end > far.size:
            raise NpubError(f"DMA reads or writes {far.name} past its end ({end:#x})")
        return inner, strides, far, end, DTYPES[ESIZE_BITS[esize]]

    def _load(self, a: dict) -> None:
        box, inner, far, end = self._dram_box(a)
        if a["space"] == 1:  # an SRAM-to-SRAM copy: its source may overlap the tile written below
            box = np.array(box)
        bits = ESIZE_BITS[a["esize"]]
        out = self.sram.view(a["sram"], bits, (a["d0"], a["d1"], a["d2"], a["d3"]), write=True)
        pt, pl = a["pad_top"], a["pad_left"]
        if pt or pl or inner[2] != a["d2"] or inner[3] != a["d3"]:  # a padded tile: the pad first
            out[...] = a["pad_value"]
        out[:, :, :, pt : pt + inner[2], pl : pl + inner[3]] = box  # SRAM written in place
        source = far.token_within(a["dram"], end) if a["space"] == 0 else None
        if source is not None:  # a copy of known bytes: the tile is known too, by where it came from
            geometry = tuple(a[k] for k in _LOAD_FIELDS)
            self.sram.mark(a["sram"], a["sram"] + out[0].nbytes, (source, geometry))
        moved = math.prod(inner) * a["esize"]  # per image
        self.counts["dma_in_bytes" if a["space"] == 0 else "sram_copy_bytes"] += moved

    def _store(self, a: dict) -> None:
        bits = ESIZE_BITS.get(a["esize"])
        if bits is None:
            raise NpubError(f"DMA element size {a['esize']}")
        src = self.sram.view(a["sram"], bits, (a["d0"], a["d1"], a["d2"], a["d3"]))
        box, _, far, end = self._dram_box(a, padded=False)
        far.forget(a["dram"], end)
        box[...] = src
        moved = math.prod(src.shape[1:]) * a["esize"]  # per image
        if a["space"] == 1:
            self.sram.high_water = max(self.sram.high_water, a["dram"] + moved)
        self.counts["dma_out_bytes" if a["space"] == 0 else "sram_copy_bytes"] += moved

    # --- MAC array ------------------------------------------------------------------------------
    def _finish(
        self,
        acc: np.ndarray,
        params: np.ndarray,
        a: dict,
        channel_axis: int,
        acc_bound: float | None = None,
        named: object = None,
        index: tuple[int, int] = (0, 0),
    ) -> np.ndarray:
        """The MAC output path's codes, or with `index` (offset, shift) the index of the table
        read after it (OutputRule.apply); `named`, the parameters' token where they came from the
        constants: their rule is then worked out once."""
        key = (named, acc.ndim, channel_axis, a["out_zp"], a["min"], a["max"])
        rule = self._output_rules.get(key) if named is not None else None
        if rule is None:
            bias, m0, shift = params.T
            rule = OutputRule(bias, m0, shift, channel_axis, acc.ndim, a["out_zp"], a["min"], a["max"])
            if named is not None:
                self._output_rules[key] = rule
        return rule.apply(acc, acc_bound, *index)

    def _bordered(self, op: str, a: dict) -> tuple[np.ndarray, tuple[int, int, int, int]]:
        """A conv's or pool's input box at `src` (in_h x in_w less its borders, format 5.0) and
        its borders in ONNX order (top, left, bottom, right)."""
        top, bottom, left, right = (a[k] for k in INPUT_PADS)
        box = input_box(op, a)
        if min(top, bottom, left, right) < 0 or min(box[1:]) <= 0:
            raise NpubError(f"{a['in_h']} x {a['in_w']} input with borders {top}, {bottom}, {left}, {right}")
        return self.sram.view(a["src"], a["in_bits"], box), (top, left, bottom, right)

    def _conv(self, a: dict) -> None:
        x, pads = self._bordered("conv", a)
        group = a["group"]
        if group <= 0 or a["in_c"] % group:
            raise NpubError(f"conv with {a['in_c']} input channels in {group} groups")
        mapping = a["mapping"]
        offered = [MAPPINGS[m] for m in (self.target or {}).get("conv_mappings", MAPPINGS)]
        if mapping not in offered:
            raise NpubError(f"conv with mapping {mapping}; this target's array takes {sorted(offered)}")
        if mapping == MAPPINGS["depthwise"] and (a["transpose"] or a["in_c"] != group):
            raise NpubError(f"depthwise mapping of a conv with {a['in_c']} input channels in {group} groups")
        w, named = self.sram.same_in_every_row(a["weights"], 8, conv_weight_shape(a))
        params, params_named = self.sram.same_in_every_row(a["params"], 64, (a["out_c"], 3))
        if min(a["sh"], a["sw"], a["dh"], a["dw"], a["kh"], a["kw"]) <= 0:
            raise NpubError("conv with a non-positive kernel, stride or dilation")
        if a["transpose"] and any(pads):
            raise NpubError("transposed conv with input borders")
        # a border is the zero point: zero once centred, as the geometry's padding pads
        attrs = _geometry(a["sh"], a["sw"], a["dh"], a["dw"], group, pads)
        x_bound = centred_bound(a["in_bits"], a["in_zp"])
        acc_bound = None
        if a["transpose"]:
            xc = np.subtract(x, a["in_zp"], dtype=np.float32)  # codes: exact in float32
            full = conv_transpose_accumulate(xc, w, attrs, self._exact_convs, a["weights"], x_bound)
            acc = np.zeros((x.shape[0], a["out_c"], a["out_h"], a["out_w"]))
            t, left = a["crop_top"], a["crop_left"]
            r0, r1 = max(t, 0), min(t + a["out_h"], full.shape[2])
            c0, c1 = max(left, 0), min(left + a["out_w"], full.shape[3])
            if r1 > r0 and c1 > c0:
                acc[:, :, r0 - t : r1 - t, c0 - left : c1 - left] = full[:, :, r0:r1, c0:c1]
        else:
            xc = np.subtract(x, a["in_zp"], dtype=np.float32)  # codes: exact in float32
            acc, acc_bound = conv_sums(xc, w, attrs, self._exact_convs, a["weights"], x_bound, named)
            if acc.shape[2:] != (a["out_h"], a["out_w"]):
                raise NpubError(f"conv tile gives {acc.shape[2:]}, instruction says {a['out_h'], a['out_w']}")
        self.counts["macs"] += math.prod(acc.shape[1:]) * math.prod(w.shape[1:])
        bits = a["out_bits"]
        if a["lut"] >= 0:  # an activation table in the output path (a LUT op fused into the conv)
            wide = entry_bits(a["lut_bits"], a["lut_shifts"])
            table = self._table(a["lut"], wide, a["out_bits"], a["lut_shift"])
            offset, shift = a["lut_offset"], a["lut_shift"]
            index = self._finish(acc, params, a, 1, acc_bound, params_named, (offset, shift))
            entries = ((a["min"] + offset) >> shift, (a["max"] + offset) >> shift)
            y = _indexed(table, index, 0, "conv output table", entries)
            if a["lut_shifts"] >= 0:
                y = self._channel_shifted(y, a["lut_shifts"], a["out_c"], a["lut_bits"])
            bits = a["lut_bits"]
        else:
            y = self._finish(acc, params, a, 1, acc_bound, params_named)
        if a["res"] >= 0:  # a residual Add in the output path (an Add op fused into the conv)
            residual = self.sram.view(a["res"], a["res_bits"], y.shape[1:])
            y = add_codes(
                y, a["add_za"], a["add_ma"], residual, a["add_zb"], a["add_mb"], a["sum_zp"], a["sum_bits"]
            )
            bits = a["sum_bits"]
            y = _clamped(y, {"min": a["sum_min"], "max": a["sum_max"]}, bits)  # a ReLU after it (7.0)
        self.sram.write(a["dst"], bits, y)

    def _matmul(self, a: dict) -> None:
        x = self.sram.view(a["src"], a["in_bits"], (a["m"], a["k"]))
        w = common_row(self.sram.view(a["weights"], 8, (a["k"], a["n"])))
        params = common_row(self.sram.view(a["params"], 64, (a["n"], 3)))
        acc = (x.astype(np.float64) - a["in_zp"]) @ w.astype(np.float64)
        self.counts["macs"] += a["m"] * a["k"] * a["n"]
        self.sram.write(a["dst"], a["out_bits"], self._finish(acc, params, a, 2))

    def _bmm(self, a: dict) -> None:
        x = self.sram.view(a["a"], a["a_bits"], (a["m"], a["k"])).astype(np.float64) - a["za"]
        w = self.sram.view(a["b"], a["b_bits"], (a["k"], a["n"])).astype(np.float64) - a["zb"]
        acc = np.rint(x @ w).astype(np.int64)  # exact: integer products, sums below 2^53
        self.counts["macs"] += a["m"] * a["k"] * a["n"]
        y = requantize(acc, a["m0"], a["shift"]) + a["out_zp"]
        self.sram.write(a["dst"], a["out_bits"], saturate(y, a["out_bits"]))

    # --- vector unit ----------------------------------------------------------------------------
    def _operands(self, a: dict):
        x = self.sram.view(a["a"], a["a_bits"], [a[f"a{i}"] for i in range(4)])
        y = self.sram.view(a["b"], a["b_bits"], [a[f"b{i}"] for i in range(4)])
        shape = (x.shape[0], *(a[f"o{i}"] for i in range(4)))
        try:
            if np.broadcast_shapes(x.shape, y.shape) != shape:
                raise ValueError
        except ValueError:
            broadcast = f"operands {x.shape[1:]} and {y.shape[1:]} do not broadcast to {shape[1:]}"
            raise NpubError(broadcast) from None
        return x, y

    def _add(self, a: dict) -> None:
        x, y = self._operands(a)

        def add(u, v):
            return add_codes(u, a["za"], a["ma"], v, a["zb"], a["mb"], a["out_zp"], a["out_bits"])

        total = elementwise(add, x, a["a_bits"], y, a["b_bits"])
        self.sram.write(a["dst"], a["out_bits"], _clamped(total, a, a["out_bits"]))

    def _mul(self, a: dict) -> None:
        x, y = self._operands(a)

        def multiply(u, v):
            return multiply_codes(u, a["za"], v, a["zb"], a["m0"], a["shift"], a["out_zp"], a["out_bits"])

        product = elementwise(multiply, x, a["a_bits"], y, a["b_bits"])
        if not a["then_add"]:
            self.sram.write(a["dst"], a["out_bits"], _clamped(product, a, a["out_bits"]))
            return
        # a residual Add chained onto the product (an Add op fused into the mul): one of its operands
        if a["add_term"] not in (0, 1):
            raise NpubError(f"mul adds operand {a['add_term']}; it has operands 0 (a) and 1 (b)")
        term = x if a["add_term"] == 0 else y
        if term.shape != product.shape:
            raise NpubError(f"mul adds a term of shape {term.shape[1:]} to a product of {product.shape[1:]}")
        total = add_codes(
            product, a["add_za"], a["add_ma"], term, a["add_zb"], a["add_mb"], a["sum_zp"], a["sum_bits"]
        )
        self.sram.write(a["dst"], a["sum_bits"], _clamped(total, a, a["sum_bits"]))

    def _requant(self, a: dict) -> None:
        x = self.sram.view(a["src"], a["in_bits"], (a["n"],))

        def requantized(codes: np.ndarray) -> np.ndarray:
            return saturate(requantize(codes - a["in_zp"], a["m0"], a["shift"]) + a["out_zp"], a["out_bits"])

        key = tuple(a[k] for k in ("in_bits", "in_zp", "m0", "shift", "out_zp", "out_bits"))
        y = per_code(requantized, x, a["in_bits"], self._requant_tables, key)
        self.sram.write(a["dst"], a["out_bits"], y)

    def _lut(self, a: dict) -> None:
        x = self.sram.view(a["src"], a["in_bits"], (a["n"],))
        table = self._table(a["table"], entry_bits(a["out_bits"], a["shifts"]), a["in_bits"], a["shift"])
        codes = _look_up(table, x, a["offset"], "LUT", qrange(a["in_bits"]), a["shift"])
        if a["shifts"] >= 0:
            if a["per"] <= 0 or a["n"] % a["per"]:
                raise NpubError(f"LUT of {a['n']} elements in channels of {a['per']}")
            runs = codes.reshape(codes.shape[0], -1, a["per"])  # [rows, channels, per]
            codes = self._channel_shifted(runs, a["shifts"], runs.shape[1], a["out_bits"]).reshape(x.shape)
        self.sram.write(a["dst"], a["out_bits"], codes)

    def _channel_shifted(self, entries: np.ndarray, addr: int, channels: int, bits: int) -> np.ndarray:
        """Table entries [rows, channels, ...] shifted per channel by the int8s at addr (6.0)."""
        shifts, _ = self.sram.same_in_every_row(addr, 8, (channels,))  # (read before any write)
        if bits != 8 or shifts.size and not 0 <= int(shifts.min()) <= int(shifts.max()) <= 15:
            raise NpubError(f"per-channel shifts {shifts.min()}..{shifts.max()} onto {bits}-bit codes")
        return channel_shifted(entries, shifts)

    def _table(self, addr: int, entry_bits: int, in_bits: int, shift: int) -> np.ndarray:
        """A lookup table in SRAM, an entry per 2^shift codes of an `in_bits` input: [1, entries]
        when every image holds the same one, else [rows, entries]."""
        if not 0 <= shift < in_bits:
            raise NpubError(f"table shift {shift} for a {in_bits}-bit input")
        shape = (table_entries(in_bits, shift),)
        try:  # the usual case, loaded from the constants: one table for every image, by its token
            return self.sram.same_in_every_row(addr, entry_bits, shape)[0][None]
        except Uneven:
            return self.sram.view(addr, entry_bits, shape)

    def _softmax(self, a: dict) -> None:
        x = self.sram.view(a["src"], a["in_bits"], (a["rows"], a["n"])).astype(np.int64)
        if not 1 <= a["table_len"] <= 1 << 16 or not 0 <= a["rshift"] <= 16:
            raise NpubError("softmax table length or shift out of range")
        table = common_row(self.sram.view(a["table"], 32, (a["table_len"],))).astype(np.int64)
        if a["out_bits"] not in (8, 16):
            raise NpubError("softmax output width must be 8 or 16")
        self.sram.write(a["dst"], a["out_bits"], softmax_rows(x, table, a["rshift"], a["out_bits"]))

    def _layernorm(self, a: dict) -> None:
        x = self.sram.view(a["src"], a["in_bits"], (a["rows"], a["n"])).astype(np.int64)
        params = common_row(self.sram.view(a["params"], 64, (a["n"], 3))).astype(np.int64)
        if not 0 <= a["eps"] <= EPS_CODES_MAX or a["out_bits"] not in (8, 16):
            raise NpubError("layernorm epsilon or output width out of range")
        if params.size and not (
            np.abs(params[:, 0]).max() < 1 << 31 and -31 <= params[:, 1].min() <= params[:, 1].max() <= 31
        ):
            raise NpubError("layernorm multiplier or shift out of range")
        y = layernorm_rows(x, a["in_zp"], a["eps"], params, a["out_zp"], a["out_bits"])
        self.sram.write(a["dst"], a["out_bits"], y)

    def _clamp(self, a: dict) -> None:
        x = self.sram.view(a["src"], a["bits"], (a["n"],))
        self.sram.write(a["dst"], a["bits"], np.clip(x, a["min"], a["max"]))

    def _gap(self, a: dict) -> None:
        x = self.sram.view(a["src"], a["in_bits"], (a["c"], a["hw"])).astype(np.int64) - a["in_zp"]
        acc = self.sram.view(a["acc"], 64, (a["c"],), write=True)
        partial = x.sum(axis=-1)
        acc[...] = partial if a["first"] else acc + partial
        if a["last"]:
            y = saturate(requantize(acc, a["m0"], a["shift"]) + a["out_zp"], a["out_bits"])
            self.sram.write(a["dst"], a["out_bits"], y)

    def _pool(self, a: dict) -> None:
        x, pads = self._bordered("pool", a)
        kernel, strides, dil = [a["kh"], a["kw"]], [a["sh"], a["sw"]], [a["dh"], a["dw"]]
        if min(*kernel, *strides, *dil) <= 0:
            raise NpubError("pool with a non-positive window, stride or dilation")
        shape = (a["out_h"], a["out_w"])
        if a["mode"] == 0:  # borders hold the lowest code
            y = window_max(x, kernel, strides, dil, pads, border_code("pool", a))
        else:  # borders hold the zero point
            xc = x.astype(np.float64) - a["in_zp"]
            total = np.rint(windows(xc, kernel, strides, dil, pads, 0.0).sum(axis=(-2, -1)))
            params = common_row(self.sram.view(a["params"], 64, (*shape, 2)))
            y = requantize(total.astype(np.int64), params[..., 0], params[..., 1]) + a["out_zp"]
            y = saturate(y, a["out_bits"])
        if y.shape[2:] != shape:
            raise NpubError(f"pool tile gives {y.shape[2:]}, instruction says {shape}")
        self.sram.write(a["dst"], a["out_bits"], y)

    def _resize(self, a: dict) -> None:
        x = self.sram.view(a["src"], a["bits"], (a["c"], a["in_h"], a["in_w"]))
        index = self.sram.view(a["index"], 32, (a["out_h"] + a["out_w"],))
        index = common_row(index).astype(np.int64)
        rows, cols = index[: a["out_h"]], index[a["out_h"] :]
        if index.size and (
            rows.min(initial=0) < 0 or rows.max(initial=0) >= a["in_h"] or cols.max(initial=0) >= a["in_w"]
        ):
            raise NpubError("resize index outside its tile")
        if cols.size and cols.min() < 0:
            raise NpubError("resize index outside its tile")
        self.sram.write(a["dst"], a["bits"], x[:, :, rows][:, :, :, cols])

    # --- the stream -----------------------------------------------------------------------------
    def _static_counts(self, program: list[Instruction]) -> dict[str, int]:
        """Instructions per engine and cycles: they depend on the stream, not on the data, so
        they are worked out once per stream (a runtime executes the same streams every run)."""
        known = self._static.get(id(program))
        if known is not None and known[0] is program:
            return known[1]
        counts: dict[str, int] = {}
        timeline = Timeline(self.target) if self.target else None
        for instruction in program:
            name = f"{engine(instruction, self.target)}_instructions"
            counts[name] = counts.get(name, 0) + 1
            if instruction.op == "end":
                break
            if timeline is not None:
                try:
                    timeline.add(instruction)
                except (ValueError, IndexError, KeyError, TypeError, OverflowError) as exc:
                    raise NpubError(f"'{instruction.op}' failed: {exc}") from None
        counts["cycles"] = timeline.end if timeline is not None else 0
        self._static[id(program)] = (program, counts)
        return counts

    def _image_by_image(self, handler, args: dict) -> None:
        first, rows = self.sram.first, self.sram.rows
        once = None  # the counters are per image: the first image's run counts
        try:
            for row in range(first, first + rows):
                self.use_rows(row, 1)
                handler(args)
                if once is None:
                    once = Counter(self.counts)
        finally:
            self.use_rows(first, rows)
        self.counts = once

    def execute(self, program: list[Instruction]) -> None:
        static = self._static_counts(program)
        for instruction in program:
            if instruction.op == "end":
                break
            handler = getattr(self, f"_{instruction.op}")
            try:
                try:
                    handler(instruction.args)
                except Uneven:  # nothing written yet: the constants are read first
                    self._image_by_image(handler, instruction.args)
            except (ValueError, IndexError, KeyError, TypeError, OverflowError, MemoryError) as exc:
                raise NpubError(f"'{instruction.op}' failed: {exc}") from None
        for name, value in static.items():
            self.counts[name] += value
