"""A sweep records while readers query the same file: nothing lost, nothing partial, no reader error.

The sweep is the real `python -m runner sweep` in its own process (tests/reliability_helpers.py counts the
store's lock retries); the readers are four more processes, two reading as the dashboard's pages do
(dashboard/queries.py) and two as `runner sql` does (runner/store/sql.py). DuckDB allows one writer or many
readers per file (docs/design.md, "DuckDB locking"), so every open on either side may have to wait for the other.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from reliability_helpers import (
    CELLS,
    PARTIAL_RUNS,
    ROOT,
    child_env,
    planned_cells,
    query,
    start_script,
    sweep_args,
    sweep_ids,
    write_prompts,
)

from runner.serve import stop

DRAFTS = ["ngram", "layerskip:2"]
KS = list(range(1, 9))
PROMPTS = 12  # 12 × (1 baseline + 2 drafts × 8 k) = 204 runs, about a minute on a busy 2-core machine
READERS = ("dashboard", "dashboard", "sql", "sql")
SWEEP_BOUND_S = 420  # alone the sweep records in ~1 minute; the readers share the same two cores


def _report(name: str, data: dict) -> None:
    # Shown with `pytest -s`; docs/reliability.md quotes these figures.
    print(f"\n{name}: {json.dumps(data)}", file=sys.stderr)


def _wait_or_starve(writer: subprocess.Popen, pending: Path, bound_s: float) -> str | None:
    """Wait for the sweep; stop early if a run had to be spilled (its write found the file locked for 30 s)."""
    deadline = time.monotonic() + bound_s
    while writer.poll() is None:
        if pending.is_dir() and any(pending.iterdir()):
            return "a run was spilled to runs.duckdb.pending/: its write found the file locked for 30 s"
        if time.monotonic() > deadline:
            return f"the sweep did not finish within {bound_s:g} s"
        time.sleep(0.5)
    return None


def test_a_sweep_under_four_readers_loses_nothing_and_shows_no_partial_run(tiny_dir, tmp_path):
    db, stop_file = tmp_path / "runs.duckdb", tmp_path / "stop"
    prompts = write_prompts(tmp_path / "prompts.jsonl", PROMPTS)
    planned = planned_cells(PROMPTS, DRAFTS, KS)
    readers = [start_script("reader", kind, str(db), str(stop_file), str(tmp_path / f"reader{i}.json"),
                            log=tmp_path / f"reader{i}.log") for i, kind in enumerate(READERS)]
    started = time.monotonic()
    try:
        writer = start_script("sweep", str(tmp_path / "sweep.json"), "--",
                              *sweep_args(tiny_dir, db, prompts, DRAFTS, KS), log=tmp_path / "sweep.log")
        try:
            starved = _wait_or_starve(writer, db.with_name(db.name + ".pending"), SWEEP_BOUND_S)
            elapsed = time.monotonic() - started
            if not starved:
                time.sleep(0.5)  # the readers make one more pass over the finished file
        finally:
            stop(writer)
    finally:
        stop_file.touch()
        for reader in readers:
            try:
                reader.wait(timeout=60)
            finally:
                stop(reader)

    seen = [json.loads((tmp_path / f"reader{i}.json").read_text()) for i in range(len(READERS))]
    for reader in seen:
        _report("reader", reader)
    assert not starved, (f"writer starved by the readers: {starved}; {_runs(db)} of {len(planned)} runs recorded "
                         f"after {elapsed:.0f} s; reader lock retries {[r['retries'] for r in seen]}")
    assert writer.returncode == 0, (tmp_path / "sweep.log").read_text()[-3000:]
    sweep = json.loads((tmp_path / "sweep.json").read_text())
    _report("sweep", {**sweep, "seconds": round(elapsed, 1)})

    (sweep_id,) = sweep_ids(db)
    recorded = query(db, CELLS, [sweep_id])
    assert len(planned) >= 200
    assert sorted(recorded, key=repr) == sorted(planned, key=repr)  # every cell once: none lost, none twice
    assert query(db, PARTIAL_RUNS) == [(0, 0, len(planned))]
    assert sweep["writes"] == len(planned) and sweep["spills"] == 0
    assert not db.with_name(db.name + ".pending").exists()
    for reader in seen:
        assert reader["error_count"] == 0, reader["errors"]
        assert reader["partial"] == 0 and reader["shrank"] == 0
        assert reader["queries"] > 0 and reader["runs"] == len(planned)  # it read the whole, finished sweep


def _hold_read_only(db: Path, seconds: float, started: Path) -> subprocess.Popen:
    """Another process (a DuckDB CLI user, say) with the file open read-only for `seconds`."""
    code = """import duckdb, pathlib, sys, time
for _ in range(3000):  # a person retries until the runner is between two writes
    try:
        con = duckdb.connect(sys.argv[1], read_only=True)
        break
    except duckdb.IOException:
        time.sleep(0.01)
con.execute('SELECT count(*) FROM runs').fetchall()
pathlib.Path(sys.argv[3]).touch()
time.sleep(float(sys.argv[2]))
con.close()"""
    return subprocess.Popen([sys.executable, "-c", code, str(db), str(seconds), str(started)], cwd=ROOT,
                            env=child_env())


@pytest.mark.parametrize("hold_s", [3.0])
def test_a_reader_holding_the_file_makes_the_runner_wait_then_write_everything(tiny_dir, tmp_path, hold_s):
    db = tmp_path / "runs.duckdb"
    # 40 runs: enough that the hold lands mid-sweep even when a run and its write take a few tens of ms
    prompt_count, drafts, ks = 10, ["ngram"], [1, 2, 3]
    prompts = write_prompts(tmp_path / "prompts.jsonl", prompt_count)
    writer = start_script("sweep", str(tmp_path / "sweep.json"), "--", *sweep_args(tiny_dir, db, prompts, drafts, ks),
                          log=tmp_path / "sweep.log")
    holder = None
    try:
        deadline = time.monotonic() + 300
        while not (db.exists() and _runs(db) >= 2):  # hold the file mid-sweep, after a few runs
            assert writer.poll() is None and time.monotonic() < deadline, (tmp_path / "sweep.log").read_text()
            time.sleep(0.2)
        held = tmp_path / "held"
        holder = _hold_read_only(db, hold_s, held)
        while not held.exists():
            assert holder.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        runs_at_hold = _runs_while_held(db)
        assert writer.wait(timeout=300) == 0, (tmp_path / "sweep.log").read_text()[-3000:]
        assert holder.wait(timeout=30) == 0
    finally:
        stop(writer)
        if holder:
            stop(holder)
    sweep = json.loads((tmp_path / "sweep.json").read_text())
    _report("held for 3 s", {**sweep, "runs_when_held": runs_at_hold})
    (sweep_id,) = sweep_ids(db)
    planned = planned_cells(prompt_count, drafts, ks)
    assert sorted(query(db, CELLS, [sweep_id]), key=repr) == sorted(planned, key=repr)
    assert query(db, PARTIAL_RUNS) == [(0, 0, len(planned))]
    assert runs_at_hold < len(planned)  # the hold really came while runs were still to be written
    assert sweep["spills"] == 0 and sweep["write_retries"] > 0 and sweep["max_write_s"] >= hold_s - 1.0
    assert not db.with_name(db.name + ".pending").exists()


def _runs(db: Path) -> int:
    try:
        return query(db, "SELECT count(*) FROM runs")[0][0]
    except Exception:  # noqa: BLE001 - the writer holds the file, or the schema is not there yet
        return 0


def _runs_while_held(db: Path) -> int:
    # Read-only opens share the file with the holder, so this read cannot block.
    return query(db, "SELECT count(*) FROM runs")[0][0]
