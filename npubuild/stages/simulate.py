"""simulate: run model.npub on the evaluation samples and check it.

Bit-exactness: every NPU subgraph, fed the golden interpreter's values of its inputs, must give
the golden interpreter's integer codes for its outputs, element for element. End to end (NPU
subgraphs in the simulator, CPU subgraphs in onnxruntime): the outputs against the QDQ model and
the float model. Plus the simulator's counters for one inference.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from npubuild.intmodel.interpreter import load_integer_model
from npubuild.stages.feeds import iterate_feeds, session
from npubuild.stages.metrics import Agreement
from npubuild.stages.onnx_utils import load_model, write_json
from npubuild.stages.parallel import in_order, sample_workers
from npubuild.targets.runtime import Runtime, load

# images simulated at once: the per-instruction cost is paid once per batch, and each image's
# memories and golden values stay in RAM until its batch is checked
BATCH_IMAGES = 16
BATCH_BYTES = 1 << 28


def batch_size(sram_bytes: int, dram_bytes: int) -> int:
    """Images per batch: at most BATCH_IMAGES, and their memories within BATCH_BYTES."""
    return max(1, min(BATCH_IMAGES, BATCH_BYTES // max(sram_bytes + dram_bytes, 1)))


def balanced(count: int, size: int) -> list[int]:
    """Batch sizes for `count` images, at most `size` each, as even as they go (9 images in
    batches of 8 run as 5 + 4, not 8 + 1: a batch costs its instructions' interpretation once)."""
    batches = -(-count // size)
    return [count // batches + (k < count % batches) for k in range(batches)]


def batch_plan(count: int, size: int, workers: int) -> tuple[list[int], int]:
    """Batch sizes for `count` images and onnxruntime's threads in each batch's convolutions.
    Batches as large as the memory allows: interpreting a stream's instructions costs the same for
    one image as for a batch, and on small tiles that Python (one core at a time) is most of the
    work. One batch: its large convolutions on every core (ortconv.PARALLEL_MACS; a small tile's
    call runs on one); several: one batch per thread."""
    sizes = balanced(count, size)
    return sizes, (workers if len(sizes) == 1 else 1)


class Runtimes:
    """Simulators lent to the threads that run batches, made on first need and kept: a batch's
    memories are its thread's alone while it runs, and a simulator's sessions serve every later
    batch."""

    def __init__(self, binary, batch: int, threads: int):
        self.binary, self.batch, self.threads = binary, batch, threads
        self._idle: queue.SimpleQueue[Runtime] = queue.SimpleQueue()

    @contextmanager
    def lend(self) -> Iterator[Runtime]:
        try:
            runtime = self._idle.get_nowait()
        except queue.Empty:
            runtime = Runtime(self.binary, self.batch, self.threads)
        try:
            yield runtime
        finally:
            self._idle.put(runtime)


@dataclass
class _Batch:
    """What one batch's simulation gives the stage's report."""

    golden_outputs: list[dict]  # the golden interpreter's outputs (not its every tensor: memory)
    results: list[dict]
    counters: dict
    checks: list[tuple[int, str, np.ndarray, np.ndarray]]  # (subgraph, tensor, got, golden) per image


def run(params: dict, inputs: dict[str, Path], outdir: Path) -> dict[str, Path]:
    model = load_model(inputs["model"], "the optimized model")
    qdq = load_model(inputs["qdq"], "the QDQ model")
    program, _, interpreter = load_integer_model(inputs["integer"])
    binary = load(inputs["binary"])
    probe = Runtime(binary)  # validates the binary; its memories' sizes set the batch
    size, workers = batch_size(probe.sim.sram.size, probe.sim.dram.size), sample_workers()
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
    pixels = {spec["name"] for spec in probe.inputs if spec["pixels"]}
    feeds = list(iterate_feeds(model, tensors, params["samples"]))
    sizes, threads = batch_plan(len(feeds), size, workers)
    runtimes = Runtimes(binary, max(sizes, default=1), threads)
    starts = np.cumsum([0, *sizes])

    def simulate(chunk: list[dict]) -> _Batch:
        golden = [interpreter.run(feed, keep=True) for feed in chunk]
        with runtimes.lend() as runtime:
            runtime.sim.counts.clear()
            runtime.sim.sram.high_water = 0
            values: dict[str, np.ndarray] = {}
            batch = [{k: v.astype(np.uint8) if k in pixels else v for k, v in feed.items()} for feed in chunk]
            # copies, like every value kept past the lending: the memories hold the next batch's soon
            results = [{k: np.array(v) for k, v in r.items()} for r in runtime.run_batch(batch, values)]
            counts = dict(runtime.sim.counts)
            counts["sram_peak_bytes"] = runtime.sim.sram.high_water
            checks = []
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
                        checks.append((k, s["name"], np.array(local[s["name"]][image]), env[s["name"]]))
            return _Batch([outputs for outputs, _ in golden], results, counts, checks)

    chunks = [feeds[a:b] for a, b in zip(starts[:-1], starts[1:])]
    for chunk, batch in zip(chunks, in_order(simulate, chunks, workers)):  # reduced in batch order
        samples += len(chunk)
        if counters is None:  # one inference's (the simulator counts per image)
            counters = batch.counters
        for k, name, got, want in batch.checks:
            got = np.asarray(got).astype(np.int64).reshape(-1)
            want = np.asarray(want).astype(np.int64).reshape(-1)
            elements += want.size
            same = int((got == want).sum())
            exact += same
            if same != want.size and len(mismatches) < 10:
                mismatches.append(f"subgraph {k}: {name}: {want.size - same} of {want.size} differ")
        for feed, golden_out, result in zip(chunk, batch.golden_outputs, batch.results):
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
