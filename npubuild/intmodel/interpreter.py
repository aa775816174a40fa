"""The golden integer interpreter: runs an integer model (program + arrays) with numpy.

Integer tensors are held as int32 codes. MAC ops sum int8 x int8 (or int16) products exactly
(onnxruntime's float32 kernels where the sums stay below 2^24, else float64), then requantise
with the fixed-point rule of fixedpoint.py. Float ops (no integer rule) run in onnxruntime on
dequantized inputs, as the device's CPU runs them (onnx's reference runtime where onnxruntime
refuses a node). This is the reference the
NPU simulator is checked against.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import onnx

from npubuild.intmodel import tensorfile
from npubuild.intmodel.codes import (
    centred_bound,
    dequantize,
    elementwise,
    looked_up,
    per_code,
    qrange,
    quantize_float,
    saturate,
)
from npubuild.intmodel.fixedpoint import OutputRule, add_codes, channel_shifted, multiply_codes, requantize
from npubuild.intmodel.kernels import (
    conv_sums,
    conv_transpose_accumulate,
    nearest_indices,
    pool_pads,
    window_max,
    windows,
)
from npubuild.intmodel.ortconv import ExactConvs
from npubuild.intmodel.program import IntegerModel, Op, maxpool_attrs, parse
from npubuild.intmodel.rowwise import layernorm_rows, softmax_rows


class Interpreter:
    def __init__(
        self,
        program: IntegerModel,
        arrays: dict[str, np.ndarray],
        functions=(),
        opsets=None,
        exact_convs: ExactConvs | None = None,
    ):
        """`exact_convs`: onnxruntime sessions to share with other interpreters of the same network
        (the precision search's tables: a layer whose weights did not change keeps its session)."""
        self.program = program
        self.arrays = arrays
        self.tensors = program.tensors
        self.functions = list(functions)
        self.opsets = opsets or {"": 13}
        self.exact_convs = exact_convs or ExactConvs()
        self._output_rules: dict[tuple, OutputRule] = {}  # a MAC layer's requantization, worked out
        self._float_sessions: dict[str, object] = {}  # a float op's onnxruntime session, or None
        self._float_nodes: dict[str, onnx.NodeProto] = {}
        # callers run samples in threads (evaluate, calibrate's checks): a float op's node and
        # session are made by one of them while the others wait. Published half-parsed, a node
        # was read by one thread while another parsed it (a segfault in protobuf, found by
        # benchmarks/fuzz.py --which qdq-exact, whose float64 ops run here)
        self._float_lock = threading.Lock()

    def start(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The values before the first op: the feeds (pixels arrive as codes: pixel - 128)."""
        env: dict[str, np.ndarray] = {k: np.asarray(v, np.float32) for k, v in feeds.items()}
        for name in self.program.pixel_inputs:
            env[name] = quantize_float(env[name], self.tensors[name])
        return env

    def step(self, op: Op, env: dict[str, np.ndarray]) -> None:
        """Run one op of the program, its outputs into `env`."""
        getattr(self, f"_{op.kind}")(op, env)

    def forget_rules(self) -> None:
        """Drop the MAC layers' worked-out requantization, after their arrays changed."""
        self._output_rules.clear()

    def run(self, feeds: dict[str, np.ndarray], keep: bool = False) -> tuple[dict[str, np.ndarray], dict]:
        """Outputs (float) and, with keep=True, every tensor's value (int32 codes or float32)."""
        env = self.start(feeds)
        for op in self.program.ops:
            self.step(op, env)
        outputs = {}
        for o in self.program.outputs:
            value = env[o]
            outputs[o] = (
                dequantize(value, self.tensors[o]) if self._is_q(o) else np.asarray(value, np.float32)
            )
        return outputs, (env if keep else {})

    def _is_q(self, name: str) -> bool:
        return name in self.tensors

    def _value(self, op: Op, env: dict, name: str) -> np.ndarray:
        consts = op.constants
        return self.arrays[consts[name]] if name in consts else env[name]

    # ops --------------------------------------------------------------------------------------
    def _quantize(self, op, env):
        name = op.inputs[0]
        env[name] = quantize_float(env[name], self.tensors[name])

    def _float(self, op, env):
        """A float op on dequantized inputs: in onnxruntime (a single-node session per op, kept),
        as the device's CPU runs it; in onnx's reference runtime where onnxruntime refuses it."""
        with self._float_lock:
            node = self._float_nodes.get(op.proto)
            if node is None:  # parsed once per op
                node = onnx.NodeProto()
                node.ParseFromString(self.arrays[op.proto].tobytes())
                self._float_nodes[op.proto] = node
        feeds = {}
        for i in op.inputs:
            if not i:
                continue
            if i in op.constants:
                feeds[i] = self.arrays[op.constants[i]]
            elif self._is_q(i) and env[i].dtype == np.int32:
                feeds[i] = dequantize(env[i], self.tensors[i])
            else:
                feeds[i] = env[i]
        results = self._float_in_onnxruntime(op, node, feeds)
        if results is None:
            from onnx.reference import ReferenceEvaluator

            with self._float_lock:  # it reads the shared node's protobuf
                evaluator = ReferenceEvaluator(node, opsets=self.opsets, functions=self.functions or None)
            with np.errstate(over="ignore", under="ignore"):  # a float Sigmoid's exp of a large input
                results = evaluator.run(None, feeds)
        for name, value in zip(op.outputs, results):
            if name:
                env[name] = np.asarray(value)

    def _float_in_onnxruntime(self, op, node: onnx.NodeProto, feeds: dict) -> list | None:
        with self._float_lock:
            session = self._float_sessions.get(op.proto, _UNTRIED)
            if session is _UNTRIED:
                session = self._float_sessions[op.proto] = _single_node_session(
                    node, feeds, self.opsets, self.functions
                )
        if session is None:
            return None
        try:
            return session.run(None, {k: np.asarray(v) for k, v in feeds.items()})
        except Exception:  # an input it cannot take: the reference runtime from now on
            self._float_sessions[op.proto] = None
            return None

    def _mac_finish(self, op, acc: np.ndarray, channel_axis: int, acc_bound: float | None = None):
        key = (op.outputs[0], acc.ndim, channel_axis)
        rule = self._output_rules.get(key)
        if rule is None:  # worked out once per layer (two threads may both: the same rule)
            a = op.arrays
            per_channel = [self.arrays[name] for name in (a.bias, a.m0, a.shift)]
            zero_point = self.tensors[op.outputs[0]].zero_point
            at = op.attrs
            rule = OutputRule(*per_channel, channel_axis, acc.ndim, zero_point, at.min, at.max)
            self._output_rules[key] = rule
        return rule.apply(acc, acc_bound)

    def _conv(self, op, env):
        x = op.inputs[0]
        t = self.tensors[x]
        xc = np.subtract(env[x], t.zero_point, dtype=np.float32)  # codes: exact
        w = self.arrays[op.arrays.weight]
        attrs = op.attrs
        x_bound = centred_bound(t.bits, t.zero_point)  # spares reading xc for its largest value
        key = op.outputs[0]
        if attrs.transpose:
            acc, bound = conv_transpose_accumulate(xc, w, attrs, self.exact_convs, key, x_bound), None
        else:
            acc, bound = conv_sums(xc, w, attrs, self.exact_convs, key, x_bound)
        env[op.outputs[0]] = self._mac_finish(op, acc, 1, bound)

    def _matmul(self, op, env):
        x = op.inputs[0]
        xc = env[x].astype(np.float64) - self.tensors[x].zero_point
        acc = xc @ self.arrays[op.arrays.weight].astype(np.float64)
        env[op.outputs[0]] = self._mac_finish(op, acc, acc.ndim - 1)

    def _operands(self, op, env):
        return [self._value(op, env, n).astype(np.int64) for n in op.inputs]

    def _bits(self, op, name: str) -> int | None:
        return None if name in op.constants or not self._is_q(name) else self.tensors[name].bits

    def _add(self, op, env):
        a, b = (self._value(op, env, n) for n in op.inputs)
        at = op.attrs
        t = self.tensors[op.outputs[0]]

        def add(x, y):
            return add_codes(x, at.za, at.ma, y, at.zb, at.mb, t.zero_point, t.computed_bits).astype(np.int32)

        bits = [self._bits(op, name) for name in op.inputs]
        env[op.outputs[0]] = self._per_channel(elementwise(add, a, bits[0], b, bits[1]), t)

    def _mul(self, op, env):
        a, b = (self._value(op, env, n) for n in op.inputs)
        at = op.attrs
        t = self.tensors[op.outputs[0]]

        def multiply(x, y):
            codes = multiply_codes(x, at.za, y, at.zb, at.m0, at.shift, t.zero_point, t.computed_bits)
            return codes.astype(np.int32)

        bits = [self._bits(op, name) for name in op.inputs]
        env[op.outputs[0]] = self._per_channel(elementwise(multiply, a, bits[0], b, bits[1]), t)

    @staticmethod
    def _per_channel(codes: np.ndarray, t) -> np.ndarray:
        """A per-channel result's codes from its 16-bit codes on the base grid (TensorQuant)."""
        return channel_shifted(codes, t.channel_shifts) if t.channel_shifts else codes

    def _batch_matmul(self, op, env):
        a, b = self._operands(op, env)
        at = op.attrs
        acc = np.matmul((a - at.za).astype(np.float64), (b - at.zb).astype(np.float64))  # exact < 2^53
        out = op.outputs[0]
        t = self.tensors[out]
        y = requantize(np.rint(acc).astype(np.int64), at.m0, at.shift) + t.zero_point
        env[out] = _saturate32(y, t.bits)

    def _concat(self, op, env):
        out = op.outputs[0]
        t = self.tensors[out]
        scaled = []
        for name, r in zip(op.inputs, op.attrs.rescale):
            part = self._value(op, env, name)
            if r.same:  # already on the output's grid: its codes as they are, no int64 copy
                scaled.append(part)
                continue

            def rescaled(codes: np.ndarray, r=r) -> np.ndarray:
                return _saturate32(requantize(codes - r.zin, r.m0, r.shift) + t.zero_point, t.bits)

            bits = self._bits(op, name)  # a function of each code: gathered from a table of them
            scaled.append(per_code(rescaled, part, bits) if bits else rescaled(part.astype(np.int64)))
        env[out] = np.concatenate(scaled, axis=op.attrs.axis, dtype=np.int32)

    def _global_avgpool(self, op, env):
        x = op.inputs[0]
        xc = env[x].astype(np.int64) - self.tensors[x].zero_point
        total = xc.sum(axis=tuple(range(2, xc.ndim)), keepdims=True)
        out = op.outputs[0]
        t = self.tensors[out]
        at = op.attrs
        env[out] = _saturate32(requantize(total, at.m0, at.shift) + t.zero_point, t.bits)

    def _avgpool(self, op, env):
        x = op.inputs[0]
        at = op.attrs
        xc = env[x].astype(np.float64) - self.tensors[x].zero_point
        nd = len(at.kernel_shape)
        pads = pool_pads(xc.shape[2:], at)
        win = windows(xc, at.kernel_shape, at.strides or [1] * nd, [1] * nd, pads, 0.0)
        total = np.rint(win.sum(axis=tuple(range(-nd, 0)))).astype(np.int64)
        out = op.outputs[0]
        t = self.tensors[out]
        y = requantize(total, self.arrays[op.arrays.m0], self.arrays[op.arrays.shift])
        env[out] = _saturate32(y + t.zero_point, t.bits)

    def _resize_nearest(self, op, env):
        x = env[op.inputs[0]]
        result = x
        for axis, (size_in, size_out) in enumerate(zip(x.shape, op.attrs.out_shape)):
            if size_in != size_out:
                result = np.take(result, nearest_indices(size_in, size_out, op.attrs), axis=axis)
        env[op.outputs[0]] = result

    def _lut(self, op, env):
        x = env[op.inputs[0]]
        y = looked_up(self.arrays[op.arrays.table], x, op.attrs.offset, op.attrs.index_shift)
        env[op.outputs[0]] = self._per_channel(y, self.tensors[op.outputs[0]])

    def _softmax(self, op, env):
        x = env[op.inputs[0]].astype(np.int64)
        rows = x.reshape(-1, x.shape[-1] if x.ndim else 1)
        table = self.arrays[op.arrays.table].astype(np.int64)
        y = softmax_rows(rows, table, op.attrs.rshift, self.tensors[op.outputs[0]].bits)
        env[op.outputs[0]] = y.reshape(x.shape).astype(np.int32)

    def _layernorm(self, op, env):
        x = env[op.inputs[0]].astype(np.int64)
        rows = x.reshape(-1, x.shape[-1])
        t = self.tensors[op.outputs[0]]
        params = self.arrays[op.arrays.params].astype(np.int64)
        zp = self.tensors[op.inputs[0]].zero_point
        y = layernorm_rows(rows, zp, op.attrs.eps_codes, params, t.zero_point, t.bits)
        env[op.outputs[0]] = y.reshape(x.shape).astype(np.int32)

    def _clamp(self, op, env):
        env[op.outputs[0]] = np.clip(env[op.inputs[0]], op.attrs.min, op.attrs.max)

    def _move(self, op, env):
        x = env[op.inputs[0]]
        at = op.attrs
        consts = op.operand_arrays(self.arrays)
        kind = op.op_type
        outs = op.outputs
        if kind == "Reshape":
            shape = [int(s) for s in consts[0]]
            if not at.get("allowzero", 0):
                shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
            env[outs[0]] = x.reshape(shape)
        elif kind == "Transpose":
            env[outs[0]] = np.transpose(x, at.get("perm") or list(range(x.ndim))[::-1])
        elif kind == "Flatten":
            axis = at.get("axis", 1) % (x.ndim or 1) if at.get("axis", 1) < 0 else at.get("axis", 1)
            env[outs[0]] = x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)), -1)
        elif kind in ("Squeeze", "Unsqueeze"):
            axes = [int(a) for a in consts[0]] if consts and consts[0] is not None else at.get("axes")
            if kind == "Squeeze":
                env[outs[0]] = np.squeeze(x, axis=tuple(axes) if axes else None)
            else:
                rank = x.ndim + len(axes)
                result = x
                for a in sorted(a % rank for a in axes):
                    result = np.expand_dims(result, a)
                env[outs[0]] = result
        elif kind == "Split":
            axis = at.get("axis", 0)
            sizes = [int(s) for s in consts[0]] if consts and consts[0] is not None else at.get("split")
            if not sizes:
                k = len(outs)
                sizes = [x.shape[axis] // k] * k
            for name, part in zip(outs, np.split(x, np.cumsum(sizes)[:-1], axis=axis)):
                env[name] = part
        elif kind == "Slice":
            starts, ends = consts[0], consts[1]
            axes = consts[2] if len(consts) > 2 and consts[2] is not None else range(len(starts))
            steps = consts[3] if len(consts) > 3 and consts[3] is not None else [1] * len(starts)
            index = [slice(None)] * x.ndim
            for s, e, a, st in zip(starts, ends, axes, steps):
                index[int(a)] = slice(int(s), int(e), int(st))
            env[outs[0]] = x[tuple(index)]
        elif kind == "MaxPool":
            env[outs[0]] = self._maxpool(x, op)
        else:
            raise KeyError(kind)

    def _maxpool(self, x, op):
        attrs = maxpool_attrs(op)
        kernel = attrs.kernel_shape
        pads = pool_pads(x.shape[2:], attrs)
        qmin = qrange(self.tensors[op.inputs[0]].bits)[0]
        return window_max(x, kernel, attrs.strides, attrs.dilations, pads, qmin).astype(np.int32, copy=False)


_UNTRIED = object()


def _single_node_session(node: onnx.NodeProto, feeds: dict, opsets: dict, functions: list):
    """An onnxruntime session of one float node (its inputs typed by the values it is fed, its
    outputs left to onnxruntime), or None where onnxruntime refuses it. One intra-op thread: the
    golden interpreter's callers run samples in threads."""
    import onnxruntime as ort
    from onnx import helper

    inputs = [
        helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype), None)
        for name, v in feeds.items()
    ]
    outputs = [onnx.ValueInfoProto(name=o) for o in node.output if o]
    graph = helper.make_graph([node], "float_op", inputs, outputs)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()], functions=list(functions)
    )
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 4
    try:
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception:
        return None


def _saturate32(v: np.ndarray, bits: int) -> np.ndarray:
    """Saturated int32 codes, the interpreter's representation of every integer tensor."""
    return saturate(v, bits).astype(np.int32)


def interpreter_for(program: IntegerModel, arrays: dict[str, np.ndarray]) -> Interpreter:
    """An interpreter of a stored integer model (its ONNX functions read from its arrays)."""
    functions = []
    for key in program.functions:
        f = onnx.FunctionProto()
        f.ParseFromString(arrays[key].tobytes())
        functions.append(f)
    return Interpreter(program, arrays, functions, {"": program.opset, "npubuild": 1})


def load_integer_model(path: Path) -> tuple[IntegerModel, dict, Interpreter]:
    arrays, meta = tensorfile.load(path)
    program = parse(meta, str(path))
    return program, arrays, interpreter_for(program, arrays)
