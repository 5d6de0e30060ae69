"""A sweep's progress beside its file, `--resume last`, the dashboard's recording banner, and `runner serve`
(the dashboard at once, a sweep recording into the same file meanwhile, Ctrl-C stopping both). Its login checks
are in test_login.py."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import duckdb
import pytest
from rich.console import Console
from streamlit.testing.v1 import AppTest
from typer.testing import CliRunner

from bench.load import free_port
from runner.cli import app
from runner.engine import pair
from runner.serve import open_warning
from runner.store.connect import init_db
from runner.sweep import progress
from runner.sweep.loop import run_sweep
from tests.end_to_end.test_sweep import config

ROOT = Path(__file__).resolve().parents[2]
PLAN_SIZE = 30  # test_sweep's plan: 3 prompts × 2 modes × (1 baseline + 2 drafts × 2 k)


def ok_runs(db: Path) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT sweep_id, count(*) FROM runs WHERE status = 'ok' GROUP BY ALL").fetchall()


def test_progress_reads_back_and_a_dead_recorder_reads_as_interrupted(tmp_path):
    db = tmp_path / "runs.duckdb"
    assert progress.read(db) is None and progress.resumable(db, "plan") is None
    progress.write(db, "s1", "plan", 3, 10, progress.RECORDING)
    stand = progress.read(db)
    assert (stand["sweep_id"], stand["done"], stand["total"], stand["state"]) == ("s1", 3, 10, "recording")
    assert progress.resumable(db, "plan") is None  # still recording: not to be resumed twice
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    progress.path(db).write_text(json.dumps({**stand, "pid": int(dead.stdout)}))
    assert progress.read(db)["state"] == progress.INTERRUPTED
    assert progress.resumable(db, "plan") == "s1" and progress.resumable(db, "another plan") is None


def test_an_interrupted_sweep_is_finished_by_resume_last_and_a_new_plan_starts_afresh(tiny_dir, tmp_path,
                                                                                       monkeypatch):
    cfg = config(tiny_dir, tmp_path)
    real_run, calls = pair.Pair.run, []

    def interrupted(self, spec, prompt, k, decoding, max_new_tokens, seed, *policy):
        if max_new_tokens == cfg.max_new_tokens:  # the cells, not the warm-up
            calls.append(spec.text)
            if len(calls) == 8:
                raise KeyboardInterrupt
        return real_run(self, spec, prompt, k, decoding, max_new_tokens, seed, *policy)

    monkeypatch.setattr(pair.Pair, "run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(cfg, Console(quiet=True))
    stand = progress.read(cfg.db)
    assert (stand["state"], stand["done"], stand["total"]) == (progress.INTERRUPTED, 7, PLAN_SIZE)
    [(sweep_id, recorded)] = ok_runs(cfg.db)
    assert recorded == 7
    monkeypatch.setattr(pair.Pair, "run", real_run)
    args = ["sweep", "--target", str(tiny_dir), "--draft", "ngram", "--draft", "layerskip:2", "--k", "1,3",
            "--prompts", str(tmp_path / "prompts.jsonl"), "--mode", "greedy", "--mode", "sample", "--temperature",
            "0.7", "--top-p", "0.9", "--seed", "7", "--max-new-tokens", "10", "--db", str(cfg.db), "--resume", "last"]
    assert CliRunner().invoke(app, args).exit_code == 0
    assert ok_runs(cfg.db) == [(sweep_id, PLAN_SIZE)]  # the same sweep, each cell once
    stand = progress.read(cfg.db)
    assert (stand["sweep_id"], stand["state"], stand["done"]) == (sweep_id, progress.DONE, PLAN_SIZE)
    # A finished sweep is not resumed: `last` starts a new one.
    assert CliRunner().invoke(app, [*args[:-4], "--max-new-tokens", "6", "--db", str(cfg.db), "--resume",
                                    "last", "--k", "1"]).exit_code == 0
    assert len(ok_runs(cfg.db)) == 2


def test_the_dashboard_shows_a_sweep_that_is_recording(tmp_path, monkeypatch):
    from tests.helpers.dashboard_fixtures import build

    db = build(tmp_path / "runs.duckdb")
    progress.write(db, "s-live", "plan", 12, 48, progress.RECORDING)  # this process: alive
    monkeypatch.setenv("SPECDASH_DB", str(db))
    at = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=60).run()
    assert not at.exception
    texts = [element.proto.text for element in at.sidebar.get("progress")]
    assert texts == ["a sweep is recording: 12 of 48 runs (sweep `s-live`); refresh to see new runs"]
    progress.write(db, "s-live", "plan", 48, 48, progress.DONE)
    assert not AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=60).run().sidebar.get("progress")


def test_serve_answers_first_records_the_sweep_meanwhile_and_ctrl_c_stops_both(tiny_dir, tmp_path):
    db, port = tmp_path / "runs.duckdb", free_port()
    sweep = f"--target {tiny_dir} --draft ngram --k 2 --prompts-per-category 1 --max-new-tokens 6"
    server = subprocess.Popen([sys.executable, "-m", "runner", "serve", "--db", str(db), "--port", str(port),
                               "--sweep", sweep], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True)
    try:
        warning, first = server.stdout.readline(), server.stdout.readline()
        assert warning == open_warning(None, port) + "\n"  # no login here, and Streamlit listens on every interface
        assert first.startswith(f"dashboard: http://localhost:{port}")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=10) as answer:
            assert answer.status == 200  # answering when the URL is printed
        for _ in range(1200):  # the sweep loads the model, then records; a bound only against hanging forever
            if (stand := progress.read(db)) and stand["state"] != progress.RECORDING:
                break
            time.sleep(0.25)
        assert progress.read(db)["state"] == progress.DONE
        assert progress.read(db)["done"] == progress.read(db)["total"] == 3 * (1 + 1)  # 3 prompts × (plain + k=2)
        os.killpg(server.pid, signal.SIGINT)  # the terminal's Ctrl-C reaches the whole group
        assert server.wait(timeout=60) == 0
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2)


def test_a_sigterm_to_serve_alone_stops_the_dashboard_too(tmp_path):
    db, port = tmp_path / "runs.duckdb", free_port()
    init_db(db)
    server = subprocess.Popen([sys.executable, "-m", "runner", "serve", "--db", str(db), "--port", str(port)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        server.stdout.readline()  # the open-dashboard warning
        assert server.stdout.readline().startswith(f"dashboard: http://localhost:{port}")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=10) as answer:
            assert answer.status == 200
        server.send_signal(signal.SIGTERM)  # to serve only, as `kill` or a service manager sends it: not the group
        assert server.wait(timeout=60) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):  # whatever of the group is left, a failed run's dashboard too
            os.killpg(server.pid, signal.SIGKILL)
    with pytest.raises(OSError):  # the dashboard went with it
        urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2)
