"""How much of a ptq_vs_ort.py row is the calibration draw: the row rebuilt with each calibration
photograph's crops left out in turn, every tool on the same smaller set.

    python benchmarks/calibration_draws.py [--validation] [MODEL ...]   (default: ocr_det ocr_cls)

ptq_vs_ort.py's calibration set is six crops from each of six photographs (four on the tuning
split); a user's set is another draw of such images. Its bootstrap (benchmarks/_resampling.py)
says how far a row moves with the evaluation images; this says how far it moves with the
calibration images. Per draw, npubuild's default integer model (its accuracy.json) and the best of
onnxruntime's and NNCF's models (ptq_vs_ort.every_tool: the same tools, each scored the same two
ways), their SQNR difference in dB, and at the end, per model, the difference on the whole set,
its least, median and largest value over the draws, and in how many draws npubuild is at least as
good. The text models' handwriting crops and scanned pages stay in every draw: only the
photographs are left out. Nothing is tuned on this: it reads the evaluation split like
ptq_vs_ort.py and prints figures only.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _workspace_gen import crop_workspace  # noqa: E402
from ptq_vs_ort import (  # noqa: E402
    MODELS,
    SHARES_ACTIONS_WITH,
    TUNING_ONLY,
    add_corpus_models,
    add_text_scans,
    best_other,
    every_tool,
)

PHOTO_CROPS = 'CALIBRATION = glob(["crops/calib/*.png"])'


def without(photo: str | None) -> str:
    """The data/BUILD line of the photo crops, one photograph's crops (`<photo>_<k>.png`) left
    out (None: all). The digit after the underscore keeps a photograph whose name extends another's
    (`grace` and `grace_hopper`) in."""
    if photo is None:
        return PHOTO_CROPS
    return f'CALIBRATION = glob(["crops/calib/*.png"], exclude = ["crops/calib/{photo}_[0-9]*.png"])'


def summary(differences: dict[str | None, float]) -> str | None:
    """One model's line over its draws (`differences`: npubuild minus the best other tool, dB, by
    the photograph left out, None for the whole set); None without a draw."""
    draws = np.array([v for photo, v in differences.items() if photo is not None])
    if draws.size == 0:
        return None
    whole = f"{differences[None]:+.2f}" if None in differences else "n/a"
    return (
        f"whole set {whole}; one photograph left out ({len(draws)} draws): least "
        f"{draws.min():+.2f}, median {float(np.median(draws)):+.2f}, largest {draws.max():+.2f}; "
        f"at least as good in {(draws >= 0).sum()} of {len(draws)}"
    )


def main() -> None:
    import argparse
    import logging

    parser = argparse.ArgumentParser()
    parser.add_argument("--validation", action="store_true", help="the tuning split (ptq_vs_ort.py's)")
    parser.add_argument("models", nargs="*", choices=[[], *MODELS], help="default: ocr_det ocr_cls")
    args = parser.parse_args()
    models = args.models or ["ocr_det", "ocr_cls"]
    if "vad" in models:
        parser.error("vad calibrates on speech, not on the photographs")
    if not args.validation and set(models) & set(TUNING_ONLY):
        parser.error(f"{', '.join(TUNING_ONLY)} are on the tuning split only (--validation)")

    logging.getLogger().setLevel(logging.ERROR)  # onnxruntime.quantization warns per tensor
    from npubuild.cache.store import Store
    from npubuild.engine.run import build

    tmp = Path(tempfile.mkdtemp(prefix="npubuild-draws-"))
    try:
        ws = tmp / "ws"
        crop_workspace(ws, validation=args.validation)
        add_corpus_models(ws, args.validation)
        if {"ocr_det", "ocr_cls", *SHARES_ACTIONS_WITH} & set(models):
            add_text_scans(ws, args.validation)
        data = ws / "data" / "BUILD"
        text = data.read_text()
        assert PHOTO_CROPS in text, "the crop workspace no longer lists its photo crops as expected"
        crops = (ws / "data" / "crops" / "calib").glob("*.png")
        photos = sorted({crop.stem.rsplit("_", 1)[0] for crop in crops})
        store = Store(tmp / "cache")
        differences: dict[str, dict[str | None, float]] = {m: {} for m in models}  # by photo left out
        for photo in [None, *photos]:
            data.write_text(text.replace(PHOTO_CROPS, without(photo)))
            outcome = build(ws, store, [f"//models:{m}" for m in models], jobs=2)
            assert outcome.ok, outcome.errors
            for m in models:
                # (no time column here: 0.0 stands for npubuild's calibrate and quantize seconds)
                calib, _, rows = every_tool(ws, store, m, 0.0, tmp / f"{m}-{photo or 'all'}")
                best = best_other(rows)
                if best is None:
                    print(f"{m}: every other tool failed")
                    continue
                difference = rows[0][2] - best[2]
                differences[m][photo] = difference
                print(
                    f"{m:<12} without {photo or '(none)':<18} {calib:>3} calibration images: npubuild "
                    f"{rows[0][2]:6.2f} dB, best other tool {best[0]} {best[2]:6.2f} dB, "
                    f"difference {difference:+6.2f}",
                    flush=True,
                )
        print("\nsummary (SQNR difference npubuild - best other tool, dB)")
        for m, values in differences.items():
            line = summary(values)
            if line is not None:
                print(f"  {m:<12} {line}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
