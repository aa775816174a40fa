"""Input borders (format 5.0): a conv or pool reads an unpadded box and adds its own borders, so a
one-tile op reads a resident tensor where it lies instead of an on-chip copy that pads it."""

from __future__ import annotations

import numpy as np
import pytest
from test_mappings import _conv

from npubuild.targets.backend.commands import InTile, Step, Tile
from npubuild.targets.backend.in_place import in_place as _in_place
from npubuild.targets.hazards import footprint
from npubuild.targets.isa import NO_PADS, Instruction
from npubuild.targets.npub import NpubError
from npubuild.targets.simulator import Simulator
from npubuild.targets.spec import BUILTIN_TARGETS

M = BUILTIN_TARGETS["vnpu-m"].model_dump()
SRC, DST, PARAMS = 0, 65536, 32768


def _pool(**fields) -> dict:
    base = dict(
        src=SRC, c=8, in_h=12, in_w=12, in_bits=8, in_zp=7, kh=3, kw=3, sh=1, sw=1, dh=1, dw=1,
        mode=0, params=PARAMS, dst=DST, out_h=10, out_w=10, out_bits=8, out_zp=-3, **NO_PADS,
    )  # fmt: skip
    return {**base, **fields}


def _run(
    instruction: Instruction, box: np.ndarray, constants: dict[int, tuple[int, np.ndarray]]
) -> np.ndarray:
    sim = Simulator(M["sram_kib"] * 1024, 1024, M)
    sim.sram.write(SRC, 8, box.reshape(1, -1))
    for addr, (bits, values) in constants.items():
        sim.sram.write(addr, bits, values.reshape(1, -1))
    sim.execute([instruction, Instruction("end", {})])
    a = instruction.args
    channels = a["out_c"] if instruction.op == "conv" else a["c"]
    return np.array(sim.sram.view(DST, a["out_bits"], (channels * a["out_h"] * a["out_w"],))[0])


# (top, bottom, left, right): even, uneven, one side only
BORDERS = [(1, 1, 1, 1), (2, 0, 1, 3), (0, 0, 0, 2)]


@pytest.mark.parametrize("borders", BORDERS)
@pytest.mark.parametrize("kind", ["conv", "depthwise", "maxpool", "avgpool"])
def test_a_bordered_read_computes_what_the_padded_tile_computes(kind, borders):
    """The same instruction on the tile padded in SRAM (no borders) and on the unpadded box with
    borders writes the same codes; the zero point is not zero, so a border of any other value
    would show."""
    rng = np.random.default_rng(11)
    top, bottom, left, right = borders
    if kind in ("conv", "depthwise"):
        channels, out_c, group = (8, 8, 8) if kind == "depthwise" else (8, 16, 1)
        a = _conv(
            src=SRC, dst=DST, params=PARAMS, weights=49152, in_c=channels, out_c=out_c, group=group, in_zp=7
        )
        w = rng.integers(-128, 128, out_c * (channels // group) * 9).astype(np.int8)
        params = np.array([[5, 1 << 30, 8]] * out_c, np.int64)
        constants = {a["weights"]: (8, w), PARAMS: (64, params)}
        pad_value = a["in_zp"]
    else:
        channels = 8
        a = _pool(mode=0 if kind == "maxpool" else 1)
        # an average pool's per-position multiplier: 1/9 as M0 = 2^31 / 9 at shift 0
        params = np.array([[(1 << 31) // 9, 0]] * 100, np.int64)
        constants = {PARAMS: (64, params)}
        pad_value = -128 if kind == "maxpool" else a["in_zp"]
    rows, cols = a["in_h"] - top - bottom, a["in_w"] - left - right
    box = rng.integers(-128, 128, (channels, rows, cols)).astype(np.int8)
    padded = np.pad(box, [(0, 0), (top, bottom), (left, right)], constant_values=pad_value)
    op = "conv" if kind in ("conv", "depthwise") else "pool"
    want = _run(Instruction(op, a), padded, constants)
    bordered = {**a, "in_pad_top": top, "in_pad_bottom": bottom, "in_pad_left": left, "in_pad_right": right}
    got = _run(Instruction(op, bordered), box, constants)
    np.testing.assert_array_equal(got, want)
    assert np.unique(want).size > 5  # neither saturated nor constant


@pytest.mark.parametrize(
    "borders, message",
    [
        (dict(in_pad_top=-1), "borders -1"),
        (dict(in_pad_top=6, in_pad_bottom=6), "12 x 12 input with borders 6, 6"),
        (dict(in_pad_left=12), "borders 0, 0, 12, 0"),
    ],
)
def test_borders_a_stream_cannot_hold_are_one_npub_error(borders, message):
    for instruction in (Instruction("conv", _conv(**borders)), Instruction("pool", _pool(**borders))):
        with pytest.raises(NpubError, match=message):
            Simulator(M["sram_kib"] * 1024, 1024, M).execute([instruction, Instruction("end", {})])


def test_a_transposed_conv_takes_no_borders():
    up = dict(in_c=16, out_c=2, kh=2, kw=2, sh=2, sw=2, out_h=24, out_w=24, transpose=1, in_pad_left=1)
    with pytest.raises(NpubError, match="transposed conv with input borders"):
        Simulator(M["sram_kib"] * 1024, 1024, M).execute([Instruction("conv", _conv(**up))])


def test_a_bordered_read_touches_only_its_box():
    """The schedule checker counts the bytes a bordered conv or pool reads: the box, not the
    padded extent (which would reach into whatever lies after the resident tensor)."""
    conv = _conv(in_pad_top=1, in_pad_bottom=1, in_pad_left=1, in_pad_right=1)
    (read, *_), _ = footprint(Instruction("conv", conv))
    assert read == (conv["src"], conv["src"] + 16 * 10 * 10)
    (read,), _ = footprint(Instruction("pool", _pool(in_pad_top=2)))
    assert read == (SRC, SRC + 8 * 10 * 12)


def _one_tile(load_pads=(1, 1, 1, 1), pad_value=7, op="conv", **compute) -> Tile:
    """One tile whose input is an on-chip copy (space 1) of 8 x 10 x 10 resident codes."""
    pads = dict(zip(("pad_top", "pad_bottom", "pad_left", "pad_right"), load_pads))
    rows, cols = 10 + load_pads[0] + load_pads[1], 10 + load_pads[2] + load_pads[3]
    copy = Step(
        "load",
        dict(space=1, dram=4096, sram=InTile(0), esize=1, d0=1, d1=8, d2=rows, d3=cols,
             s0=800, s1=100, s2=10, s3=1, **pads, pad_value=pad_value),
    )  # fmt: skip
    if op == "conv":
        args = _conv(src=InTile(0), dst=InTile(2048), in_c=8, in_h=rows, in_w=cols, in_zp=7, **compute)
    else:
        args = _pool(src=InTile(0), dst=InTile(2048), in_h=rows, in_w=cols, **compute)
    store = Step(
        "store",
        dict(space=0, sram=InTile(2048), dram=8192, esize=1, d0=1, d1=8, d2=10, d3=10,
             s0=0, s1=100, s2=10, s3=1),
    )  # fmt: skip
    return Tile((0, 1), [copy], Step(op, args), store)


def test_lowering_drops_a_padding_copy_only_where_the_op_borders_with_the_same_code():
    """A conv's input copy padded with its zero point becomes borders on the conv reading the
    resident address; padded with another code (or read by an op without borders) it stays."""
    tile = _in_place(_one_tile())
    assert tile.loads == [] and tile.compute.args["src"] == 4096
    assert [tile.compute.args[k] for k in NO_PADS] == [1, 1, 1, 1]
    kept = _in_place(_one_tile(pad_value=0))
    assert len(kept.loads) == 1 and kept.compute.args["src"] == InTile(0)
    assert all(kept.compute.args[k] == 0 for k in NO_PADS)
    maxpool = _in_place(_one_tile(pad_value=-128, op="pool"))
    assert maxpool.loads == [] and maxpool.compute.args["in_pad_left"] == 1
    assert len(_in_place(_one_tile(pad_value=7, op="pool")).loads) == 1  # max pools border with -128
    transposed = _in_place(_one_tile(transpose=1))
    assert len(transposed.loads) == 1
