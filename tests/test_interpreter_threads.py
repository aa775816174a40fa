"""The golden interpreter is run on several samples at once (evaluate and calibrate's checks run
samples in threads). Its float ops make their node and onnxruntime session on first use; a node
published before it was parsed was read half-made by another thread: a segfault in protobuf
(benchmarks/fuzz.py --which qdq-exact) or, short of that, a float op computed by an empty node."""

from __future__ import annotations

import threading
import time

import numpy as np
from onnx import TensorProto, helper
from test_quantize import SETTINGS

from conftest import integer_variants, small_model
from npubuild.intmodel.interpreter import Interpreter


class _SlowNodes(dict):
    """The model's arrays, handing out a float op's serialized node slowly: the time another
    thread needs to come to the op while the first still makes its node."""

    def __init__(self, arrays: dict, slow: set[str]):
        super().__init__(arrays)
        self.slow = slow

    def __getitem__(self, key):
        if key in self.slow:
            time.sleep(0.02)
        return super().__getitem__(key)


def test_threads_that_meet_a_float_op_first_together_get_what_one_thread_gets(tmp_path):
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="first"),
        helper.make_node("Cast", ["a"], ["wide"], to=TensorProto.DOUBLE, name="widen"),
        helper.make_node("Sqrt", ["wide"], ["root"], name="in_float64"),
        helper.make_node("Cast", ["root"], ["back"], to=TensorProto.FLOAT, name="narrow"),
        helper.make_node("Relu", ["back"], ["y"], name="last"),
    ]
    model = small_model(nodes, "wide", {"x": [1, 4, 8, 8]}, {"y": [1, 4, 8, 8]}, {})
    samples = np.random.default_rng(0).normal(size=(8, 4, 8, 8)).astype(np.float32)
    program, arrays, golden = integer_variants(model, tmp_path, samples, {"int8": SETTINGS})["int8"]
    assert {f.node for f in program.float_nodes} >= {"widen", "in_float64", "narrow"}
    expected = [golden.run({"x": s[None]})[0]["y"] for s in samples[:4]]
    slow = {op.proto for op in program.ops if getattr(op, "proto", None)}
    assert slow
    for _ in range(5):  # a fresh interpreter each time: its first use is where threads race
        interpreter = Interpreter(program, _SlowNodes(arrays, slow), [], {"": 14})
        start, got = threading.Barrier(4), [None] * 4

        def work(k: int, interpreter=interpreter, start=start, got=got) -> None:
            start.wait()
            got[k] = interpreter.run({"x": samples[k][None]})[0]["y"]

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for k in range(4):
            np.testing.assert_array_equal(got[k], expected[k])
