"""How a convolution occupies the MAC array (docs/npu.md, "Mappings"): cycles under each mapping
worked out by hand, the code generator's choice, the simulator's refusal of a mapping the geometry
does not allow, format 1.x streams, and a real depthwise network compiled with it."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from conftest import npu_instructions
from npubuild.targets.cycles import conv_cycles, conv_mapping
from npubuild.targets.isa import MAPPINGS, OPERANDS, Instruction, decode, encode
from npubuild.targets.npub import NpubError
from npubuild.targets.simulator import Simulator
from npubuild.targets.spec import BUILTIN_TARGETS

M = BUILTIN_TARGETS["vnpu-m"].model_dump()  # a 32 x 32 array


def _conv(**geometry) -> dict:
    base = dict(
        src=0, in_c=16, in_h=12, in_w=12, in_bits=8, in_zp=0, weights=4096, params=8192, dst=16384,
        out_c=16, out_h=10, out_w=10, out_bits=8, out_zp=0, kh=3, kw=3, sh=1, sw=1, dh=1, dw=1,
        group=1, min=-128, max=127, transpose=0, crop_top=0, crop_left=0, lut=-1, lut_offset=0, lut_bits=8,
        mapping=0, lut_shift=0, res=-1, res_bits=8, add_za=0, add_ma=0, add_zb=0, add_mb=0, sum_zp=0,
        sum_bits=8, in_pad_top=0, in_pad_bottom=0, in_pad_left=0, in_pad_right=0, lut_shifts=-1,
        sum_min=-(1 << 15), sum_max=(1 << 15) - 1,
    )  # fmt: skip
    return {**base, **geometry}


def test_cycles_of_each_mapping_worked_out_by_hand():
    depthwise = _conv(in_c=64, out_c=64, group=64)
    # a 9-product sum fits 3 times in 32 rows: 3 bands, 3 output positions per step, 34 steps of
    # the 100 positions. channels: 64 groups of one output channel, 64 folds x 34 steps
    assert conv_cycles(depthwise, MAPPINGS["channels"], 32, 32, True) == 2176
    # depthwise: 64 channels over 32 columns: 2 folds x 34 steps
    assert conv_cycles(depthwise, MAPPINGS["depthwise"], 32, 32, True) == 68
    # 5 x 5 taps: one band of 25 rows, one position at a time: 2 folds x 64 positions
    five = _conv(in_c=64, out_c=64, group=64, kh=5, kw=5, out_h=8, out_w=8)
    assert conv_cycles(five, MAPPINGS["depthwise"], 32, 32, True) == 128
    # 7 x 7 taps: 49 rows, two row folds: 2 x 2 folds x 36 positions
    seven = _conv(in_c=64, out_c=64, group=64, kh=7, kw=7, out_h=6, out_w=6)
    assert conv_cycles(seven, MAPPINGS["depthwise"], 32, 32, True) == 144
    # depthwise, 8 channels: 4 positions side by side on the 32 columns, 1 fold x 9 of the 34 steps
    assert conv_cycles(_conv(in_c=8, out_c=8, group=8), MAPPINGS["depthwise"], 32, 32, True) == 9
    # ...and 12 channels: 5 positions' 60 columns in 2 folds, 7 steps of 5 of the 34: 14 (2 side by
    # side in one fold, 24 of 32 columns: 17; 8 in 3 folds: 15)
    assert conv_cycles(_conv(in_c=12, out_c=12, group=12), MAPPINGS["depthwise"], 32, 32, True) == 14
    narrow = _conv(in_c=16, out_c=8)
    # channels: 1 column fold, 144 = 16 x 9 reduction over 32 rows: 4 whole folds x 100 positions,
    # then the remainder fold of 16 rows in 2 bands, 50 steps
    assert conv_cycles(narrow, MAPPINGS["channels"], 32, 32, True) == 450
    assert conv_cycles(narrow, MAPPINGS["channels"], 32, 32, False) == 500  # no bands: 5 x 100
    # spatial: 4 positions side by side (32 // 8 columns), 4 folds x 25 steps, then 13 of the 50
    assert conv_cycles(narrow, MAPPINGS["spatial"], 32, 32, True) == 113
    # ShuffleNet's 1 x 1 layers, 4 groups of 34 input channels: a whole fold, then 2 rows in 16
    # bands; 34 output channels per group fill 32 columns and 2 of a second fold
    shuffle = _conv(in_c=136, out_c=136, group=4, kh=1, kw=1, in_h=10, in_w=10)
    assert conv_cycles(shuffle, MAPPINGS["channels"], 32, 32, True) == 4 * 2 * (100 + 7)
    # a 1 x 1 conv of 8 input channels: 4 bands of 8 rows, 4 positions per step: 25 steps
    assert conv_cycles(_conv(in_c=8, out_c=32, kh=1, kw=1, in_h=10, in_w=10), 0, 32, 32, True) == 25
    wide = _conv(in_c=16, out_c=48)
    # channels: 48 output channels take 2 column folds, the second half empty: 2 x (4 x 100 + 50)
    assert conv_cycles(wide, MAPPINGS["channels"], 32, 32, True) == 900
    # spatial: 2 positions' 96 filters fill 3 column folds: 4 x 3 folds x 50 steps, then 3 x 25
    assert conv_cycles(wide, MAPPINGS["spatial"], 32, 32, True) == 675
    # 24 output channels: channels leaves 8 columns empty (4 x 100 + 50); spatial puts 4
    # positions' 96 filters in 3 folds: 4 x 3 x 25, then the remainder fold's 50 steps: all 50
    # positions' 1,200 filter columns in 38 column folds of one step (4 side by side: 3 x 13 = 39)
    assert conv_cycles(_conv(in_c=16, out_c=24), MAPPINGS["channels"], 32, 32, True) == 450
    assert conv_cycles(_conv(in_c=16, out_c=24), MAPPINGS["spatial"], 32, 32, True) == 338
    up = _conv(in_c=16, out_c=1, kh=2, kw=2, sh=2, sw=2, out_h=24, out_w=24, transpose=1)
    # transposed, channels: 1 column, 16 rows (2 bands), one tap per pass: 72 steps of the 144
    # input positions x 4 taps
    assert conv_cycles(up, MAPPINGS["channels"], 32, 32, True) == 288
    # spatial: an input position's 1 x 4 tap filters in 4 columns, 8 positions side by side: 9 steps
    assert conv_cycles(up, MAPPINGS["spatial"], 32, 32, True) == 9
    wide_up = _conv(in_c=16, out_c=32, kh=2, kw=2, sh=2, sw=2, out_h=24, out_w=24, transpose=1)
    # 128 tap filters take four column folds, one position at a time: as channels (4 taps x 1 fold)
    assert conv_cycles(wide_up, MAPPINGS["spatial"], 32, 32, True) == conv_cycles(
        wide_up, MAPPINGS["channels"], 32, 32, True
    )


def test_row_bands_are_a_property_of_the_target():
    """A 1 x 1 conv of 8 input channels: 4 bands of 8 rows on vnpu-m (4 positions per step),
    none on an array without them (vnpu-s, a target written from scratch)."""
    from npubuild.targets.cycles import cost
    from npubuild.targets.spec import TargetSpec

    conv = Instruction("conv", _conv(in_c=8, out_c=32, kh=1, kw=1, in_h=10, in_w=10))
    assert M["row_bands"] and cost(conv, M) == 25
    assert cost(conv, {**M, "row_bands": False}) == 100
    assert not BUILTIN_TARGETS["vnpu-s"].row_bands
    assert not TargetSpec(**{k: v for k, v in M.items() if k != "row_bands"}).row_bands


def test_the_code_generator_picks_depthwise_spatial_or_channels_by_geometry():
    assert conv_mapping(_conv(in_c=32, out_c=64, group=32), M) == MAPPINGS["depthwise"]  # multiplier 2
    assert conv_mapping(_conv(in_c=16, out_c=8), M) == MAPPINGS["spatial"]
    assert conv_mapping(_conv(in_c=16, out_c=32), M) == MAPPINGS["channels"]  # no cheaper
    assert conv_mapping(_conv(in_c=16, out_c=48), M) == MAPPINGS["spatial"]  # 3 folds for 2 positions
    grouped = _conv(in_c=16, out_c=16, group=4)  # 4 output channels per group, 36-product sums
    # channels: 4 groups x (a whole row fold x 100 positions + the 4-row remainder in 8 bands, 13
    # steps), 4 of 32 columns; spatial: 8 positions' filters in one fold, 4 x (13 + 2) steps
    assert conv_cycles(grouped, MAPPINGS["channels"], 32, 32, True) == 452
    assert conv_cycles(grouped, MAPPINGS["spatial"], 32, 32, True) == 60
    assert conv_mapping(grouped, M) == MAPPINGS["spatial"]
    assert conv_mapping(_conv(in_c=64, out_c=64, group=2), M) == MAPPINGS["channels"]  # 32 per group
    up = dict(kh=2, kw=2, sh=2, sw=2, out_h=24, out_w=24, transpose=1)
    assert conv_mapping(_conv(in_c=16, out_c=1, **up), M) == MAPPINGS["spatial"]  # 32x cheaper
    assert conv_mapping(_conv(in_c=16, out_c=16, **up), M) == MAPPINGS["spatial"]  # 2x: 16 of 32 columns
    assert conv_mapping(_conv(in_c=16, out_c=32, **up), M) == MAPPINGS["channels"]  # no cheaper
    assert conv_mapping(_conv(in_c=16, out_c=1, **up), BUILTIN_TARGETS["vnpu-s"].model_dump()) == 0


@pytest.mark.parametrize(
    "geometry, message",
    [
        (dict(mapping=3), "mapping 3"),
        (dict(mapping=-1), "mapping -1"),
        (dict(mapping=MAPPINGS["depthwise"]), "depthwise mapping"),  # 16 channels in one group
        (dict(mapping=MAPPINGS["depthwise"], group=16, out_c=16, transpose=1), "depthwise mapping"),
    ],
)
def test_a_mapping_the_geometry_does_not_allow_is_one_npub_error(geometry, message):
    sim = Simulator(M["sram_kib"] * 1024, 1024, M)
    with pytest.raises(NpubError, match=message):
        sim.execute([Instruction("conv", _conv(**geometry))])


def test_every_mapping_computes_the_same_codes():
    """The mapping changes the cycles, never the sums: a depthwise tile under both mappings it
    allows, and a narrow tile and a transposed one under both of theirs, write the same codes."""
    rng = np.random.default_rng(3)
    for geometry, mappings in (
        (dict(in_c=16, out_c=16, group=16), ("channels", "depthwise")),
        (dict(in_c=16, out_c=8), ("channels", "spatial")),
        (
            dict(in_c=16, out_c=2, kh=2, kw=2, sh=2, sw=2, out_h=24, out_w=24, transpose=1),
            ("channels", "spatial"),
        ),
    ):
        a = _conv(**geometry)
        outputs = a["out_c"] * a["out_h"] * a["out_w"]
        x = rng.integers(-128, 128, 16 * 12 * 12).astype(np.int8)
        w = rng.integers(-128, 128, a["out_c"] * (a["in_c"] // a["group"]) * a["kh"] * a["kw"]).astype(
            np.int8
        )
        params = np.array([[5, 1 << 30, 10]] * a["out_c"], np.int64).reshape(-1)  # bias, m0, shift
        written = []
        for mapping in mappings:
            sim = Simulator(M["sram_kib"] * 1024, 1024, M)
            sim.sram.write(a["src"], 8, x[None])  # the one image of the batch
            sim.sram.write(a["weights"], 8, w[None])
            sim.sram.write(a["params"], 64, params[None])
            sim.execute([Instruction("conv", {**a, "mapping": MAPPINGS[mapping]}), Instruction("end", {})])
            written.append(sim.sram.view(a["dst"], 8, (outputs,))[0].copy())
        np.testing.assert_array_equal(written[0], written[1])
        assert np.unique(written[0]).size > 10  # neither saturated nor empty


RESIDUAL = ("res", "res_bits", "add_za", "add_ma", "add_zb", "add_mb", "sum_zp", "sum_bits")
PADS = ("in_pad_top", "in_pad_bottom", "in_pad_left", "in_pad_right")
SUM_CLAMP = ("sum_min", "sum_max")


@pytest.mark.parametrize(
    "major, lacks",
    [
        (1, ("mapping", "lut_shift", *RESIDUAL, *PADS, "lut_shifts", *SUM_CLAMP)),
        (2, ("lut_shift", *RESIDUAL, *PADS, "lut_shifts", *SUM_CLAMP)),
        (3, (*RESIDUAL, *PADS, "lut_shifts", *SUM_CLAMP)),
        (4, (*PADS, "lut_shifts", *SUM_CLAMP)),
        (5, ("lut_shifts", *SUM_CLAMP)),
        (6, SUM_CLAMP),
    ],
)
def test_an_older_stream_decodes_with_the_old_meaning_of_what_it_lacks(major, lacks):
    """Format 1.x convs have no mapping ("channels"), 2.x none of the table shifts (0), 3.x no
    residual Add in the output path (res -1), 4.x no input borders (0: the tile was padded), 5.x
    no per-channel shifts after the output table (-1), 6.x no clamp of the residual sum (one
    wider than any code)."""
    args = _conv()
    legacy = [n for n in OPERANDS["conv"] if n not in lacks]
    head = struct.pack("<BBBBI", 3, 0, 0xFF, len(legacy), 0)
    stream = (
        head + struct.pack(f"<{len(legacy)}q", *(args[n] for n in legacy)) + encode([Instruction("end", {})])
    )
    (conv, _) = decode(stream, format_major=major)
    assert conv.args == {**args, "mapping": MAPPINGS["channels"], "lut_shift": 0}
    with pytest.raises(NpubError, match="operands"):  # the same bytes are a short conv in format 7
        decode(stream)


def test_the_real_direction_classifier_runs_its_depthwise_layers_in_the_depthwise_mapping(cls_binary):
    """PP-OCR cls (MobileNetV3-style) on vnpu-m: every depthwise tile is encoded depthwise, every
    other conv channels or spatial, and each costs no more than under the channels mapping."""
    assert json.loads((cls_binary.parent / "partition.json").read_text())["target"] == "vnpu-m"
    from npubuild.targets import npub

    binary = npub.read(cls_binary.read_bytes())
    rows, cols = BUILTIN_TARGETS["vnpu-m"].mac_rows, BUILTIN_TARGETS["vnpu-m"].mac_cols
    bands = BUILTIN_TARGETS["vnpu-m"].row_bands
    convs = [i for i in npu_instructions(binary) if i.op == "conv"]
    depthwise = [i for i in convs if i.args["group"] > 1 and i.args["group"] == i.args["in_c"]]
    assert depthwise and all(i.args["mapping"] == MAPPINGS["depthwise"] for i in depthwise)
    assert {i.args["mapping"] for i in convs if i not in depthwise} <= {
        MAPPINGS["channels"],
        MAPPINGS["spatial"],
    }
    for i in convs:
        assert conv_cycles(i.args, i.args["mapping"], rows, cols, bands) <= conv_cycles(
            i.args, MAPPINGS["channels"], rows, cols, bands
        )
    saved = sum(conv_cycles(i.args, MAPPINGS["channels"], rows, cols, bands) for i in depthwise)
    assert saved > 4 * sum(conv_cycles(i.args, MAPPINGS["depthwise"], rows, cols, bands) for i in depthwise)


def test_vnpu_s_and_a_target_written_from_scratch_offer_the_channels_mapping_only():
    from npubuild.targets.spec import TargetSpec

    small = BUILTIN_TARGETS["vnpu-s"].model_dump()
    assert small["conv_mappings"] == ("channels",)
    assert conv_mapping(_conv(in_c=32, out_c=32, group=32), small) == MAPPINGS["channels"]
    fresh = {k: v for k, v in M.items() if k != "conv_mappings"}
    assert TargetSpec(**fresh).conv_mappings == ("channels",)


def test_a_target_without_the_depthwise_engine_maps_and_accepts_channels_only():
    from npubuild.targets.spec import TargetSpec

    plain = TargetSpec(**{**M, "name": "plain", "conv_mappings": ("channels",)}).model_dump()
    assert conv_mapping(_conv(in_c=32, out_c=32, group=32), plain) == MAPPINGS["channels"]
    assert conv_mapping(_conv(in_c=16, out_c=8), plain) == MAPPINGS["channels"]
    sim = Simulator(plain["sram_kib"] * 1024, 1024, plain)
    with pytest.raises(NpubError, match="this target's array takes"):
        sim.execute([Instruction("conv", _conv(in_c=16, out_c=16, group=16, mapping=MAPPINGS["depthwise"]))])
    with pytest.raises(ValueError, match="must include 'channels'"):
        TargetSpec(**{**M, "conv_mappings": ("depthwise",)})


def test_codegen_reports_each_layers_mapping(cls_binary):
    layers = json.loads((cls_binary.parent / "codegen.json").read_text())["layers"]
    conv_layers = [r for r in layers if r["kind"] == "conv"]
    assert conv_layers and all("mapping" in r for r in conv_layers)
    assert {r["mapping"] for r in conv_layers} >= {"depthwise"}
    # its squeeze-excite pools and gate multiplies, and its max pool (a "move" row), on the
    # array's depthwise path (vnpu-m); its classifier (a MatMul and its bias, one Gemm since
    # matmul_bias_as_gemm) and Softmax have none
    others = {r["kind"]: r.get("mapping") for r in layers if r["kind"] != "conv"}
    assert others == {
        "global_avgpool": "depthwise",
        "mul": "depthwise",
        "move": "depthwise",
        "matmul": None,
        "softmax": None,
    }
