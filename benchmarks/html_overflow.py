"""Does any element of an HTML report pass the right edge of a 1200 px window? (issue 18)

    python benchmarks/html_overflow.py report.html [more.html ...] [--screenshot-dir DIR]

Loads each page in headless Chromium (`chromium` on PATH: Debian's package) at 1200 px, with a
script appended to a copy of the page that lists every element whose right edge is beyond the
viewport and compares the page's scroll width with its client width. Prints one line per page
and exits 1 if anything overflows. With --screenshot-dir, also writes a PNG of each page.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

WIDTH = 1200
PROBE = """
<script>
window.addEventListener("load", () => {
  const width = document.documentElement.clientWidth;
  const over = [];
  for (const el of document.querySelectorAll("body *")) {
    const box = el.getBoundingClientRect();
    if (box.width > 0 && box.right > width + 0.5) {
      const name = el.tagName.toLowerCase() + (el.className ? "." + el.className : "");
      over.push(name + "@" + Math.round(box.right));
    }
  }
  const result = document.createElement("pre");
  result.id = "overflow-probe";
  const scroll = document.documentElement.scrollWidth;
  result.textContent = ["OVERFLOW", scroll, width, over.length, ...over.slice(0, 5)].join(" ");
  document.body.appendChild(result);
});
</script>
"""


def check(page: Path, chromium: str, screenshot_dir: Path | None) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / page.name
        probe.write_text(page.read_text() + PROBE)
        flags = [
            "--headless=new",
            "--no-sandbox",
            f"--window-size={WIDTH},1400",
            "--virtual-time-budget=3000",
        ]
        dom = subprocess.run(
            [chromium, *flags, "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120
        ).stdout
        if screenshot_dir is not None:
            shot = screenshot_dir / (page.stem + ".png")
            subprocess.run(
                [chromium, *flags, f"--screenshot={shot}", page.resolve().as_uri()],
                capture_output=True,
                timeout=120,
            )
    found = re.search(r"OVERFLOW (\d+) (\d+) (\d+) ?([^<]*)", dom)
    if not found:
        print(f"{page}: the probe did not run")
        return False
    scroll, client, count, examples = int(found[1]), int(found[2]), int(found[3]), found[4]
    ok = count == 0 and scroll <= client
    print(f"{page}: scroll width {scroll}, client width {client}, {count} elements past the edge {examples}")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("pages", nargs="+", type=Path)
    parser.add_argument("--screenshot-dir", type=Path)
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("chromium is not on PATH (apt-get install chromium)")
    results = [check(page, chromium, args.screenshot_dir) for page in args.pages]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
