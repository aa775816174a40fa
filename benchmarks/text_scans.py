"""Scanned printed pages for the text models' calibration and tuning split: two test images of
OCRmyPDF's source distribution on PyPI, fetched by pinned version and sha256 (never committed):

- `linn.png`, a 300 dpi scan of a two-column LinnSequencer brochure page (Wikimedia Commons,
  CC-BY-SA-3.0, per the archive's REUSE.toml);
- `typewriter.png`, a scan of a typewritten Dutch recipe (Wikimedia Commons, (C) 2005 Ellywa,
  GFDL-1.2-or-later or CC-BY-SA).

Cut into square crops whose text lines come out about as tall, at the detector's input size, as
those of the evaluation page (scikit-image's page.png halves): the brochure calibrates, the
typewriter page is the tuning split's "evaluation" (it never calibrates), so neither touches the
evaluation images.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

from _sdist import fetch_sdist

SDIST = {
    "package": "ocrmypdf",
    "version": "17.13.0",
    "sha256": "151c35d810eb628fbc5cb9bbe80b834ecf094737efa0e7a2e9e1fac3c730ed49",
}
# name: (archive member, its sha256, crop side in pixels, crops across, crops down)
SCANS = {
    "linn": (
        "ocrmypdf-17.13.0/tests/resources/linn.png",
        "dcd90f08a6b8a733612f818330153636c13283dd548e2e092cad1fe628ec7bf3",
        700,
        3,
        4,
    ),
    "typewriter": (
        "ocrmypdf-17.13.0/tests/resources/typewriter.png",
        "6f7a83685a83af954e9672b3e2db3253af165513d2826d780a48e175742f4469",
        1400,
        4,
        2,
    ),
}
SAVED_SIDE = 480  # crops are stored this size (the detector's sets resize them again)


def scan(archive: Path, name: str):
    """One scan as an RGB PIL image, its bytes checked against the pinned sha256."""
    from PIL import Image

    member, sha256 = SCANS[name][:2]
    with tarfile.open(archive) as tar:
        data = tar.extractfile(member).read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise SystemExit(f"{archive}:{member}: sha256 {digest}, pinned {sha256}")
    return Image.open(io.BytesIO(data)).convert("RGB")


def write_crops(name: str, dest: Path, cache: Path) -> int:
    """The scan's crops as dest/<name>_<k>.png, a grid of equal squares spanning the page; returns
    how many."""
    from PIL import Image

    image = scan(fetch_sdist(SDIST, cache), name)
    side, across, down = SCANS[name][2:]
    w, h = image.size
    dest.mkdir(parents=True, exist_ok=True)
    k = 0
    for row in range(down):
        for col in range(across):
            x = (w - side) * col // max(across - 1, 1)
            y = (h - side) * row // max(down - 1, 1)
            crop = image.crop((x, y, x + side, y + side)).resize((SAVED_SIDE, SAVED_SIDE), Image.BILINEAR)
            crop.save(dest / f"{name}_{k}.png")
            k += 1
    return k
