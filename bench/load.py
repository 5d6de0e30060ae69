"""Load: N concurrent browser sessions open the dashboard's Overview on a running `streamlit run`.

    python bench/load.py --db runs.duckdb                 # start the app on a free port, 20 sessions, 1 round
    python bench/load.py --db runs.duckdb --rounds 3      # three waves of 20
    python bench/load.py --url http://127.0.0.1:8501      # an app that is already running

One Debian Chromium headless shell (docs/design.md, "Browser testing"), one context (its own cookies, so its own
Streamlit session) per session, all opened at once from the async Playwright API. A session counts as rendered
when the app says its script is done (`[data-testid="stApp"][data-test-script-state="notRunning"]`) with a chart
visible; it counts as an error when the page shows an exception (`stException`), an error box (`stAlert` of kind error),
or does not render within the timeout. Prints p50 and p95 of the render times (navigation start to rendered).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `python bench/load.py` puts bench/, not the repository, on the path

from runner.serve import start_dashboard, stop, wait_until_healthy  # noqa: E402

CHROMIUM = "/usr/bin/chromium-headless-shell"
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
               "--disable-component-update", "--no-first-run"]
READY = '[data-testid="stApp"][data-test-script-state="notRunning"]'
CHART = '[data-testid="stVegaLiteChart"]'
PROBLEMS = '[data-testid="stException"], [data-testid="stAlertContentError"]'


@dataclass(frozen=True)
class Session:
    """One browser session's outcome."""

    index: int
    seconds: float  # from navigation start to rendered (or to the failure)
    error: str | None  # None when the Overview rendered with a chart and no exception


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(db: Path, log: Path, port: int | None = None, timeout_s: float = 90,
          cwd: Path | None = None) -> Iterator[str]:
    """`runner serve`'s dashboard on 127.0.0.1 over `db`, reading the .streamlit/ in `cwd`; yields its base URL and
    stops it afterwards."""
    port = port or free_port()
    with log.open("w") as out:
        server = start_dashboard(db, port, out, address="127.0.0.1", cwd=cwd)
    try:
        wait_until_healthy(server, port, timeout_s, address="127.0.0.1")
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(server)


async def _one(browser, url: str, index: int, timeout_s: float) -> Session:
    context = await browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = await context.new_page()
        page.set_default_timeout(timeout_s * 1000)
        started = time.perf_counter()
        try:
            await page.goto(url)
            await page.wait_for_selector(CHART, state="visible")
            await page.wait_for_selector(READY)
        except Exception as error:  # noqa: BLE001 - a timeout is this session's failure, not the bench's
            return Session(index, time.perf_counter() - started, f"{type(error).__name__}: {str(error)[:200]}")
        seconds = time.perf_counter() - started
        problems = await page.locator(PROBLEMS).all_inner_texts()
        return Session(index, seconds, f"shown on the page: {problems[0][:200]}" if problems else None)
    finally:
        await context.close()


async def _wave(url: str, sessions: int, timeout_s: float, args: list[str]) -> list[Session]:
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        try:
            return list(await asyncio.gather(*(_one(browser, url, i, timeout_s) for i in range(sessions))))
        finally:
            await browser.close()


def open_sessions(url: str, sessions: int = 20, timeout_s: float = 120, args: list[str] = LAUNCH_ARGS) -> list[Session]:
    """`sessions` browser sessions opening `url` at once (Chromium started with `args`); each one's render time or
    error."""
    return asyncio.run(_wave(url, sessions, timeout_s, args))


def percentile(values: list[float], share: float) -> float:
    """Nearest-rank percentile: p95 of 20 values is the 19th smallest."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(share * len(ordered) + 0.5) - 1))]


def summary(results: list[Session]) -> str:
    times = [r.seconds for r in results if r.error is None]
    errors = [r for r in results if r.error is not None]
    line = f"{len(results)} sessions: {len(times)} rendered, {len(errors)} errors"
    line += f" (load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
    if times:
        line += (f"; render p50 {statistics.median(times):.2f} s, p95 {percentile(times, 0.95):.2f} s, "
                 f"max {max(times):.2f} s")
    return line + "".join(f"\n  session {r.index}: {r.error}" for r in errors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", type=Path, default=ROOT / "runs.duckdb", help="started app's database")
    parser.add_argument("--url", help="an app already running (then --db is not used)")
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=1, help="waves of --sessions, one after the other")
    parser.add_argument("--timeout", type=float, default=120, help="seconds a session may take")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(serve(args.db.resolve(), Path("/tmp/specdash-load-streamlit.log")))
        open_sessions(url, 1, args.timeout)  # one warm-up: imports and the first connection, not measured
        results: list[Session] = []
        for wave in range(args.rounds):
            got = open_sessions(url, args.sessions, args.timeout)
            print(f"wave {wave + 1}: {summary(got)}", flush=True)
            results += got
    if args.rounds > 1:
        print(f"all waves: {summary(results)}")
    sys.exit(1 if any(r.error for r in results) else 0)


if __name__ == "__main__":
    main()
