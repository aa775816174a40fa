"""Mixed precision on YOLOv8n and PP-OCRv4 det, goals cosine >= 0.99 and >= 0.999.

    python benchmarks/mixed_precision.py

For each: goal reached (on the held-out half of the evaluation images), the integer model's
cosine and SQNR on all the evaluation images (golden interpreter, not the search's own estimate),
the share of MACs left in int8, the time of the sensitivity pass and of the search (from the
build's action timings), the figures on the searched and the held-out images, the estimated
latency against the int8 build's, and the search's cost of its table against codegen's estimate.
Next to it, the int8-only model and TPU-MLIR's recipe of keeping the N = 5 most sensitive layers
float (ranked by the SQNR of quantizing that layer alone, as run_sensitive_layer does).

Data: YOLO is calibrated on 36 crops of six photographs and evaluated on 16 crops of three other
photographs; the text detector is calibrated on 16 crops of the left half of a photograph of text
and evaluated on 16 crops of its right half (the other photographs show no text, so its output
would be ~0 everywhere).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _workspace_gen import EXAMPLE, crop_workspace  # noqa: E402

MODELS = {
    "yolo": ("yolov8n", "yolo_calib", "yolo_eval16"),
    "det": ("ppocr_det", "text_calib16", "text_eval16"),
}
# name suffix -> (cosine goal, what the search minimises)
GOALS = {"99": (0.99, "cycles"), "999": (0.999, "cycles"), "99m": (0.99, "non_int8_macs")}
TPU_MLIR_N = 5


def text_crops(dest: Path, half: int, count: int = 16) -> None:
    """Crops of one half of the photograph of text (0: left, 1: right), so that the detector's
    calibration and evaluation crops share no pixels."""
    from PIL import Image

    image = Image.open(EXAMPLE / "data" / "photos" / "text" / "text.png").convert("RGB")
    w, h = image.size
    x0, hw = half * (w // 2), w // 2
    dest.mkdir(parents=True, exist_ok=True)
    for k in range(count):
        scale = (0.6, 0.75, 0.9, 1.0)[k % 4]
        cw, ch = int(hw * scale), int(h * scale)
        x = x0 + (hw - cw) * ((k * 37) % 11) // 10
        y = (h - ch) * ((k * 53) % 7) // 6
        crop = image.crop((x, y, x + cw, y + ch))
        crop.save(dest / f"text_{k}.png")


def workspace(root: Path) -> None:
    crop_workspace(root)
    text_crops(root / "data" / "crops" / "text_calib", 0)
    text_crops(root / "data" / "crops" / "text", 1)
    data = root / "data" / "BUILD"
    data.write_text(
        data.read_text()
        + (
            '\ndataset(name = "yolo_eval16", srcs = glob(["crops/eval/*.png"]),\n'
            "        preprocess = YOLO, limit = 16)\n"
            "OCR_DET480 = dict(OCR_DET, resize = [480, 480])\n"
            'dataset(name = "text_eval16", srcs = glob(["crops/text/*.png"]),\n'
            "        preprocess = OCR_DET480, limit = 16)\n"
            'dataset(name = "text_calib16", srcs = glob(["crops/text_calib/*.png"]),\n'
            "        preprocess = OCR_DET480)\n"
        )
    )
    models = root / "models" / "BUILD"
    text = models.read_text().split("npu_model(")[0]
    # the detector at 480 x 480, where the handwriting of text.png gives it text to find (at the
    # example's 320 its text map is ~0 on these crops)
    assert text.count('"x": [1, 3, 320, 320]') == 1
    text = text.replace('"x": [1, 3, 320, 320]', '"x": [1, 3, 480, 480]')
    for short, (model, calib, evaluation) in MODELS.items():
        common = f'model = ":{model}", calibration = "//data:{calib}", evaluation = "//data:{evaluation}"'
        text += f'npu_model(name = "{short}_int8", {common})\n'
        for key, (cos, minimize) in GOALS.items():
            goal = f'mixed_precision = {{"goal": {{"cosine": {cos}}}, "minimize": "{minimize}"}}'
            text += f'npu_model(name = "{short}_mp{key}", {common}, {goal})\n'
    models.write_text(text)


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
    parser.add_argument("--goals", nargs="+", choices=sorted(GOALS), default=sorted(GOALS))
    args = parser.parse_args()
    for name in [m for m in MODELS if m not in args.models]:
        del MODELS[name]
    for key in [g for g in GOALS if g not in args.goals and g != "99"]:  # 99 names the TPU-MLIR layers
        del GOALS[key]
    from npubuild.cache.store import Store
    from npubuild.engine.run import build

    tmp = Path(tempfile.mkdtemp(prefix="npubuild-mp-"))
    try:
        ws = tmp / "ws"
        workspace(ws)
        store = Store(tmp / "cache")
        targets = [f"//models:{s}_{v}" for s in MODELS for v in ("int8", *(f"mp{k}" for k in GOALS))]
        outcome = build(ws, store, targets, jobs=1)
        assert outcome.ok, outcome.errors
        seconds = {
            (a.stage, a.owner): outcome.result(a).seconds
            for a in outcome.actions
            if outcome.result(a).status == "ran"
        }
        out = ws / "npubuild-out" / "models"

        def accuracy(name):
            (m,) = json.loads((out / name / "accuracy.json").read_text())["outputs"].values()
            return m

        # TPU-MLIR's recipe, from the same sensitivity pass
        models_build = ws / "models" / "BUILD"
        extra = ""
        for short, (model, calib, evaluation) in MODELS.items():
            sens = json.loads((out / f"{short}_mp99" / "sensitivity.json").read_text())
            worst = sorted(sens["layers"], key=lambda r: r["quantized_alone"]["sqnr_db"])[:TPU_MLIR_N]
            table = {"version": 1, "layers": {r["node"]: "float" for r in worst}}
            (ws / "models" / f"{short}_tpu.json").write_text(json.dumps(table))
            extra += (
                f'npu_model(name = "{short}_tpu", model = ":{model}", calibration = "//data:{calib}", '
                f'evaluation = "//data:{evaluation}", precision_table = "{short}_tpu.json")\n'
            )
        models_build.write_text(models_build.read_text() + extra)
        second = build(ws, store, [f"//models:{s}_tpu" for s in MODELS], jobs=1)
        assert second.ok, second.errors

        for short, (model, _, _) in MODELS.items():
            sens_s = next(
                v
                for (stage, owner), v in seconds.items()
                if stage == "sensitivity" and owner.startswith(f"//models:{short}_mp")
            )
            base = accuracy(f"{short}_int8")
            print(f"\n{short} ({model}); sensitivity pass {sens_s:.0f} s, shared by both goals")
            print(
                f"  {'configuration':<34} {'reached':>7} {'cosine':>8} {'SQNR dB':>8} "
                f"{'int8 MACs':>9} {'time s':>7}"
            )
            print(f"  {'int8 only':<34} {'':>7} {base['cosine']:>8.4f} {base['sqnr_db']:>8.2f} {'100.0%':>9}")
            tpu = accuracy(f"{short}_tpu")
            tpu_share = _share(
                out / f"{short}_mp99" / "search.json",
                json.loads((ws / "models" / f"{short}_tpu.json").read_text())["layers"],
            )
            print(
                f"  {f'TPU-MLIR: {TPU_MLIR_N} most sensitive float':<34} {'':>7} {tpu['cosine']:>8.4f} "
                f"{tpu['sqnr_db']:>8.2f} {tpu_share:>8.1%}"
            )
            for key, (cos, minimize) in GOALS.items():
                name = f"{short}_mp{key}"
                search = json.loads((out / name / "search.json").read_text())
                acc = accuracy(name)
                t = sens_s + seconds.get(("search", f"//models:{name}"), 0.0)
                label = f"npubuild, goal cosine >= {cos}" + (", min MACs" if minimize != "cycles" else "")
                print(
                    f"  {label:<34} {'yes' if search['reached'] else 'no':>7} {acc['cosine']:>8.4f} "
                    f"{acc['sqnr_db']:>8.2f} {search['int8_mac_share']:>8.1%} {t:>7.0f}"
                )
                compiled, ms, int8_ms = _latencies(out, name, f"{short}_int8")
                held = search.get("held_out") or {}
                print(
                    f"      searched on {search['search_split']['samples']}: cosine "
                    f"{search['search_split']['cosine']:.4f}; held out {held.get('samples', 0)}: cosine "
                    f"{held.get('cosine', float('nan')):.4f}; "
                    f"latency {ms:.2f} ms = {ms / int8_ms:.2f}x int8; "
                    f"search's cost {search['cost']:,} cycles vs codegen {compiled:,.0f} "
                    f"({search['cost'] / compiled - 1:+.1%})"
                )
                promoted = {k: v for k, v in search["precision"].items() if v != "int8"}
                print(
                    f"      {len(promoted)} layers above int8 "
                    f"({sum(v == 'int16' for v in promoted.values())} int16, "
                    f"{sum(v == 'float' for v in promoted.values())} float); {len(search['path'])} runs"
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _latencies(out: Path, name: str, int8_name: str) -> tuple[float, float, float]:
    """codegen's estimated latency of a build in NPU cycles and in ms, and the int8 build's ms."""
    from npubuild.targets.spec import BUILTIN_TARGETS

    target = BUILTIN_TARGETS[json.loads((out / name / "partition.json").read_text())["target"]]
    ms = json.loads((out / name / "codegen.json").read_text())["estimated_latency_ms"]
    int8_ms = json.loads((out / int8_name / "codegen.json").read_text())["estimated_latency_ms"]
    return ms * target.clock_mhz * 1000, ms, int8_ms


def _share(search_json: Path, table: dict[str, str]) -> float:
    """Share of MACs in int8 for a table, with the MAC counts the search reported."""
    search = json.loads(search_json.read_text())
    from npubuild.stages.quantize.cost import op_work  # noqa: F401  (documented source of the counts)

    macs = search.get("macs", {})
    total = sum(macs.values())
    return 1 - sum(macs.get(k, 0) for k, v in table.items() if v != "int8") / total if total else float("nan")


if __name__ == "__main__":
    main()
