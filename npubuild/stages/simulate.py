"""simulate: run model.npub on the evaluation samples and check it.

Bit-exactness: every NPU subgraph, fed the golden interpreter's values of its inputs, must give
the golden interpreter's integer codes for its outputs, element for element. End to end (NPU
subgraphs in the simulator, CPU subgraphs in onnxruntime): the outputs against the QDQ model and
the float model. Plus the simulator's counters for one inference.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from npubuild.intmodel.interpreter import load_integer_model
from npubuild.stages.feeds import iterate_feeds, session
from npubuild.stages.metrics import Agreement
from npubuild.stages.onnx_utils import load_model, write_json
from npubuild.targets.runtime import Runtime, load


def run(params: dict, inputs: dict[str, Path], outdir: Path) -> dict[str, Path]:
    model = load_model(inputs["model"], "the optimized model")
    qdq = load_model(inputs["qdq"], "the QDQ model")
    program, _, interpreter = load_integer_model(inputs["integer"])
    runtime = Runtime(load(inputs["binary"]))
    tensors = np.load(inputs["evaluation"], mmap_mode="r", allow_pickle=False)
    outputs = [o.name for o in model.graph.output]
    float_session, qdq_session = session(model), session(qdq)
    versus_float = {o: Agreement() for o in outputs}
    versus_qdq = {o: Agreement() for o in outputs}
    versus_golden = {o: Agreement() for o in outputs}
    elements = exact = 0
    mismatches: list[str] = []
    samples = 0
    counters = None
    # a fused-preprocessing model's data set holds pixel values as floats; the binary takes bytes
    pixels = {spec["name"] for spec in runtime.inputs if spec["pixels"]}
    for feed in iterate_feeds(model, tensors, params["samples"]):
        samples += 1
        golden_out, env = interpreter.run(feed, keep=True)
        runtime.sim.counts.clear()
        runtime.sim.sram.high_water = 0
        values: dict[str, np.ndarray] = {}
        result = runtime.run({k: v.astype(np.uint8) if k in pixels else v for k, v in feed.items()}, values)
        if counters is None:
            counters = dict(runtime.sim.counts)
            counters["sram_peak_bytes"] = runtime.sim.sram.high_water
        for k, sg in enumerate(runtime.subgraphs):
            if sg["device"] != "npu":
                continue
            golden_in = {s["name"]: env[s["name"]] for s in sg["inputs"]}
            if all(np.array_equal(values[name], value) for name, value in golden_in.items()):
                local = values  # the end-to-end run fed this subgraph the golden inputs already
            else:  # a CPU part before it computed in onnxruntime: feed the golden values
                local = dict(golden_in)
                runtime.run_npu(k, local)
            for s in sg["outputs"]:
                got = local[s["name"]].astype(np.int64).reshape(-1)
                want = np.asarray(env[s["name"]]).astype(np.int64).reshape(-1)
                elements += want.size
                same = int((got == want).sum())
                exact += same
                if same != want.size and len(mismatches) < 10:
                    mismatches.append(f"subgraph {k}: {s['name']}: {want.size - same} of {want.size} differ")
        reference = dict(zip(outputs, float_session.run(outputs, feed)))
        qdq_out = dict(zip(outputs, qdq_session.run(outputs, feed)))
        for o in outputs:
            versus_float[o].update(reference[o], result[o])
            versus_qdq[o].update(qdq_out[o], result[o])
            versus_golden[o].update(golden_out[o], result[o])
    report = {
        "samples": samples,
        "bit_exact": {
            "elements": elements,
            "exact": exact,
            "ok": elements == exact,
            "mismatches": mismatches,
        },
        "end_to_end": {
            o: {
                "vs_float": versus_float[o].result(),
                "vs_qdq": versus_qdq[o].result(),
                "vs_integer_model": versus_golden[o].result(),
            }
            for o in outputs
        },
        "counters": counters or {},
        "warnings": []
        if elements == exact
        else [f"simulator differs from the integer model: {mismatches[0]}"],
    }
    return {"report": write_json(outdir / "simulate.json", report)}
