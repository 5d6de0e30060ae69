"""`runner serve`: the dashboard on a database at once, and optionally a sweep recording into it meanwhile.

The dashboard answers first (its URL is printed as soon as it does); the sweep then runs as its own process with
`--resume last`, so a sweep interrupted by an earlier Ctrl-C is finished rather than started again. Ctrl-C stops
both; what was recorded stays.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

APP = Path(__file__).resolve().parents[1] / "dashboard" / "app.py"
START_BOUND_S = 120.0  # a cold start on a busy 2-core machine takes seconds, not minutes


class ServeError(RuntimeError):
    """The dashboard could not be started; the message is one line."""


def start_dashboard(db: Path, port: int, out: int | IO = subprocess.DEVNULL,
                    address: str | None = None) -> subprocess.Popen:
    """`streamlit run dashboard/app.py -- --db DB` as a child process; its log to `out`."""
    return subprocess.Popen([
        sys.executable, "-m", "streamlit", "run", str(APP), "--server.headless=true", f"--server.port={port}",
        *([f"--server.address={address}"] if address else []), "--browser.gatherUsageStats=false",
        "--logger.level=error", "--", "--db", str(db)], stdout=out, stderr=subprocess.STDOUT)


def wait_until_healthy(dashboard: subprocess.Popen, port: int, bound_s: float = START_BOUND_S) -> None:
    """Return once the dashboard answers its health check; ServeError if it exits or stays silent."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if dashboard.poll() is not None:
            raise ServeError(f"the dashboard exited with code {dashboard.returncode} (is port {port} in use?)")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise ServeError(f"the dashboard did not answer on port {port} within {bound_s:g} s")


def stop(process: subprocess.Popen | None) -> None:
    """End a child process, politely and then not."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=15)


def serve(db: Path, port: int, sweep: str | None) -> int:
    """Serve until Ctrl-C; with `sweep` (the options of `runner sweep`), record it into `db` meanwhile."""
    dashboard = start_dashboard(db, port)
    recorder = None
    try:
        wait_until_healthy(dashboard, port)
        print(f"dashboard: http://localhost:{port}  (Ctrl-C stops it{' and the sweep' if sweep else ''})", flush=True)
        if sweep:
            recorder = subprocess.Popen([sys.executable, "-m", "runner", "sweep", *shlex.split(sweep),
                                         "--db", str(db), "--resume", "last"])
            if (code := recorder.wait()) != 0:
                print(f"the sweep stopped with exit code {code}; the dashboard goes on", file=sys.stderr, flush=True)
        return dashboard.wait()
    except KeyboardInterrupt:  # the terminal's Ctrl-C reaches the children too; wait for them to stop
        return 0
    finally:
        stop(recorder)
        stop(dashboard)
