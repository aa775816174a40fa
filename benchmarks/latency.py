"""Estimated latency and DRAM traffic: layer by layer, with grouping, and the roofline bound.

    python benchmarks/latency.py

Builds the example workspace's three real models (quantized as the example declares), then
compiles each for both built-in targets twice: every tensor through DRAM (layer by layer), and
the deployed way (layer groups kept in SRAM, activations fused into convolutions). Prints the
cycle model's latency, the network's roofline lower bound max(MACs / peak, compulsory bytes /
bandwidth) with compulsory bytes = weights + network inputs + outputs, and DRAM bytes against the
compulsory bytes. Goal (issue 19): on vnpu-m grouped <= 1.5x the bound (YOLOv8n <= 1.15x), DRAM <=
2x compulsory; the ratio is printed to three decimals so that a figure at the bar reads as one.
The last column is the grouped latency against the bound with each MAC layer at the array's rate
for its operands' width (`int16_rate` where one is 16-bit: codegen's `roofline_cycles_at_widths`):
for a model a precision table keeps partly in int16 (the example's det), what the array allows for
that table. Where a model's MAC layers are all int8 the two columns agree. Issue 19's goal is read on
the bound of the precision each model runs at: this column for the example's mixed det (its int8
ratio, the column before, printed beside it), and the all-int8 det's row for the model the issue
measured (docs/design-decisions.md, "The roofline bound of a table with 16-bit layers").
The row "PP-OCRv4 det int8" is the example's det without its precision table (every layer int8):
the model issue 19 measured when it was filed (5.47x, 6.92M cycles on vnpu-m), so the back end's
figure on it does not move with what the precision search picks.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _workspace_gen import EXAMPLE  # noqa: E402

MODELS = {
    "yolo": "YOLOv8n",
    "ocr_det": "PP-OCRv4 det",
    "ocr_det_int8": "PP-OCRv4 det int8",
    "ocr_cls": "PP-OCR cls",
}
# the example's det as declared but for its precision table
ALL_INT8_DET = """
npu_model(
    name = "ocr_det_int8",
    model = ":ppocr_det",
    calibration = "//data:ocr_det_calib",
    evaluation = "//data:ocr_det_eval",
    target = "vnpu-m",
)
"""


def main() -> None:
    from npubuild.cache.store import Store
    from npubuild.engine.run import build
    from npubuild.intmodel.interpreter import load_integer_model
    from npubuild.stages.onnx_utils import load_model
    from npubuild.targets.compile import compile_npub, plan_partition
    from npubuild.targets.spec import BUILTIN_TARGETS

    tmp = Path(tempfile.mkdtemp(prefix="npubuild-latency-"))
    try:
        ws = tmp / "ws"
        shutil.copytree(EXAMPLE, ws, ignore=shutil.ignore_patterns("npubuild-out"))
        with (ws / "models" / "BUILD").open("a") as build_file:
            build_file.write(ALL_INT8_DET)
        store = Store(tmp / "cache")
        outcome = build(ws, store, [f"//models:{m}" for m in MODELS], jobs=2, until="quantize")
        assert outcome.ok, outcome.errors
        print(
            f"{'model':<17} {'target':<7} {'layer by layer ms':>17} {'grouped ms':>10} {'bound ms':>8} "
            f"{'grouped/bound':>13} {'DRAM MiB lbl':>12} {'grouped':>8} {'compulsory':>10} "
            f"{'grouped/comp':>12} {'x width-aware':>13}"
        )
        for name, title in MODELS.items():
            out = ws / "npubuild-out" / "models" / name
            model = load_model(out / "optimized.onnx", "the optimized model")
            program, arrays, _ = load_integer_model(out / "quantized.npq")
            for target_name, target in BUILTIN_TARGETS.items():
                plan = plan_partition(program, arrays, model, target)
                _, _, flat = compile_npub(program, arrays, model, target, plan, group=False)
                _, _, grouped = compile_npub(program, arrays, model, target, plan)
                per_ms = 1 / (target.clock_mhz * 1000.0)
                bound = grouped["roofline_cycles"]
                mib = 2**20
                print(
                    f"{title:<17} {target_name:<7} {flat['estimated_cycles'] * per_ms:>17.3f} "
                    f"{grouped['estimated_cycles'] * per_ms:>10.3f} {bound * per_ms:>8.3f} "
                    f"{grouped['estimated_cycles'] / bound:>12.3f}x {flat['dram_bytes'] / mib:>12.2f} "
                    f"{grouped['dram_bytes'] / mib:>8.2f} {grouped['compulsory_dram_bytes'] / mib:>10.2f} "
                    f"{grouped['dram_bytes'] / grouped['compulsory_dram_bytes']:>11.2f}x "
                    f"{grouped['estimated_cycles'] / grouped['roofline_cycles_at_widths']:>12.3f}x"
                )
        store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
