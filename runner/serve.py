"""`runner serve`: the dashboard on a database at once, and optionally a sweep recording into it meanwhile.

The dashboard answers first (its URL is printed as soon as it does); the sweep then runs as its own process with
`--resume last`, so a sweep interrupted by an earlier Ctrl-C is finished rather than started again. Ctrl-C, or the
SIGTERM a service manager or `kill` sends, stops both; what was recorded stays.
"""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

APP = Path(__file__).resolve().parents[1] / "dashboard" / "app.py"
START_BOUND_S = 120.0  # a cold start on a busy 2-core machine takes seconds, not minutes
LOCAL_ADDRESSES = ("localhost", "127.0.0.1", "::1")


class ServeError(RuntimeError):
    """The dashboard could not be started; the message is one line."""


def dashboard_option(key: str) -> object:
    """A Streamlit option as `streamlit run dashboard/app.py` started from this folder will read it."""
    from streamlit import config  # streamlit is slow to import and only `serve` needs it

    # What `streamlit run` does first: dashboard/.streamlit/ then counts beside ./.streamlit/ and ~/.streamlit/.
    config._main_script_path = str(APP)
    return config.get_config_options(force_reparse=True)[key].value


def auth_configured(secrets_files: list[str]) -> bool:
    """Whether these secrets (Streamlit's `secrets.files`: TOML files or folders of secrets) have an [auth] section."""
    for name in secrets_files:
        path = Path(name)
        if path.suffix == ".toml" and path.is_file():
            if "auth" in tomllib.loads(path.read_text(encoding="utf-8")):
                return True
        elif (path / "auth").is_dir():
            return True
    return False


def open_warning(address: str | None, port: int) -> str | None:
    """The one line a dashboard without a login says when it listens beyond this machine; None on localhost."""
    if address in LOCAL_ADDRESSES:
        return None
    where = f"on {address}" if address else "on every network interface"
    return (f"warning: no login is configured ([auth] in .streamlit/secrets.toml) and the dashboard listens {where}:"
            f" anyone who can reach port {port} reads every run and can query the database")


def start_dashboard(db: Path, port: int, out: int | IO = subprocess.DEVNULL, address: str | None = None,
                    cwd: Path | None = None) -> subprocess.Popen:
    """`streamlit run dashboard/app.py -- --db DB` as a child process, in `cwd` (whose .streamlit/ it reads); its
    log to `out`."""
    return subprocess.Popen([
        sys.executable, "-m", "streamlit", "run", str(APP), "--server.headless=true", f"--server.port={port}",
        *([f"--server.address={address}"] if address else []), "--browser.gatherUsageStats=false",
        "--logger.level=error", "--", "--db", str(db)], stdout=out, stderr=subprocess.STDOUT, cwd=cwd)


def url_host(address: str | None, wildcard: str = "localhost") -> str:
    """The host part of a URL that reaches a server listening on `address` (`wildcard` for every interface)."""
    if not address or address in ("0.0.0.0", "::"):
        return wildcard
    return f"[{address}]" if ":" in address else address


def wait_until_healthy(dashboard: subprocess.Popen, port: int, bound_s: float = START_BOUND_S,
                       address: str | None = None) -> None:
    """Return once the dashboard answers its health check; ServeError if it exits or stays silent."""
    deadline = time.monotonic() + bound_s
    health = f"http://{url_host(address, wildcard='127.0.0.1')}:{port}/_stcore/health"
    while time.monotonic() < deadline:
        if dashboard.poll() is not None:
            raise ServeError(f"the dashboard exited with code {dashboard.returncode} (is port {port} in use?)")
        try:
            with urllib.request.urlopen(health, timeout=2) as answer:
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


def check_login(address: str | None, port: int, require_auth: bool) -> None:
    """Before serving: with `require_auth`, ServeError unless the dashboard's secrets configure [auth]; without a
    login, the open-dashboard warning when it listens beyond this machine."""
    if auth_configured(dashboard_option("secrets.files")):
        return
    if require_auth:
        raise ServeError("--auth: no [auth] section in the secrets the dashboard reads "
                         "(.streamlit/secrets.toml here or in ~/.streamlit/); see docs/sharing.md, \"Login\"")
    if warning := open_warning(address or dashboard_option("server.address"), port):
        print(warning, file=sys.stderr, flush=True)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def serve(db: Path, port: int, sweep: str | None, address: str | None = None, require_auth: bool = False) -> int:
    """Serve until Ctrl-C; with `sweep` (the options of `runner sweep`), record it into `db` meanwhile. With
    `require_auth`, only behind the login."""
    check_login(address, port, require_auth)
    signal.signal(signal.SIGTERM, _interrupt)  # stopped by `kill`, the children are stopped too, not left behind
    dashboard = start_dashboard(db, port, address=address)
    recorder = None
    try:
        wait_until_healthy(dashboard, port, address=address)
        stops = "Ctrl-C stops it" + (" and the sweep" if sweep else "")
        print(f"dashboard: http://{url_host(address)}:{port}  ({stops})", flush=True)
        if sweep:
            recorder = subprocess.Popen([sys.executable, "-m", "runner", "sweep", *shlex.split(sweep),
                                         "--db", str(db), "--resume", "last"])
            if (code := recorder.wait()) != 0:
                print(f"the sweep stopped with exit code {code}; the dashboard goes on", file=sys.stderr, flush=True)
        return dashboard.wait()
    except KeyboardInterrupt:  # Ctrl-C (which reaches the children too) or SIGTERM: stop them, wait for them
        return 0
    finally:
        stop(recorder)
        stop(dashboard)
