"""Copy the browser tour's screenshots into docs/screenshots/pages/ for docs/dashboard.md, smaller.

The tour (tests/dashboard/browser/test_tour.py, and the first-run flow) screenshots every page at
1280 px and 390 px under ``$STROP_TEST_ARTIFACTS/screenshots``. This keeps each page's pair,
renamed by width, as a palette PNG (a dashboard has few colours: about a quarter of the bytes)
cut at MAX_HEIGHT, and prints the table docs/dashboard.md lists them in:

    .venv/bin/python -m pytest tests/dashboard/browser/test_tour.py tests/dashboard/browser/test_first_run_flow.py
    .venv/bin/python -m tests.dashboard.docs_screenshots
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from PIL import Image

REPO_ROOT = Path(__file__).resolve().parents[2]
SOURCE = Path(os.environ.get("STROP_TEST_ARTIFACTS", REPO_ROOT / "var" / "test-artifacts")) / "screenshots"
TARGET = REPO_ROOT / "docs" / "screenshots" / "pages"
WIDTHS = {"desktop": 1280, "phone": 390}
COLOURS = 64
# A long list (50 interactions) is cut at this height: the docs show its top, the tour checks it all.
MAX_HEIGHT = 2400
# Steps of the flows (tests/dashboard/browser/test_flows.py) and states of a page already shown:
# the docs show each page once.
SKIP = {"interaction-withheld", "interactions-withheld", "webhooks-with-delivery", "webhook-rotated"}
SKIP_PREFIX = "flow-"


def shrink(source: Path, target: Path) -> int:
    with Image.open(source) as image:
        top = image.crop((0, 0, image.width, min(image.height, MAX_HEIGHT)))
        small = top.convert("RGB").quantize(colors=COLOURS, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        small.save(target, optimize=True)
    return target.stat().st_size


def main() -> int:
    names = {p.name.rsplit("-", 1)[0] for p in SOURCE.glob("*-desktop.png")}
    pages = sorted(name for name in names - SKIP if not name.startswith(SKIP_PREFIX))
    if not pages:
        print(f"no screenshots under {SOURCE}: run the browser tour first", file=sys.stderr)
        return 1
    TARGET.mkdir(parents=True, exist_ok=True)
    total = 0
    rows = []
    for page in pages:
        cells = []
        for label, width in WIDTHS.items():
            source = SOURCE / f"{page}-{label}.png"
            if not source.exists():
                cells.append("–")
                continue
            name = f"{page}-{width}.png"
            total += shrink(source, TARGET / name)
            cells.append(f"[{width} px](screenshots/pages/{name})")
        rows.append(f"| {page} | {' | '.join(cells)} |")
    print("| page | " + " | ".join(f"{w} px" for w in WIDTHS.values()) + " |")
    print("|---|" + "---|" * len(WIDTHS))
    print("\n".join(rows))
    print(f"{len(rows)} pages, {total / 1e6:.1f} MB in {TARGET.relative_to(REPO_ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
