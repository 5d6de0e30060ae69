"""The docs' picture of the dashboard: a page of a running dashboard over a recorded file, as a small PNG.

    python bench/screenshot.py --db runs.duckdb --out docs/img/overview.png     # the Overview, as the README shows it
    python bench/screenshot.py --page compare?category=summary --out /tmp/compare.png

Starts `runner serve`'s dashboard on a free port on 127.0.0.1 (bench/load.py's `serve`), opens the page in Debian's
Chromium headless shell once the app says its script is done with a chart drawn, and saves the top of the page
reduced to a 256-colour palette, which keeps the file a fraction of a full-colour PNG's size.
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `python bench/screenshot.py` puts bench/, not the repository, on the path

from PIL import Image  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

from bench.load import CHART, CHROMIUM, LAUNCH_ARGS, READY, serve  # noqa: E402


def capture(url: str, width: int, height: int, timeout_s: float) -> bytes:
    """The page at `url` once rendered, as PNG bytes of its first `height` pixels at `width`."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.goto(url, timeout=timeout_s * 1000)
            page.wait_for_selector(READY, timeout=timeout_s * 1000)
            page.wait_for_selector(CHART, timeout=timeout_s * 1000)
            page.wait_for_timeout(1500)  # the charts draw after the script is done
            return page.screenshot(full_page=False)
        finally:
            browser.close()


def small_png(png: bytes) -> bytes:
    """`png` with its colours reduced to an adaptive 256-colour palette."""
    image = Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, default=ROOT / "runs.duckdb")
    parser.add_argument("--page", default="", help="the page's path and query after the app's root")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "overview.png")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=860)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, serve(args.db, Path(tmp) / "serve.log", timeout_s=args.timeout) as url:
        png = capture(f"{url}/{args.page}", args.width, args.height, args.timeout)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(small_png(png))
    print(f"{args.out}: {args.out.stat().st_size // 1024} KiB")


if __name__ == "__main__":
    main()
