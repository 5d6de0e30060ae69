"""The first half-minute: time from `make run` to its URL printed, and to the Overview rendered in Chromium.

`make run` serves the dashboard on a copy of the shipped `runs.duckdb` while its quick sweep records into that copy
(the repository's own file is left alone); the clock stops when the Overview's script has finished and a chart is
on the page. Usage: `python bench/first_view.py` (Chromium from `make browser`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `python bench/first_view.py` puts bench/, not the repository, on the path

from bench.load import CHROMIUM, LAUNCH_ARGS, READY, free_port  # noqa: E402

CHART = '[data-testid="stVegaLiteChart"]'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, default=ROOT / "runs.duckdb", help="copied, then served")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="specdash-first-view-") as scratch:
        db, port = Path(scratch) / "runs.duckdb", free_port()
        shutil.copy(args.db, db)
        start = time.perf_counter()
        proc = subprocess.Popen(["make", "run", f"DB={db}", f"PORT={port}"], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            first = next(line.strip() for line in proc.stdout if "http://" in line)  # after any set-up output
            url_s = time.perf_counter() - start
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)
                page = browser.new_page()
                page.goto(f"http://127.0.0.1:{port}/", timeout=120_000)
                page.wait_for_selector(READY, timeout=120_000)
                page.wait_for_selector(CHART, timeout=120_000)
                page_s = time.perf_counter() - start
                browser.close()
        finally:
            os.killpg(proc.pid, signal.SIGINT)  # the dashboard and its sweep, as Ctrl-C would
            proc.wait(timeout=60)
    print(f"make run printed {first!r} after {url_s:.1f} s; the Overview rendered (a chart on the page) after "
          f"{page_s:.1f} s")


if __name__ == "__main__":
    main()
