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
from npubuild.stages.parallel import sample_workers
from npubuild.targets.runtime import Runtime, load

# images simulated at once: the per-instruction cost is paid once per batch, and each image's
# memories and golden values stay in RAM until its batch is checked
BATCH_IMAGES = 8
BATCH_BYTES = 1 << 28


def batch_size(sram_bytes: int, dram_bytes: int) -> int:
    """Images per batch: at most BATCH_IMAGES, and their memories within BATCH_BYTES."""
    return max(1, min(BATCH_IMAGES, BATCH_BYTES // max(sram_bytes + dram_bytes, 1)))


def balanced(count: int, size: int) -> list[int]:
    """Batch sizes for `count` images, at most `size` each, as even as they go (9 images in
    batches of 8 run as 5 + 4, not 8 + 1: a batch costs its instructions' interpretation once)."""
    batches = -(-count // size)
    return [count // batches + (k < count % batches) for k in range(batches)]


def run(params: dict, inputs: dict[str, Path], outdir: Path) -> dict[str, Path]:
    model = load_model(inputs["model"], "the optimized model")
    qdq = load_model(inputs["qdq"], "the QDQ model")
    program, _, interpreter = load_integer_model(inputs["integer"])
    binary = load(inputs["binary"])
    probe = Runtime(binary)  # validates the binary; its memories' sizes set the batch
    size, threads = batch_size(probe.sim.sram.size, probe.sim.dram.size), sample_workers()
    runtime = probe if size == threads == 1 else Runtime(binary, size, threads)
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
    feeds = list(iterate_feeds(model, tensors, params["samples"]))
    starts = np.cumsum([0, *balanced(len(feeds), size)])
    for chunk in (feeds[a:b] for a, b in zip(starts[:-1], starts[1:])):
        samples += len(chunk)
        golden = [interpreter.run(feed, keep=True) for feed in chunk]
        runtime.sim.counts.clear()
        runtime.sim.sram.high_water = 0
        values: dict[str, np.ndarray] = {}
        results = runtime.run_batch(
            [{k: v.astype(np.uint8) if k in pixels else v for k, v in feed.items()} for feed in chunk], values
        )
        if counters is None:  # one inference's (the simulator counts per image)
            counters = dict(runtime.sim.counts)
            counters["sram_peak_bytes"] = runtime.sim.sram.high_water
        for k, sg in enumerate(runtime.subgraphs):
            if sg["device"] != "npu":
                continue
            golden_in = {s["name"]: np.stack([env[s["name"]] for _, env in golden]) for s in sg["inputs"]}
            if all(np.array_equal(values[name], value) for name, value in golden_in.items()):
                local = values  # the end-to-end run fed this subgraph the golden inputs already
            else:  # a CPU part before it computed in onnxruntime: feed the golden values
                local = dict(golden_in)
                runtime.run_npu(k, local)
            for s in sg["outputs"]:
                for image, (_, env) in enumerate(golden):
                    got = local[s["name"]][image].astype(np.int64).reshape(-1)
                    want = np.asarray(env[s["name"]]).astype(np.int64).reshape(-1)
                    elements += want.size
                    same = int((got == want).sum())
                    exact += same
                    if same != want.size and len(mismatches) < 10:
                        differ = f"{want.size - same} of {want.size} differ"
                        mismatches.append(f"subgraph {k}: {s['name']}: {differ}")
        for feed, (golden_out, _), result in zip(chunk, golden, results):
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
