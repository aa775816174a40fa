"""Generate a workspace of many npu_model targets over the three real models (for benchmarks)."""

from __future__ import annotations

import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "workspace_example"

VARIANTS = [
    {"quantize": {"method": "mse"}},
    {"quantize": {"method": "kl"}},
    {"quantize": {"method": "percentile", "percentile": 99.9}},
    {"quantize": {"method": "minmax", "activation_bits": 16}},
    {"quantize": {"method": "mse", "bias_correction": False}},
]
MODELS = [("yolov8n", "yolo"), ("ppocr_det", "ocr_det"), ("ppocr_cls", "ocr_cls")]
TARGETS = ["vnpu-s", "vnpu-m"]


def copy_example_unfused(dest: Path) -> Path:
    """The example workspace with every npu_model's preprocessing left on the host
    (fuse_preprocess off), so its optimized models take the data sets' tensors as they are."""
    shutil.copytree(EXAMPLE, dest, ignore=shutil.ignore_patterns("npubuild-out"))
    build = dest / "models" / "BUILD"
    build.write_text(build.read_text().replace("fuse_preprocess = True", "fuse_preprocess = False"))
    return dest


def generate(dest: Path, per_model: int = 4) -> int:
    """Copy the example's data and models packages and add per_model npu_models per model."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(EXAMPLE, dest, ignore=shutil.ignore_patterns("npubuild-out"))
    lines = [(EXAMPLE / "models" / "BUILD").read_text().split("npu_model(")[0]]
    count = 0
    for model, data in MODELS:
        for i in range(per_model):
            variant = VARIANTS[i % len(VARIANTS)]
            target = TARGETS[(i // len(VARIANTS)) % len(TARGETS)]
            lines.append(
                f'npu_model(name = "{data}_{i}", model = ":{model}", calibration = "//data:{data}_calib",\n'
                f'          evaluation = "//data:{data}_eval", target = "{target}",\n'
                f"          quantize = {variant['quantize']!r})\n"
            )
            count += 1
    (dest / "models" / "BUILD").write_text("\n".join(lines))
    return count


VALIDATION_PHOTOS = ("hubble_deep_field", "rocket")  # of the calibration photos


def photo_crops(
    dest: Path, per_calibration_photo: int = 6, per_evaluation_photo: int = 6, validation: bool = False
) -> tuple[int, int]:
    """Deterministic crops of the committed photographs: calibration crops come only from the
    calibration photos and evaluation crops only from the evaluation photos (disjoint sets).
    `validation`: the split defaults are tuned on, which never touches the evaluation photos:
    calibration crops from four calibration photos, "evaluation" crops from the other two."""
    from PIL import Image

    photos = EXAMPLE / "data" / "photos"
    calib = sorted(p for p in (photos / "calib").glob("*") if p.suffix.lower() in (".jpg", ".png"))
    evaluation = sorted(p for p in (photos / "eval").glob("*") if p.suffix.lower() in (".jpg", ".png"))
    if validation:
        evaluation = [p for p in calib if p.stem in VALIDATION_PHOTOS]
        calib = [p for p in calib if p.stem not in VALIDATION_PHOTOS]
    counts = []
    splits = (("calib", per_calibration_photo, calib), ("eval", per_evaluation_photo, evaluation))
    for role, per, sources in splits:
        out = dest / role
        out.mkdir(parents=True, exist_ok=True)
        n = 0
        for src in sources:
            image = Image.open(src).convert("RGB")
            w, h = image.size
            for k in range(per):
                scale = (0.5, 0.65, 0.8)[k % 3]
                cw, ch = int(w * scale), int(h * scale)
                x = (w - cw) * ((k * 37) % 11) // 10
                y = (h - ch) * ((k * 53) % 7) // 6
                crop = image.crop((x, y, x + cw, y + ch))
                if k % 2:
                    crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
                crop.save(out / f"{src.stem}_{k}.png")
                n += 1
        counts.append(n)
    return counts[0], counts[1]


def crop_workspace(
    root: Path, per_calibration_photo: int = 6, per_evaluation_photo: int = 6, validation: bool = False
) -> tuple[int, int]:
    """The example workspace with its data sets pointed at photo crops instead of the photos
    (the text detector keeps its text photos) and its three npu_models at the defaults: no fused
    preprocessing, no precision search, no gates. `validation`: see photo_crops."""

    def skipped(folder: str, names: list[str]) -> list[str]:
        photos = Path(folder).name == "photos"
        return [n for n in names if n == "npubuild-out" or (photos and n in ("calib", "eval"))]

    shutil.copytree(EXAMPLE, root, ignore=skipped)
    models = root / "models" / "BUILD"
    text = models.read_text().split("npu_model(")[0]
    for model, name in MODELS:
        text += (
            f'npu_model(name = "{name}", model = ":{model}", '
            f'calibration = "//data:{name}_calib", evaluation = "//data:{name}_eval")\n'
        )
    models.write_text(text)
    counts = photo_crops(root / "data" / "crops", per_calibration_photo, per_evaluation_photo, validation)
    build = root / "data" / "BUILD"
    text = build.read_text()
    text = text.replace('glob(["photos/calib/*.jpg"])', 'glob(["crops/calib/*.png"])')
    text = text.replace('glob(["photos/eval/*"], exclude=["photos/eval/*.md"])', 'glob(["crops/eval/*.png"])')
    build.write_text(text)
    return counts


def median_seconds(run: Callable, items: Sequence, rounds: int) -> float:
    """Median wall time of run(item) over `rounds` passes through `items`, after one warm-up."""
    run(items[0])
    times = []
    for _ in range(rounds):
        for item in items:
            started = time.perf_counter()
            run(item)
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def onnxruntime_baselines(model_path: Path) -> dict[str, object]:
    """Two onnxruntime sessions of the float model, the baselines a speed ratio is taken against:
    "default" as a user runs it (every graph rewrite, onnxruntime's own thread count) and
    "reference" as npubuild's stages run it (one thread, no rewrites: stages/feeds.session)."""
    import onnx
    import onnxruntime as ort

    from npubuild.stages.feeds import session

    model = onnx.load(model_path)
    default = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return {"default": default, "reference": session(model)}
