"""Printed pages for the text models' calibration and tuning split, fetched from source
distributions on PyPI by pinned version and sha256 (never committed). Three test images of
OCRmyPDF's:

- `linn.png`, a 300 dpi scan of a two-column LinnSequencer brochure page (Wikimedia Commons,
  CC-BY-SA-3.0, per the archive's REUSE.toml);
- `typewriter.png`, a scan of a typewritten Dutch recipe (Wikimedia Commons, (C) 2005 Ellywa,
  GFDL-1.2-or-later or CC-BY-SA);
- `c03-29.pdf`, whose one image is Project Gutenberg's scan of page 29 of Adventures of
  Huckleberry Finn (public domain): an old book page, yellowed paper, an engraving beside the
  text, the page unlike the white scans and the photographs the text models calibrate on.

and one sample image of OpenCV's (the opencv-python source distribution, Apache-2.0):

- `sudoku.png`, a photograph of a newspaper's Sudoku under dim, uneven light, with printed
  lines of text above and beside the grid: the only photographed printed page found in a PyPI
  archive besides the evaluation page, so the tuning split's stand-in for it.

Cut into square crops whose text lines come out about as tall, at the detector's input size, as
those of the evaluation page (scikit-image's page.png halves), for the text detector; and into
single text lines as a detector hands them to the direction classifier (`write_lines`), for the
classifier's tuning split. Neither page is evaluation data (benchmarks/ptq_vs_ort.py).
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path
from typing import NamedTuple

from _sdist import fetch_sdist

OCRMYPDF = {
    "package": "ocrmypdf",
    "version": "17.13.0",
    "sha256": "151c35d810eb628fbc5cb9bbe80b834ecf094737efa0e7a2e9e1fac3c730ed49",
}
OPENCV = {
    "package": "opencv-python",
    "version": "4.12.0.88",
    "sha256": "8b738389cede219405f6f3880b851efa3415ccd674752219377353f017d2994d",
}


class Scan(NamedTuple):
    archive: dict  # the pinned source distribution that holds the page
    member: str  # the page's path in it
    sha256: str  # the page's own digest
    side: int  # crop side in pixels
    across: int  # crops across the page
    down: int  # crops down the page


SCANS = {
    "linn": Scan(
        OCRMYPDF,
        "ocrmypdf-17.13.0/tests/resources/linn.png",
        "dcd90f08a6b8a733612f818330153636c13283dd548e2e092cad1fe628ec7bf3",
        side=700,
        across=3,
        down=4,
    ),
    "typewriter": Scan(
        OCRMYPDF,
        "ocrmypdf-17.13.0/tests/resources/typewriter.png",
        "6f7a83685a83af954e9672b3e2db3253af165513d2826d780a48e175742f4469",
        side=1400,
        across=4,
        down=2,
    ),
    "huck": Scan(
        OCRMYPDF,
        "ocrmypdf-17.13.0/tests/resources/c03-29.pdf",
        "c2ff83af7d028c95209cc7eebdf80fd5bb4cd292973ed6601e4bab7d1929f201",
        side=390,  # its lines are 15 px high: at the detector's input as tall as the brochure's
        across=2,
        down=3,
    ),
    "sudoku": Scan(
        OPENCV,
        "opencv-python-4.12.0.88/opencv/samples/data/sudoku.png",
        "3cd9ab173f7178c0a16bba9f867062b58b5d60918d5aeb8ced85cba0b24c353a",
        side=220,  # its small print comes out as tall as the evaluation page's lines, its digits taller
        across=3,
        down=3,
    ),
}
SAVED_SIDE = 480  # crops are stored this size (the detector's sets resize them again)


def scan(name: str, cache: Path):
    """One page as an RGB PIL image, its archive and its bytes checked against the pinned sha256s."""
    from PIL import Image

    page = SCANS[name]
    with tarfile.open(fetch_sdist(page.archive, cache)) as tar:
        data = tar.extractfile(page.member).read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != page.sha256:
        pin = page.archive
        raise SystemExit(
            f"{pin['package']}-{pin['version']}:{page.member}: sha256 {digest}, pinned {page.sha256}"
        )
    if page.member.endswith(".pdf"):
        data = pdf_jpeg(data)
    return Image.open(io.BytesIO(data)).convert("RGB")


def pdf_jpeg(pdf: bytes) -> bytes:
    """The one JPEG image stream of a pinned single-image PDF (its dictionary names the length)."""
    import re

    found = [
        m
        for m in re.finditer(rb"<<([^<>]*/Subtype\s*/Image[^<>]*)>>\s*stream\r?\n", pdf)
        if b"/DCTDecode" in m.group(1)
    ]
    if len(found) != 1:
        raise SystemExit(f"{len(found)} JPEG images in the PDF, one expected")
    length = int(re.search(rb"/Length (\d+)", found[0].group(1)).group(1))
    return pdf[found[0].end() : found[0].end() + length]


def write_crops(name: str, dest: Path, cache: Path) -> int:
    """The scan's crops as dest/<name>_<k>.png, a grid of equal squares spanning the page; returns
    how many."""
    from PIL import Image

    image = scan(name, cache)
    page = SCANS[name]
    side, across, down = page.side, page.across, page.down
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


# Where a page's column of body text lies (x from, x to, y from, y to), in its pixels, and how
# high a run of inked rows must be to be a line, not a speck or a descender's tail
LINES_AREA = {"linn": ((400, 1200, 1330, 2250), 20), "huck": ((25, 760, 690, 990), 10)}
LINE_INK = 0.02  # a row of the area is in a text line when this share of its pixels is dark


def write_lines(name: str, dest: Path, cache: Path, count: int = 8) -> int:
    """`count` text lines of the scan's body text, spread down its column, each cut as a text
    detector's box would be (the line with a sixth of its height above and below, four times as
    wide as high) and saved at the direction classifier's 48 x 192, upright (<name>_line<k>_up)
    and turned 180 degrees (<name>_line<k>_down); returns how many images. Lines are found from
    the rows' ink (a horizontal projection), so no coordinates of single lines are kept here."""
    import numpy as np
    from PIL import Image

    image = scan(name, cache)
    (x0, x1, y0, y1), shortest_line = LINES_AREA[name]
    gray = np.asarray(image.convert("L"))[y0:y1, x0:x1]
    inked = (gray < 128).mean(axis=1) > LINE_INK
    lines, start = [], None
    for y, row in enumerate([*inked, False]):
        if row and start is None:
            start = y
        elif not row and start is not None:
            if y - start >= shortest_line:
                lines.append((y0 + start, y0 + y))
            start = None
    if len(lines) < count:
        raise SystemExit(f"{name}: {len(lines)} text lines found, {count} wanted")
    dest.mkdir(parents=True, exist_ok=True)
    picked = [lines[k * len(lines) // count] for k in range(count)]
    for k, (top, bottom) in enumerate(picked):
        margin = (bottom - top) // 6
        height = bottom - top + 2 * margin
        box = (x0, top - margin, x0 + 4 * height, bottom + margin)
        line = image.crop(box).resize((192, 48), Image.BILINEAR)
        line.save(dest / f"{name}_line{k}_up.png")
        line.transpose(Image.ROTATE_180).save(dest / f"{name}_line{k}_down.png")
    return 2 * count
