"""Exact integer convolutions on onnxruntime's float32 Conv and ConvTranspose.

A convolution of integer codes is a sum of integer products. float32 holds every integer below
2^24, so when every partial sum of an output stays below 2^24 in magnitude, any order of summation
(blocking, FMA, vector lanes) gives the exact integer. `exact_in_float32` bounds every partial sum
by max|x| times the largest L1 norm of one output channel's weights; under that bound the
convolution is handed to onnxruntime's float kernels, several times faster than numpy's GEMM over
im2col columns and bit-identical to it (tests compare both on every layer shape they build).

One single-node session per weight tensor and geometry, its input shape symbolic so that the
golden interpreter's images and the simulator's tiles share it; sessions run one intra-op thread
because callers run samples in threads (stages/parallel.py).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict

import numpy as np

from npubuild.intmodel.program import ConvGeometry

FLOAT32_EXACT = 1 << 24
BYTE = 256
SESSIONS_KEPT = 512  # a large model's convolutions, each with its weights prepacked
WEIGHTS_PER_NAME = 16  # a layer's weight chunks, loaded one after the other at one address
# A call of fewer MACs runs on one thread even where the caller offers more: waking onnxruntime's
# pool for it costs more than sharing the work saves (the simulator's small tiles; measured in
# docs/npu.md, "The simulator's output path on small tiles")
PARALLEL_MACS = 1 << 24


def channel_l1(w: np.ndarray, transpose: bool) -> float:
    """The largest sum of |weight| feeding one output: over an output channel's filter, or for a
    transposed convolution over every input channel and tap of one output channel."""
    if w.size == 0:
        return 0.0
    a = np.abs(w.astype(np.int64))
    per_output = a.sum(axis=(0, *range(2, w.ndim))) if transpose else a.reshape(w.shape[0], -1).sum(axis=1)
    return float(per_output.max())


class _Entry:
    """One weight tensor and geometry: a copy of the weights, their L1 bound and, once an input
    fits it, the sessions: one on a single thread and, where the caller offers more threads and
    a call is large enough to share out, one on all of them."""

    def __init__(self, w: np.ndarray, attrs: ConvGeometry, pads: list[int], transpose: bool, threads: int):
        self.weights = np.array(w)
        self.threads = threads
        self.attrs, self.pads, self.transpose = attrs, pads, transpose
        self.l1 = channel_l1(w, transpose)
        self.sessions: dict[int, object] = {}  # by intra-op threads
        self.named: object = None  # the caller's token for these weights' values, if it has one
        # MACs per element of the input, to size a call: a transposed convolution's element meets
        # every tap of its group's output channels (w[0]); a convolution's, out_c / group
        # channels' taps once per stride step
        if transpose:
            self.macs_per_input = float(w[0].size)
        else:
            taps = math.prod(w.shape[2:])
            self.macs_per_input = w.shape[0] * taps / (attrs.group * math.prod(attrs.strides))

    def run(self, xc: np.ndarray) -> np.ndarray | None:
        """The sums in onnxruntime, or None when it refuses the geometry (then never again)."""
        threads = self.threads if xc.size * self.macs_per_input >= PARALLEL_MACS else 1
        try:
            session = self.sessions.get(threads)
            if session is None:  # two threads may both build it: harmless
                session = self.sessions[threads] = _build(
                    self.weights, self.attrs, self.pads, self.transpose, threads
                )
            return session.run(None, {"x": np.ascontiguousarray(xc, np.float32)})[0]
        except Exception:  # numpy's kernel sums it instead, or says why it cannot
            self.l1 = math.inf
            return None


class ExactConvs:
    """The sessions of one integer model's (or one simulator's) convolutions, each under the
    caller's name for the layer (the golden interpreter's output tensor, the simulator's weight
    address) and its geometry. Under one name the weights are compared with each entry's copy on
    every call (a memory compare, far cheaper than a digest): a layer's weight chunks, loaded one
    after another at one address, each find their own session, and a name never brings back a
    stale one."""

    def __init__(self, threads: int = 1) -> None:
        """threads: onnxruntime's intra-op threads for a call of PARALLEL_MACS or more (1 where
        callers run samples in threads; more for one caller with a batch, the simulator's);
        smaller calls run on one."""
        self.threads = threads
        self._entries: OrderedDict[tuple, list[_Entry]] = OrderedDict()
        self._lock = threading.Lock()

    def sums(
        self,
        xc: np.ndarray,
        w: np.ndarray,
        attrs: ConvGeometry,
        pads: list[int],
        transpose: bool,
        key: object,
        x_bound: float | None = None,
        named: object = None,
    ) -> tuple[np.ndarray, float] | None:
        """(sums, a bound on every |sum|: max |x| times the weights' L1 bound) of the
        convolution (or transposed convolution) of zero-point-free integer inputs xc by integer
        weights w, or None when a partial sum could reach 2^24 even with the input split in bytes
        (the caller then sums in float64). pads are explicit (auto_pad resolved); `transpose`
        says which of the two (a simulator tile's geometry does not carry the flag).

        float32 integers when the input fits whole; a wider input (a 16-bit layer's) is split
        into its low byte (0..255) and the rest, x = 256 * high + low, two convolutions of
        8-bit-sized values (one session call on a batch of both) combined in float64 (exact: each
        sum is below 2^24). xc may also be an integer array. `x_bound`, when the caller knows one
        (an 8-bit code less its zero point), spares reading the input for max |x| whenever it
        already proves the sums exact. `named`, when the caller has one, is a token that names
        the weights' values (equal tokens, equal weights: the simulator's for weights loaded from
        the constants): an entry found under it is used without comparing the weights."""
        entry = self._entry(w, attrs, pads, transpose, key, named)
        if x_bound is None or x_bound * entry.l1 >= FLOAT32_EXACT:
            # max |x| from two reductions: no temporary of the input's size on this hot path
            x_bound = max(abs(float(xc.max(initial=0))), abs(float(xc.min(initial=0))))
        bound = x_bound * entry.l1
        if bound < FLOAT32_EXACT:
            whole = entry.run(xc)
            return None if whole is None else (whole, bound)
        high_bound = math.floor(x_bound / BYTE) + 1
        if max(BYTE - 1, high_bound) * entry.l1 >= FLOAT32_EXACT:
            return None
        # both halves in one batch (one session call): high = floor(x / 256) by an arithmetic
        # shift, low = x mod 256 by a mask, on int32 (exact; float32's np.mod is ~50x slower)
        whole = xc if xc.dtype.kind == "i" else xc.astype(np.int32)
        n = xc.shape[0]
        halves = np.empty((2 * n, *xc.shape[1:]), np.float32)
        np.right_shift(whole, 8, out=halves[:n], casting="unsafe")
        np.bitwise_and(whole, BYTE - 1, out=halves[n:], casting="unsafe")
        both = entry.run(halves)
        if both is None:
            return None
        sums = np.multiply(both[:n], float(BYTE), dtype=np.float64)
        sums += both[n:]
        return sums, bound

    def _entry(
        self, w: np.ndarray, attrs: ConvGeometry, pads: list[int], transpose: bool, key: object, named=None
    ) -> _Entry:
        key = (
            key,
            w.shape,
            w.dtype.char,
            transpose,
            tuple(attrs.strides),
            tuple(attrs.dilations),
            tuple(pads),
            attrs.group,
            tuple(attrs.output_padding or ()),
        )
        with self._lock:
            entries = self._entries.get(key)
            if entries is None:
                entries = self._entries[key] = []
                while len(self._entries) > SESSIONS_KEPT:
                    self._entries.popitem(last=False)
            self._entries.move_to_end(key)
            if named is not None:
                found = next((e for e in entries if e.named == named), None)
                if found is not None:
                    return found
            found = next((e for e in entries if np.array_equal(e.weights, w)), None)
            if found is not None:
                if named is not None:
                    found.named = named
                return found
        entry = _Entry(w, attrs, pads, transpose, self.threads)
        entry.named = named
        with self._lock:
            entries.insert(0, entry)
            del entries[WEIGHTS_PER_NAME:]
        return entry


def _build(w: np.ndarray, attrs: ConvGeometry, pads: list[int], transpose: bool, threads: int):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    nd = w.ndim - 2
    geometry = {
        "strides": list(attrs.strides),
        "dilations": list(attrs.dilations),
        "pads": list(pads),
        "group": attrs.group,
    }
    if transpose:
        if attrs.output_padding:
            geometry["output_padding"] = list(attrs.output_padding)
        node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], **geometry)
    else:
        node = helper.make_node("Conv", ["x", "w"], ["y"], **geometry)
    symbolic = ["n", "c"] + [f"d{i}" for i in range(nd)]
    graph = helper.make_graph(
        [node],
        "exact_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, symbolic)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w.astype(np.float32), "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if threads > 1:  # its pool's threads would spin between the caller's calls, starving its Python
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.inter_op_num_threads = 1
    options.log_severity_level = 4  # a refused geometry falls back to numpy: no log line
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
