"""The integer model's arithmetic against expectations derived by hand: explicit loops and exact
rational arithmetic (fractions), independent of the vectorised numpy code under test."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from pydantic import TypeAdapter

from npubuild.intmodel.codes import quantize_float
from npubuild.intmodel.fixedpoint import (
    ADD_FRACTION_BITS,
    add_multiplier,
    add_rescaled,
    multiply_requantized,
    quantize_multiplier,
    requantize,
    requantize_output,
    rounding_shift,
)
from npubuild.intmodel.interpreter import Interpreter
from npubuild.intmodel.program import IntegerModel, Op, TensorQuant

RNG = np.random.default_rng(11)


def round_half_away(x: Fraction) -> int:
    sign = -1 if x < 0 else 1
    return sign * int((abs(x) + Fraction(1, 2)).__floor__())


@pytest.mark.parametrize("m", [1e-6, 0.000123, 0.0271, 0.5, 0.7499, 1.0, 1.3, 7.9, 1000.0])
def test_multiplier_is_accurate_to_31_bits(m):
    m0, shift = quantize_multiplier(m)
    assert 2**30 <= m0 < 2**31
    assert abs(Fraction(m0, 2 ** (31 + shift)) - Fraction(m)) <= Fraction(m) / 2**30


def test_requantize_rounds_half_away_from_zero_exactly():
    for m in (0.0123, 0.5, 0.25, 1.7, 3.1e-4):
        m0, shift = quantize_multiplier(m)
        acc = np.concatenate([RNG.integers(-(2**31) + 1, 2**31 - 1, 200), [0, 1, -1, 2, -2, 3, -3]])
        got = requantize(acc, m0, shift)
        exact = [round_half_away(Fraction(int(a) * m0, 2 ** (31 + shift))) for a in acc]
        assert got.tolist() == exact


def test_requantize_of_16_bit_accumulators_is_exact_beyond_int64_products():
    """int16 layers: accumulators up to 2^47 times a full 31-bit M0 overflow int64's one multiply;
    the split path gives the exact rounding, ties included, per channel, or a saturating value."""
    multipliers = np.array([2.0**-30 * 1.37, 2.0**-20 * 1.01, 2.0**-24, 2.0**-40 * 1.9, 2.0**-9 * 1.5])
    m0, shift = (np.array(v) for v in zip(*map(quantize_multiplier, multipliers)))
    acc = RNG.integers(-(2**47), 2**47, (len(multipliers), 300))
    for c in range(len(multipliers)):  # ties: acc * m0 an odd multiple of 2^(n-1), where that fits
        twos = (int(m0[c]) & -int(m0[c])).bit_length() - 1
        unit = 2 ** max(31 + int(shift[c]) - 1 - twos, 0)
        odd = 2 * np.arange(-20, 20) + 1
        acc[c, :40] = np.where(np.abs(odd * unit) < 2**47, odd * unit, acc[c, :40])
    acc[:, 40:60] = RNG.integers(-(2**20), 2**20, (len(multipliers), 20))
    got = requantize(acc, m0[:, None], shift[:, None])
    for c in range(len(multipliers)):
        for a, g in zip(acc[c].tolist(), got[c].tolist()):
            exact = round_half_away(Fraction(a * int(m0[c]), 2 ** (31 + int(shift[c]))))
            if abs(exact) < 2**39:
                assert g == exact, (c, a)
            else:  # every caller saturates at 16 bits or fewer
                assert abs(g) >= 2**31 and np.sign(g) == np.sign(exact), (c, a)
    assert (np.abs(got) >= 2**31).any() and (np.abs(got) < 2**15).any()  # both regimes were drawn
    # beyond 2^48 (only a malformed binary gets there) the value saturates, with its sign
    huge = requantize(np.array([2**50, -(2**55)]), m0[1], shift[1])
    assert huge[0] >= 2**31 and huge[1] <= -(2**31)


@pytest.mark.parametrize("acc_bits", [12, 21, 30])  # float64's path, its edge, int64's path
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_requantize_output_is_the_rounding_rule_bias_zero_point_and_clip(acc_bits, dtype):
    """Per channel (bias, m0, shift), on accumulators of every size the MAC path sees, with ties
    (accumulators that are exact multiples of half a step) mixed in; in blocks of channels too."""
    channels, spatial = 6, 40_000  # above CHUNK_ELEMENTS: the blocked path
    multipliers = [0.0123, 0.5, 2.0**-9, 1.7, 3.1e-4, 37.0]
    m0, shift = (np.array(v) for v in zip(*map(quantize_multiplier, multipliers)))
    bias = RNG.integers(-(2**10), 2**10, channels)
    limit = 2 ** min(acc_bits, 23 if dtype == np.float32 else 40)
    acc = RNG.integers(-limit, limit, (1, channels, spatial)).astype(dtype)
    step = np.ldexp(1.0, 31 + shift - 1) / m0  # half a quantisation step in accumulator units
    acc[0, :, :50] = np.clip(np.round(step[:, None] * np.arange(-25, 25)), -limit, limit) - bias[:, None]
    got = requantize_output(acc, bias, m0, shift, 1, 3, -128, 127)
    sample = (slice(None), slice(None), slice(0, 400))
    expected = np.empty((1, channels, 400), np.int64)
    for c in range(channels):
        for i in range(400):
            value = round_half_away(
                Fraction((int(acc[0, c, i]) + int(bias[c])) * int(m0[c]), 2 ** (31 + int(shift[c])))
            )
            expected[0, c, i] = min(max(value + 3, -128), 127)
    assert got.dtype == np.int32
    assert got[sample].tolist() == expected.tolist()
    whole = np.clip(
        requantize(acc.astype(np.int64) + bias[:, None], m0[:, None], shift[:, None]) + 3, -128, 127
    )
    np.testing.assert_array_equal(got, whole)


@pytest.mark.parametrize("out_bits", [8, 16])
def test_float64_requantization_is_exact_where_its_rounding_cannot_cross_a_boundary(out_bits):
    """16-bit layers' accumulators (up to 2^36) times a 31-bit M0 are not exact in float64, but
    where float64_rounding_is_exact says one rounding cannot move p across a rounding boundary
    inside the output's range, the float64 path gives the int64 rule's codes: on random sums and
    on ties (M0 = 2^30 makes every other sum a tie for a short shift)."""
    from npubuild.intmodel.fixedpoint import float64_rounding_is_exact

    lo, hi = (-128, 127) if out_bits == 8 else (-32768, 32767)
    zero_point = 5 if out_bits == 8 else -300
    taken = 0
    for trial in range(60):
        total = int(RNG.integers(28, 46))
        m0 = np.array([1 << 30 if trial % 3 == 0 else int(RNG.integers(1 << 30, 1 << 31))])
        shift = np.array([total - 31])
        acc = RNG.integers(-(2**36), 2**36, (1, 1, 20_000)).astype(np.float64)
        # sums near the output's range, where the rounding decides the code
        step = 2.0**total / m0[0]
        acc[0, 0, :10_000] = np.round(RNG.uniform(lo - 2, hi + 2, 10_000) * step)
        acc[0, 0, :200] = np.floor(np.arange(-100, 100) * step / 2)  # half steps: ties for M0 = 2^30
        bias = np.array([int(RNG.integers(-(2**20), 2**20))])
        got = requantize_output(acc, bias, m0, shift, 1, zero_point, lo, hi)
        want = np.clip(requantize(acc.astype(np.int64) + bias[0], m0[0], shift[0]) + zero_point, lo, hi)
        if float64_rounding_is_exact(2.0**36 + 2**20, m0, 31 + shift, lo - zero_point, hi - zero_point):
            taken += 1
        np.testing.assert_array_equal(got, want)
    assert 5 < taken < 60  # both paths ran


@pytest.mark.parametrize("acc_bits", [12, 28, 40])  # float64's path (twice), int64's path
@pytest.mark.parametrize("out_bits", [8, 16])
def test_a_table_index_made_in_the_output_path_is_the_codes_offset_and_shifted(acc_bits, out_bits):
    """OutputRule.apply with a table's offset and shift gives (code + offset) >> shift, the code
    being what apply gives without them, on every path the rule takes (ties and both clipped
    ends included); the simulator's fused activation tables read these indices."""
    from npubuild.intmodel.fixedpoint import OutputRule

    channels = 5
    lo, hi = (-128, 127) if out_bits == 8 else (-32768, 32767)
    zero_point = -3 if out_bits == 8 else 0
    wider = 1 if out_bits == 8 else 256  # 16-bit codes: larger multipliers reach their ends
    multipliers = [wider * m for m in (0.02, 2.0**-7, 0.3, 1.1, 4e-5)]
    m0, shift = (np.array(v) for v in zip(*map(quantize_multiplier, multipliers)))
    bias = RNG.integers(-(2**12), 2**12, channels)
    acc = RNG.integers(-(2**acc_bits), 2**acc_bits, (2, channels, 3000)).astype(np.float64)
    step = np.ldexp(1.0, 31 + shift - 1) / m0
    acc[:, :, :60] = np.round(step[:, None] * np.arange(-30, 30)) - bias[:, None]  # ties
    rule = OutputRule(bias, m0, shift, 1, 3, zero_point, lo, hi)
    codes = rule.apply(acc)
    assert codes.min() == lo and codes.max() == hi  # both ends clipped
    table_shift = 6 if out_bits == 16 else 0
    offset = -lo
    want = (codes + offset) >> table_shift
    np.testing.assert_array_equal(rule.apply(acc, None, offset, table_shift), want)
    np.testing.assert_array_equal(rule.apply(acc, float(2**acc_bits), offset, table_shift), want)


def test_rounding_shift_ties():
    assert rounding_shift(np.array([5, -5, 6, -6, 7, -7, 4]), 1).tolist() == [3, -3, 3, -3, 4, -4, 2]


def op_program(ops, tensors, outputs) -> IntegerModel:
    return IntegerModel.model_validate({"ops": ops, "tensors": tensors, "outputs": outputs})


def as_op(record: dict):
    """An op record as the integer model types it (what the interpreter reads)."""
    return TypeAdapter(Op).validate_python(record)


def t(scale, zp, bits=8):
    return {"scale": scale, "zero_point": zp, "bits": bits}


def test_conv_with_padding_bias_requant_and_relu_clamp():
    x = RNG.integers(-128, 128, (1, 2, 4, 4)).astype(np.int32)
    w = RNG.integers(-127, 128, (3, 2, 3, 3)).astype(np.int8)
    bias = np.array([100, -2000, 7], np.int64)
    zx, zy = -5, 3
    scales = [0.0031, 0.0007, 0.012]
    m0, shift = zip(*(quantize_multiplier(s) for s in scales))
    arrays = {"w": w, "b": bias, "m0": np.array(m0, np.int64), "s": np.array(shift, np.int64)}
    op = {
        "kind": "conv",
        "inputs": ["x"],
        "outputs": ["y"],
        "attrs": {
            "strides": [1, 1],
            "pads": [1, 1, 1, 1],
            "dilations": [1, 1],
            "group": 1,
            "transpose": False,
            "output_padding": [0, 0],
            "auto_pad": "NOTSET",
            "min": zy,
            "max": 127,
        },
        "arrays": {"weight": "w", "bias": "b", "m0": "m0", "shift": "s", "weight_scale": "ws"},
    }
    program = op_program([op], {"x": t(0.1, zx), "y": t(0.2, zy)}, ["y"])
    env = {"x": x}
    Interpreter(program, arrays)._conv(as_op(op), env)
    expected = np.zeros((1, 3, 4, 4), np.int64)
    for o in range(3):
        for i in range(4):
            for j in range(4):
                acc = int(bias[o])
                for c in range(2):
                    for ki in range(3):
                        for kj in range(3):
                            ii, jj = i + ki - 1, j + kj - 1
                            if 0 <= ii < 4 and 0 <= jj < 4:  # padding is the zero point: contributes 0
                                acc += (int(x[0, c, ii, jj]) - zx) * int(w[o, c, ki, kj])
                y = round_half_away(Fraction(acc * m0[o], 2 ** (31 + shift[o]))) + zy
                expected[0, o, i, j] = min(max(y, zy), 127)  # fused ReLU: clamp at the zero point
    assert env["y"].tolist() == expected.tolist()


def test_depthwise_conv_with_stride():
    x = RNG.integers(-128, 128, (1, 3, 5, 5)).astype(np.int32)
    w = RNG.integers(-127, 128, (3, 1, 3, 3)).astype(np.int8)
    m0, shift = quantize_multiplier(0.01)
    arrays = {
        "w": w,
        "b": np.zeros(3, np.int64),
        "m0": np.full(3, m0, np.int64),
        "s": np.full(3, shift, np.int64),
    }
    op = {
        "kind": "conv",
        "inputs": ["x"],
        "outputs": ["y"],
        "attrs": {
            "strides": [2, 2],
            "pads": [0, 0, 0, 0],
            "dilations": [1, 1],
            "group": 3,
            "transpose": False,
            "output_padding": [0, 0],
            "auto_pad": "NOTSET",
            "min": -128,
            "max": 127,
        },
        "arrays": {"weight": "w", "bias": "b", "m0": "m0", "shift": "s", "weight_scale": "ws"},
    }
    env = {"x": x}
    Interpreter(op_program([op], {"x": t(1, 0), "y": t(1, 0)}, ["y"]), arrays)._conv(as_op(op), env)
    for c in range(3):
        for i in range(2):
            for j in range(2):
                acc = sum(
                    int(x[0, c, 2 * i + a, 2 * j + b]) * int(w[c, 0, a, b])
                    for a in range(3)
                    for b in range(3)
                )
                y = min(max(round_half_away(Fraction(acc * m0, 2 ** (31 + shift))), -128), 127)
                assert env["y"][0, c, i, j] == y


def test_conv_transpose_stride_2_scatters_each_tap():
    x = RNG.integers(-128, 128, (1, 2, 3, 3)).astype(np.int32)
    w = RNG.integers(-127, 128, (2, 2, 2, 2)).astype(np.int8)  # [Cin, Cout, kh, kw]
    m0, shift = quantize_multiplier(0.02)
    arrays = {
        "w": w,
        "b": np.array([5, -5], np.int64),
        "m0": np.full(2, m0, np.int64),
        "s": np.full(2, shift, np.int64),
    }
    op = {
        "kind": "conv",
        "inputs": ["x"],
        "outputs": ["y"],
        "attrs": {
            "strides": [2, 2],
            "pads": [0, 0, 0, 0],
            "dilations": [1, 1],
            "group": 1,
            "transpose": True,
            "output_padding": [0, 0],
            "auto_pad": "NOTSET",
            "min": -128,
            "max": 127,
        },
        "arrays": {"weight": "w", "bias": "b", "m0": "m0", "shift": "s", "weight_scale": "ws"},
    }
    env = {"x": x}
    Interpreter(op_program([op], {"x": t(1, 2), "y": t(1, 0)}, ["y"]), arrays)._conv(as_op(op), env)
    assert env["y"].shape == (1, 2, 6, 6)
    for o in range(2):
        for i in range(6):
            for j in range(6):
                acc = 5 if o == 0 else -5
                acc += sum((int(x[0, c, i // 2, j // 2]) - 2) * int(w[c, o, i % 2, j % 2]) for c in range(2))
                y = min(max(round_half_away(Fraction(acc * m0, 2 ** (31 + shift))), -128), 127)
                assert env["y"][0, o, i, j] == y


def test_add_sub_with_broadcast_on_the_fixed_point_grid():
    a = RNG.integers(-128, 128, (1, 4, 2, 2)).astype(np.int32)
    b = RNG.integers(-128, 128, (1, 4, 1, 1)).astype(np.int32)
    sa, sb, so, za, zb, zo = 0.05, 0.11, 0.13, 3, -7, -2
    for sign in (1, -1):
        op = {
            "kind": "add",
            "inputs": ["a", "b"],
            "outputs": ["y"],
            "attrs": {
                "ma": add_multiplier(sa / so),
                "mb": sign * add_multiplier(sb / so),
                "za": za,
                "zb": zb,
            },
        }
        env = {"a": a, "b": b}
        Interpreter(op_program([op], {"y": t(so, zo)}, ["y"]), {})._add(as_op(op), env)
        bb = np.broadcast_to(b, a.shape)
        for idx in np.ndindex(a.shape):
            num = (int(a[idx]) - za) * add_multiplier(sa / so) + sign * (int(bb[idx]) - zb) * add_multiplier(
                sb / so
            )
            y = round_half_away(Fraction(num, 2**ADD_FRACTION_BITS)) + zo
            assert env["y"][idx] == min(max(y, -128), 127)


def test_mul_and_lut_and_clamp():
    a = RNG.integers(-128, 128, (3, 5)).astype(np.int32)
    b = RNG.integers(-128, 128, (3, 5)).astype(np.int32)
    m0, shift = quantize_multiplier(0.003)
    mul = {
        "kind": "mul",
        "inputs": ["a", "b"],
        "outputs": ["y"],
        "attrs": {"m0": m0, "shift": shift, "za": 1, "zb": -1},
    }
    table = np.arange(256, dtype=np.int32)[::-1] - 128
    lut = {
        "kind": "lut",
        "inputs": ["y"],
        "outputs": ["z"],
        "attrs": {"offset": 128},
        "arrays": {"table": "t"},
    }
    clamp = {"kind": "clamp", "inputs": ["z"], "outputs": ["c"], "attrs": {"min": -10, "max": 20}}
    env = {"a": a, "b": b}
    interp = Interpreter(
        op_program([mul, lut, clamp], {"y": t(1, 4), "z": t(1, 0), "c": t(1, 0)}, ["c"]), {"t": table}
    )
    interp._mul(as_op(mul), env)
    interp._lut(as_op(lut), env)
    interp._clamp(as_op(clamp), env)
    for idx in np.ndindex(a.shape):
        y = min(
            max(
                round_half_away(Fraction((int(a[idx]) - 1) * (int(b[idx]) + 1) * m0, 2 ** (31 + shift))) + 4,
                -128,
            ),
            127,
        )
        assert env["y"][idx] == y
        assert env["z"][idx] == 127 - (y + 128)  # the reversed table
        assert env["c"][idx] == min(max(127 - (y + 128), -10), 20)


def test_maxpool_pads_with_the_lowest_code_and_global_average():
    x = RNG.integers(-128, 128, (1, 2, 3, 3)).astype(np.int32)
    pool = {
        "kind": "move",
        "op_type": "MaxPool",
        "inputs": ["x"],
        "outputs": ["p"],
        "constants": {},
        "attrs": {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [0, 0, 1, 1]},
    }
    m0, shift = quantize_multiplier(1 / 9)
    gap = {
        "kind": "global_avgpool",
        "inputs": ["x"],
        "outputs": ["g"],
        "attrs": {"m0": m0, "shift": shift},
    }
    env = {"x": x}
    interp = Interpreter(op_program([pool, gap], {"x": t(1, 6), "p": t(1, 6), "g": t(1, -1)}, ["p"]), {})
    interp._move(as_op(pool), env)
    interp._global_avgpool(as_op(gap), env)
    for c in range(2):
        for i in range(2):
            for j in range(2):
                window = [
                    x[0, c, a, b] for a in (2 * i, 2 * i + 1) for b in (2 * j, 2 * j + 1) if a < 3 and b < 3
                ]
                assert env["p"][0, c, i, j] == max(window)
        total = sum(int(v) - 6 for v in x[0, c].reshape(-1))
        assert env["g"][0, c, 0, 0] == round_half_away(Fraction(total * m0, 2 ** (31 + shift))) - 1


def test_concat_rescales_inputs_and_resize_repeats_nearest():
    a = RNG.integers(-128, 128, (1, 1, 2, 2)).astype(np.int32)
    b = RNG.integers(-128, 128, (1, 1, 2, 2)).astype(np.int32)
    m0, shift = quantize_multiplier(0.5)
    concat = {
        "kind": "concat",
        "inputs": ["a", "b"],
        "outputs": ["c"],
        "attrs": {
            "axis": 1,
            "rescale": [
                {"same": True, "m0": 0, "shift": 0, "zin": 0},
                {"same": False, "m0": m0, "shift": shift, "zin": 4},
            ],
        },
    }
    resize = {
        "kind": "resize_nearest",
        "inputs": ["c"],
        "outputs": ["r"],
        "attrs": {
            "out_shape": [1, 2, 4, 4],
            "coordinate_transformation_mode": "asymmetric",
            "nearest_mode": "floor",
        },
    }
    env = {"a": a, "b": b}
    interp = Interpreter(op_program([concat, resize], {"c": t(1, 1), "r": t(1, 1)}, ["r"]), {})
    interp._concat(as_op(concat), env)
    interp._resize_nearest(as_op(resize), env)
    assert env["c"][0, 0].tolist() == a[0, 0].tolist()
    for idx in np.ndindex(2, 2):
        assert env["c"][0, 1][idx] == min(
            max(round_half_away(Fraction(int(b[0, 0][idx]) - 4, 2)) + 1, -128), 127
        )
    for i in range(4):
        for j in range(4):
            assert env["r"][0, :, i, j].tolist() == env["c"][0, :, i // 2, j // 2].tolist()


def test_quantize_float_matches_onnx_quantizelinear():
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    x = np.concatenate([RNG.normal(size=1000) * 3, [0.25, -0.25, 0.75, 1e9, -1e9]]).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])],
        "q",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [x.size])],
        [helper.make_tensor_value_info("y", TensorProto.INT8, [x.size])],
        [
            helper.make_tensor("s", TensorProto.FLOAT, [], [0.05]),
            helper.make_tensor("z", TensorProto.INT8, [], [3]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert (
        quantize_float(x, TensorQuant(**t(0.05, 3))).tolist()
        == sess.run(None, {"x": x})[0].astype(np.int32).tolist()
    )


@pytest.mark.parametrize(
    "shape, kernel, group, stride, dilation, limit",
    [
        ((2, 64, 9, 11), 3, 1, 1, 1, 255),  # 576 terms of 255 x 127: past float32's exact range
        ((1, 8, 10, 10), 3, 1, 2, 1, 255),  # few terms: float32
        ((1, 32, 12, 12), 3, 32, 1, 2, 32767),  # depthwise, int16 inputs
        ((1, 48, 7, 7), 1, 1, 1, 1, 32767),  # 1x1 on the input itself, int16 inputs
        ((1, 24, 9, 9), 3, 4, 2, 1, 32767),  # grouped
    ],
)
def test_conv_accumulate_is_exact_in_float32_and_float64(shape, kernel, group, stride, dilation, limit):
    """Against the same convolution summed in int64 by explicit windows: the float type the kernel
    picks must hold every partial sum exactly."""
    from npubuild.intmodel.kernels import conv_sums
    from npubuild.intmodel.program import ConvGeometry

    rng = np.random.default_rng(7)
    n, c, h, w = shape
    cout = c * 2 if group == c else 16
    x = rng.integers(-limit, limit + 1, shape).astype(np.float64)
    wt = rng.integers(-127, 128, (cout, c // group, kernel, kernel)).astype(np.int8)
    # one output far from 0 and odd: above 2^24 float32 holds only even integers
    x[0] = limit
    x[0, 0, 1, 1] = limit - 1
    wt[0] = 127
    attrs = ConvGeometry(strides=[stride] * 2, pads=[1] * 4, dilations=[dilation] * 2, group=group)
    got, _ = conv_sums(x, wt, attrs)
    xp = np.pad(x.astype(np.int64), [(0, 0), (0, 0), (1, 1), (1, 1)])
    oh, ow = got.shape[2:]
    cg, og = c // group, cout // group
    want = np.zeros(got.shape, np.int64)
    for o in range(cout):
        g = o // og
        for i in range(kernel):
            for j in range(kernel):
                patch = xp[
                    :,
                    g * cg : (g + 1) * cg,
                    i * dilation : i * dilation + (oh - 1) * stride + 1 : stride,
                    j * dilation : j * dilation + (ow - 1) * stride + 1 : stride,
                ]
                want[:, o] += np.einsum("nchw,c->nhw", patch, wt[o, :, i, j].astype(np.int64))
    assert np.array_equal(got.astype(np.int64), want)


@pytest.mark.parametrize("bits", [8, 16])
@pytest.mark.parametrize("scalar_first", [False, True])
def test_elementwise_by_table_equals_the_arithmetic(bits, scalar_first):
    """An add and a multiply of a feature map by one constant, gathered from a table of every
    code, give exactly what the arithmetic gives element by element (ties included: multipliers
    that are powers of two)."""
    from npubuild.intmodel.codes import elementwise, qrange

    lo, hi = qrange(bits)
    feature_map = RNG.integers(lo, hi + 1, (1, 3, 300, 300)).astype(np.int32)
    constant = np.array([[[[37]]]], np.int32)
    m0, shift = quantize_multiplier(0.25)

    def add(x, y):
        return np.clip(add_rescaled(x, 3, add_multiplier(0.7), y, -5, add_multiplier(1.3)) + 2, -128, 127)

    def multiply(x, y):
        return np.clip(multiply_requantized(x, 3, y, -5, m0, shift) - 1, -128, 127)

    for fn in (add, multiply):
        a, b = (constant, feature_map) if scalar_first else (feature_map, constant)
        got = elementwise(fn, a, None if scalar_first else bits, b, bits if scalar_first else None)
        np.testing.assert_array_equal(got, fn(a, b))
        assert got.shape == feature_map.shape


@pytest.mark.parametrize(
    "a_shape, a_bits, b_shape, b_bits, tabulated",
    [
        ((1, 8, 96, 96), 8, (1, 8, 96, 96), 8, True),  # a residual Add: every pair of 8-bit codes
        ((1, 8, 40, 40), 8, (1, 8, 1, 1), 8, True),  # an SE gate: 8 gate values by every code
        ((1, 8, 1, 1), None, (2, 8, 40, 40), 16, False),  # a per-channel constant by 16-bit codes
        ((3, 1, 40, 40), 8, (1, 8, 1, 1), None, True),  # both broadcast
    ],
)
def test_elementwise_of_two_operands_by_table_equals_the_arithmetic(
    a_shape, a_bits, b_shape, b_bits, tabulated
):
    """Two operands whose values are few (8-bit codes, a small constant or gate) are gathered
    from a table of every pair of values (fn then sees fewer values than the result has):
    exactly what the arithmetic gives, in either order; too many pairs: the arithmetic itself."""
    from npubuild.intmodel.codes import elementwise, qrange

    def operand(shape, bits):
        lo, hi = qrange(bits or 8)
        return RNG.integers(lo, hi + 1, shape).astype(np.int32)

    a, b = operand(a_shape, a_bits), operand(b_shape, b_bits)
    m0, shift = quantize_multiplier(0.0173)
    seen = []

    def add(x, y):
        seen.append(np.broadcast_shapes(np.shape(x), np.shape(y)))
        return np.clip(add_rescaled(x, 3, add_multiplier(0.7), y, -5, add_multiplier(1.3)) + 2, -128, 127)

    def multiply(x, y):
        seen.append(np.broadcast_shapes(np.shape(x), np.shape(y)))
        return np.clip(multiply_requantized(x, 3, y, -5, m0, shift) - 1, -128, 127)

    size = np.prod(np.broadcast_shapes(a_shape, b_shape))
    for fn in (add, multiply):
        for x, x_bits, y, y_bits in ((a, a_bits, b, b_bits), (b, b_bits, a, a_bits)):
            seen.clear()
            got = elementwise(fn, x, x_bits, y, y_bits)
            assert (np.prod(seen[0]) < size) == tabulated
            np.testing.assert_array_equal(got, fn(x, y))


def test_window_max_one_axis_at_a_time_equals_the_max_over_every_tap():
    """MaxPool's separable max equals the max over each window's k x k views (kernels, strides,
    dilations and pads drawn at random, the pad value the code minimum)."""
    from npubuild.intmodel.kernels import window_max, windows

    rng = np.random.default_rng(5)
    compared = 0
    for _ in range(200):
        kernel, strides, dilations = (list(rng.integers(1, n, 2)) for n in (6, 4, 3))
        pads = list(rng.integers(0, 3, 4))
        x = rng.integers(-128, 128, (2, 3, int(rng.integers(8, 20)), int(rng.integers(8, 20)))).astype(
            np.int32
        )
        span = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
        if any(size + pads[i] + pads[i + 2] < w for i, (size, w) in enumerate(zip(x.shape[2:], span))):
            continue
        want = windows(x, kernel, strides, dilations, pads, -128).max(axis=(-2, -1))
        got = window_max(x, kernel, strides, dilations, pads, -128)
        np.testing.assert_array_equal(got, want)
        compared += 1
    assert compared > 150


def test_a_float_op_runs_in_onnxruntime_and_falls_back_to_the_reference_runtime(monkeypatch):
    """A float op between integer tensors computes what onnxruntime computes on the dequantized
    input (as the device's CPU will); where onnxruntime refuses the node, onnx's reference
    runtime computes it instead."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    import npubuild.intmodel.interpreter as interpreter_module

    node = helper.make_node("Softmax", ["x"], ["y"], axis=-1)
    proto = np.frombuffer(node.SerializeToString(), np.uint8)
    program = op_program(
        [
            {"kind": "quantize", "inputs": ["x"], "outputs": ["x"]},
            {"kind": "float", "op_type": "Softmax", "inputs": ["x"], "outputs": ["y"], "proto": "p"},
        ],
        {"x": {"scale": 0.05, "zero_point": 3, "bits": 8}},
        ["y"],
    )
    x = RNG.normal(size=(4, 64)).astype(np.float32)
    codes = quantize_float(x, TensorQuant(scale=0.05, zero_point=3, bits=8))
    dequantized = ((codes.astype(np.int64) - 3) * np.float64(0.05)).astype(np.float32)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {"x": dequantized})[0]
    got = Interpreter(program, {"p": proto}).run({"x": x})[0]["y"]
    np.testing.assert_array_equal(got, want)
    monkeypatch.setattr(interpreter_module, "_single_node_session", lambda *args: None)
    fallback = Interpreter(program, {"p": proto}).run({"x": x})[0]["y"]
    np.testing.assert_allclose(fallback, want, rtol=1e-6)
    np.testing.assert_allclose(fallback.sum(axis=-1), 1.0, rtol=1e-6)
