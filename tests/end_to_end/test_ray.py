"""Sweeps on a local Ray cluster of 2 CPUs, started here: the rows of a local sweep, faults, bad input."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import psutil
import pytest
import ray
from rich.console import Console
from typer.testing import CliRunner

from runner.cli import app
from runner.sweep import progress, ray_cells
from runner.sweep.loop import run_sweep
from runner.sweep.plan import SweepConfig
from runner.sweep.ray_cells import ROOT, run_sweep_on_ray
from tests.end_to_end.test_sweep import config

# Everything of a run but its identity, timings and the count of workers beside it; the baseline by its cell.
TIMED = ("run_id", "sweep_id", "started_at", "wall_s", "prefill_s", "draft_s", "verify_s", "baseline_run_id",
         "concurrent_workers")
CELL = "r.prompt_id, r.draft, r.k, r.mode"


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             job_config=ray.job_config.JobConfig(code_search_path=[str(ROOT)]))
    yield
    ray.shutdown()


def recorded(db: Path, sweep_id: str) -> dict[str, list[tuple]]:
    """The sweep's rows of runs, rounds and run_totals, each keyed by its cell instead of its run id."""
    with duckdb.connect(str(db), read_only=True) as con:
        columns = [c for (c, *_) in con.execute("DESCRIBE runs").fetchall() if c not in TIMED]
        runs = con.execute(f"""SELECT {', '.join('r.' + c for c in columns)}, b.prompt_id, b.draft, b.k
            FROM runs r LEFT JOIN runs b ON b.run_id = r.baseline_run_id WHERE r.sweep_id = ? ORDER BY ALL""",
                           [sweep_id]).fetchall()
        rounds = con.execute(f"""SELECT {CELL}, x.* EXCLUDE (run_id, draft_s, verify_s) FROM rounds x
            JOIN runs r USING (run_id) WHERE r.sweep_id = ? ORDER BY ALL""", [sweep_id]).fetchall()
        totals = con.execute(f"""SELECT {CELL}, t.* EXCLUDE (run_id) FROM run_totals t JOIN runs r USING (run_id)
            WHERE r.sweep_id = ? ORDER BY ALL""", [sweep_id]).fetchall()
    return {"runs": runs, "rounds": rounds, "run_totals": totals}


@pytest.fixture(scope="module")
def local(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple]]:
    """The plan of tests/end_to_end/test_sweep.py swept in this process on one torch thread, as each Ray actor has."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = config(tiny_dir, tmp_path_factory.mktemp("local"))
        sweep_id, _ = run_sweep(cfg, Console(quiet=True))
    finally:
        torch.set_num_threads(threads)
    return recorded(cfg.db, sweep_id)


@pytest.fixture(scope="module")
def on_ray(cluster: None, tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """The same plan swept by 2 Ray actors: (config, sweep id, tally)."""
    cfg = config(tiny_dir, tmp_path_factory.mktemp("ray"))
    sweep_id, recorder, tally = run_sweep_on_ray(cfg, Console(quiet=True), workers=2)
    assert recorder.errors == [] and recorder.lossless_failures == []
    return cfg, sweep_id, tally


def test_a_ray_sweep_records_the_rows_of_a_local_sweep(on_ray, local):
    cfg, sweep_id, tally = on_ray
    assert recorded(cfg.db, sweep_id) == local
    assert len(local["runs"]) == 30 and sum(tally.done.values()) == 30 and tally.deaths == 0
    with duckdb.connect(str(cfg.db), read_only=True) as con:
        hosts = con.execute("SELECT DISTINCT host, concurrent_workers BETWEEN 1 AND 2 FROM runs").fetchall()
    assert hosts == [(os.uname().nodename, True)]
    stood = progress.read(cfg.db)  # what the dashboard's banner and `--resume last` read
    assert (stood["sweep_id"], stood["done"], stood["total"], stood["state"]) == (sweep_id, 30, 30, progress.DONE)
    assert stood["plan"] == cfg.plan_id()


def kill_the_first_running_actor(killed: list[int], stop: threading.Event) -> None:
    """SIGKILL the first of this test's Ray actors seen in the middle of a cell (its process title says so)."""
    while not stop.is_set():
        for process in psutil.Process().children(recursive=True):
            try:
                if process.cmdline()[:1] == ["ray::CellWorker.run"]:
                    os.kill(process.pid, signal.SIGKILL)
                    killed.append(process.pid)
                    return
            except psutil.Error:  # ended since the listing
                continue
        time.sleep(0.01)


def test_an_actor_killed_mid_cell_leaves_every_cell_recorded_once(cluster, local, tiny_dir, tmp_path):
    cfg = config(tiny_dir, tmp_path)
    killed, stop = [], threading.Event()
    killer = threading.Thread(target=kill_the_first_running_actor, args=(killed, stop))
    killer.start()
    try:
        sweep_id, _, tally = run_sweep_on_ray(cfg, Console(quiet=True), workers=2)
    finally:
        stop.set()
        killer.join()
    assert len(killed) == 1 and tally.deaths == 1 and tally.reruns >= 1 and tally.given_up == []
    assert recorded(cfg.db, sweep_id) == local  # each cell once, as the local sweep recorded it


def test_resume_on_ray_records_only_the_missing_cells(on_ray, local, tmp_path):
    swept, sweep_id, _ = on_ray
    cfg = SweepConfig(**{**swept.__dict__, "db": tmp_path / "runs.duckdb", "sweep_id": sweep_id})
    cfg.db.write_bytes(swept.db.read_bytes())
    with duckdb.connect(str(cfg.db)) as con:  # as if the driver was stopped before these cells were written
        # c2 whole, and one speculative run of s1, whose baseline the driver then reads from the database
        gone = [r for (r,) in con.execute("SELECT run_id FROM runs WHERE prompt_id = 'c2' OR (prompt_id = 's1' "
                                          "AND draft = 'ngram' AND k = 3 AND mode = 'greedy')").fetchall()]
        for table in ("rounds", "run_totals", "runs"):
            con.execute(f"DELETE FROM {table} WHERE run_id IN (SELECT unnest(?))", [gone])
    _, _, tally = run_sweep_on_ray(cfg, Console(quiet=True), workers=2)
    assert sum(tally.done.values()) == len(gone) == 11  # c2: 2 modes × 5 cells
    assert recorded(cfg.db, sweep_id) == local


def test_a_resumed_ray_sweep_reruns_a_stale_baseline_as_the_local_sweep_does(on_ray, tmp_path):
    swept, sweep_id, _ = on_ray
    cfg = SweepConfig(**{**swept.__dict__, "db": tmp_path / "runs.duckdb", "sweep_id": sweep_id})
    cfg.db.write_bytes(swept.db.read_bytes())
    with duckdb.connect(str(cfg.db)) as con:  # c1's greedy baseline as if fed other prompt ids; one of its runs gone
        (old,), = con.execute("SELECT run_id FROM runs WHERE prompt_id = 'c1' AND draft = 'none' "
                              "AND mode = 'greedy'").fetchall()
        con.execute("UPDATE runs SET prompt_tokens = [1, 2, 3] WHERE run_id = ?", [old])
        (gone,), = con.execute("SELECT run_id FROM runs WHERE prompt_id = 'c1' AND draft = 'ngram' AND k = 3 "
                               "AND mode = 'greedy'").fetchall()
        for table in ("rounds", "run_totals", "runs"):
            con.execute(f"DELETE FROM {table} WHERE run_id = ?", [gone])
    _, recorder, tally = run_sweep_on_ray(cfg, Console(quiet=True), workers=2)
    assert sum(tally.done.values()) == 2 and recorder.lossless_failures == []  # the baseline, then the lost run
    with duckdb.connect(str(cfg.db), read_only=True) as con:
        (new,), = con.execute("SELECT run_id FROM runs WHERE prompt_id = 'c1' AND draft = 'none' AND mode = 'greedy' "
                              "AND run_id <> ?", [old]).fetchall()
        assert con.execute("SELECT baseline_run_id, lossless FROM runs WHERE prompt_id = 'c1' AND draft = 'ngram' "
                           "AND k = 3 AND mode = 'greedy'").fetchall() == [(new, True)]


def test_bad_input_on_ray_exits_2_and_records_nothing(cluster, tiny_dir, tmp_path, monkeypatch):
    # Each case's actor waits for the last one's CPUs, which Ray frees a while after the kill, and then imports and
    # loads for itself: on a busy machine that took over a minute and earned the waiting note, a second line.
    monkeypatch.setattr(ray_cells, "PLACEMENT_NOTE_S", 600.0)
    db = tmp_path / "runs.duckdb"
    base = ["sweep", "--draft", "ngram", "--k", "2", "--prompts-per-category", "1", "--db", str(db)]
    for args, expected in [
        (["--target", str(tmp_path / "missing"), "--ray", "auto"], "no such model directory"),
        (["--target", str(tiny_dir), "--ray", "auto", "--max-new-tokens", "600"], "exceeds the model's context"),
        (["--target", str(tiny_dir), "--workers", "2"], "--workers needs --ray"),
        (["--target", str(tiny_dir), "--ray", "auto", "--workers", "0"], "--workers needs --ray"),
    ]:
        result = CliRunner().invoke(app, base + args)
        assert result.exit_code == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], result.stderr
        assert list(tmp_path.iterdir()) == []


def test_a_local_sweep_never_imports_ray(tiny_dir, tmp_path):
    script = f"""
import sys
from typer.testing import CliRunner
from runner.cli import app
result = CliRunner().invoke(app, ["sweep", "--draft", "ngram", "--k", "2", "--prompts-per-category", "1",
    "--max-new-tokens", "4", "--target", {str(tiny_dir)!r}, "--db", {str(tmp_path / 'runs.duckdb')!r}])
assert result.exit_code == 0, result.output
print(sorted(name for name in sys.modules if name == "ray" or name.startswith("ray.")))
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert duckdb.connect(str(tmp_path / "runs.duckdb"), read_only=True).execute(
        "SELECT count(*) FROM runs").fetchone() == (6,)  # 3 categories × (baseline + ngram k=2)
