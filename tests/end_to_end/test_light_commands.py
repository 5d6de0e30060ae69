"""The commands that do not decode (`sql`, `merge`, `list`, `report`, and `serve`'s dashboard half) never import torch:
each runs for real in a fresh process over the hand-built database, and torch is not among the modules it loaded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.dashboard_fixtures import build

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "runner.engine.pair", "runner.engine.weights.models")
# The command line as `python -m runner` runs it; what it had imported is written at exit, whatever the exit code.
PROBE = """
import atexit, json, runpy, sys
atexit.register(lambda: print(json.dumps(sorted(m for m in {heavy} if m in sys.modules)), file=sys.stderr))
sys.argv = ["runner", *{args}]
runpy.run_module("runner", run_name="__main__", alter_sys=True)
"""
# serve's dashboard half: the command and the dashboard's own modules, as the Streamlit process imports them; the
# Streamlit server itself is not started
DASHBOARD = """
import json, sys, runpy
from pathlib import Path
from runner.cli import loaded
loaded("serve")
import runner.serve
for page in sorted(Path("dashboard").glob("*.py")):
    __import__("dashboard." + page.stem)
print(json.dumps(sorted(m for m in {heavy} if m in sys.modules)), file=sys.stderr)
"""


def imported(code: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    return done, json.loads(done.stderr.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("light") / "runs.duckdb")


@pytest.mark.parametrize("command", ["sql", "merge", "list", "report"])
def test_a_command_that_does_not_decode_imports_no_torch(db, tmp_path, command):
    args = {"sql": ["sql", "SELECT count(*) AS n FROM runs", "--db", str(db)],
            "merge": ["merge", str(db), "--into", str(tmp_path / "merged.duckdb")],
            "list": ["list", "--db", str(db)],
            "report": ["report", "spec-bench", "--db", str(db)]}[command]
    done, heavy = imported(PROBE.format(heavy=HEAVY, args=args))
    assert heavy == [], done.stderr
    if command == "sql":
        assert done.returncode == 0 and "13" in done.stdout  # it ran: the fixture's 13 runs
    if command == "merge":
        assert done.returncode == 0 and (tmp_path / "merged.duckdb").exists()


def test_serves_dashboard_half_imports_no_torch():
    done, heavy = imported(DASHBOARD.format(heavy=HEAVY))
    assert heavy == [], done.stderr


def test_the_probe_notices_torch():
    done, heavy = imported(PROBE.format(heavy=HEAVY, args=["generate", "--help"]))
    assert done.returncode == 0 and "torch" in heavy  # the decoding commands do import it
