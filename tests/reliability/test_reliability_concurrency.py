"""A sweep records while readers query the same file: nothing lost, nothing partial, no reader error.

The sweep is the real `python -m runner sweep` in its own process (tests/helpers/reliability_helpers.py counts the
store's lock retries); the readers are four more processes, two reading as the dashboard's pages do
(dashboard/queries.py) and two as `runner sql` does (runner/store/sql.py). DuckDB allows one writer or many
readers per file (docs/design.md, "DuckDB locking"), so every open on either side may have to wait for the other.
The readers here wait up to 30 s for a write (the writer's bound), not the pages' 10 s: the test is about fairness and
whole runs, and on a slow host under the whole suite a reader has once waited past 10 s.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from runner.serve import stop
from tests.helpers.reliability_helpers import (
    CELLS,
    HANG_S,
    PARTIAL_RUNS,
    ROOT,
    child_env,
    line_count,
    planned_cells,
    query,
    start_script,
    sweep_args,
    sweep_ids,
    wait_until,
    write_prompts,
)

DRAFTS = ["ngram", "layerskip:2"]
KS = list(range(1, 9))
PROMPTS = 6  # 6 × (1 baseline + 2 drafts × 8 k) = 102 runs, half a minute on a busy 2-core machine
READERS = ("dashboard", "dashboard", "sql", "sql")


def _report(name: str, data: dict) -> None:
    # Shown with `pytest -s`; bench/results/reliability.md records these figures.
    print(f"\n{name}: {json.dumps(data)}", file=sys.stderr)


def _spilled(pending: Path) -> bool:
    return pending.is_dir() and any(pending.iterdir())


def _seen(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {"runs": 0}


def test_a_sweep_under_four_readers_loses_nothing_and_shows_no_partial_run(tiny_dir, tmp_path):
    db, stop_file = tmp_path / "runs.duckdb", tmp_path / "stop"
    pending = db.with_name(db.name + ".pending")
    prompts = write_prompts(tmp_path / "prompts.jsonl", PROMPTS)
    planned = planned_cells(PROMPTS, DRAFTS, KS)
    outs = [tmp_path / f"reader{i}.json" for i in range(len(READERS))]
    readers = [start_script("reader", kind, str(db), str(stop_file), str(out), log=tmp_path / f"reader{i}.log")
               for i, (kind, out) in enumerate(zip(READERS, outs, strict=True))]
    started = time.monotonic()
    try:
        writer = start_script("sweep", str(tmp_path / "sweep.json"), "--",
                              *sweep_args(tiny_dir, db, prompts, DRAFTS, KS), log=tmp_path / "sweep.log")
        try:
            # A starved writer shows as a spill: its write found the file locked for 30 s.
            wait_until(lambda: writer.poll() is not None or _spilled(pending), *readers, what="the sweep")
            elapsed = time.monotonic() - started
            starved = _spilled(pending)
            if not starved:  # every reader makes one more pass over the finished file
                wait_until(lambda: all(_seen(out)["runs"] == len(planned) for out in outs), *readers,
                           what="the readers' last pass")
        finally:
            stop(writer)
    finally:
        stop_file.touch()
        for reader in readers:
            try:
                reader.wait(timeout=HANG_S)
            finally:
                stop(reader)

    seen = [_seen(out) for out in outs]
    for reader in seen:
        _report("reader", reader)
    assert not starved, (f"writer starved by the readers: a run was spilled; {_runs(db)} of {len(planned)} runs "
                         f"recorded after {elapsed:.0f} s; reader lock retries {[r['retries'] for r in seen]}")
    assert writer.returncode == 0, (tmp_path / "sweep.log").read_text()[-3000:]
    sweep = json.loads((tmp_path / "sweep.json").read_text())
    _report("sweep", {**sweep, "seconds": round(elapsed, 1)})

    (sweep_id,) = sweep_ids(db)
    recorded = query(db, CELLS, [sweep_id])
    assert sorted(recorded, key=repr) == sorted(planned, key=repr)  # every cell once: none lost, none twice
    assert query(db, PARTIAL_RUNS) == [(0, 0, len(planned))]
    assert sweep["writes"] == len(planned) and sweep["spills"] == 0
    assert not pending.exists()
    for reader in seen:
        assert reader["error_count"] == 0, reader["errors"]
        assert reader["partial"] == 0 and reader["shrank"] == 0
        assert reader["queries"] > 0 and reader["runs"] == len(planned)  # it read the whole, finished sweep


HOLDER = """import duckdb, pathlib, sys, time
con = duckdb.connect(sys.argv[1], read_only=True)  # the runner is paused between two writes
con.execute('SELECT count(*) FROM runs').fetchall()
pathlib.Path(sys.argv[2]).touch()
while not pathlib.Path(sys.argv[3]).exists():  # until the test lets go
    time.sleep(0.01)
con.close()"""


def test_a_reader_holding_the_file_makes_the_runner_wait_then_write_everything(tiny_dir, tmp_path):
    db, out = tmp_path / "runs.duckdb", tmp_path / "sweep.json"
    held, go, release = tmp_path / "held", tmp_path / "go", tmp_path / "release"
    waits, paused = out.with_name("sweep.json.waits"), out.with_name("sweep.json.paused")
    prompt_count, drafts, ks = 4, ["ngram"], [1, 2, 3]  # 16 runs
    prompts = write_prompts(tmp_path / "prompts.jsonl", prompt_count)
    # The sweep stops after its second write, so the hold lands mid-sweep whatever the machine's speed.
    writer = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "helpers" / "reliability_helpers.py"), "sweep", str(out), "--",
         *sweep_args(tiny_dir, db, prompts, drafts, ks)], cwd=ROOT,
        env={**child_env(), "PAUSE_AFTER": "2", "GO": str(go)},
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "sweep.log").open("w"))
    holder = None
    try:
        wait_until(paused.exists, writer, what="the sweep's second write")
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(db), str(held), str(release)], cwd=ROOT,
                                  env=child_env())
        wait_until(held.exists, holder, writer, what="the reader's hold")
        go.touch()
        # The runner's next write finds the file locked and waits: three waits, counted as they happen.
        wait_until(lambda: line_count(waits) >= 3, writer, holder, what="the runner's lock waits")
        runs_while_held = _runs(db)  # read-only opens share the file with the holder
        release.touch()
        assert holder.wait(timeout=HANG_S) == 0
        assert writer.wait(timeout=HANG_S) == 0, (tmp_path / "sweep.log").read_text()[-3000:]
    finally:
        stop(writer)
        if holder:
            stop(holder)
    sweep = json.loads(out.read_text())
    _report("held", {**sweep, "runs_while_held": runs_while_held})
    (sweep_id,) = sweep_ids(db)
    planned = planned_cells(prompt_count, drafts, ks)
    assert runs_while_held == 2  # nothing was written while the reader held the file
    assert sorted(query(db, CELLS, [sweep_id]), key=repr) == sorted(planned, key=repr)
    assert query(db, PARTIAL_RUNS) == [(0, 0, len(planned))]
    assert sweep["spills"] == 0 and sweep["write_retries"] >= 3 and line_count(waits) >= 3
    assert not db.with_name(db.name + ".pending").exists()


def _runs(db: Path) -> int:
    try:
        return query(db, "SELECT count(*) FROM runs")[0][0]
    except Exception:  # noqa: BLE001 - the writer holds the file, or the schema is not there yet
        return 0
