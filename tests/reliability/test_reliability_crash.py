"""SIGKILL the runner at random points of a sweep: the file always opens, holds no partial run, and
`--resume SWEEP_ID` records exactly the missing cells, leaving the runs recorded before the kill as they were.

A killed sweep never printed its id (the summary comes at the end), so it is read from the file. Each sweep is a
process of its own, forked from one that imported the runner once (reliability_helpers' `forks`).
"""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from runner.cli import app
from runner.store.connect import init_db
from tests.helpers.reliability_helpers import (
    CELLS,
    PARTIAL_RUNS,
    ForkServer,
    planned_cells,
    query,
    sweep_args,
    sweep_ids,
    wait_until,
    write_prompts,
)

TRIALS = 10
SEED = 20261129  # the kill points are random but reproducible
DRAFTS, KS, PROMPTS = ["ngram", "layerskip:2"], [1, 2, 4], 3  # 21 runs, a few seconds of recording
LOAD_WINDOW_S = 3.0  # a kill aimed before the first run lands in model load or warm-up


def _runs_so_far(db: Path) -> int:
    try:
        return query(db, "SELECT count(*) FROM runs")[0][0]
    except duckdb.Error:  # locked by the writer, or the schema is still being created
        return 0


def _kill(forks: ForkServer, args: list[str], db: Path, rng: random.Random, planned: int, log: Path,
          paused: bool) -> str:
    """Start a sweep and SIGKILL it; says where the kill landed.

    paused: the sweep stops after a random number of writes (1 to all but one) and is killed there, so the
    kill surely comes mid-sweep. Otherwise the kill comes at a random moment: after a random number of recorded
    runs (0 to all but one), within the next write or run, or during model load and warm-up.
    """
    out, go = log.with_suffix(".json"), log.with_suffix(".go")
    after = rng.randrange(1, planned)
    proc = forks.fork(out, log, {"PAUSE_AFTER": str(after), "GO": str(go)} if paused else {}, args)
    try:
        if paused:
            wait_until(out.with_name(out.name + ".paused").exists, proc, what=f"the sweep's write {after}")
        else:
            target = rng.randrange(planned)
            wait_until(lambda: not target or _runs_so_far(db) >= target or proc.poll() is not None,
                       what=f"{target} recorded runs")
            time.sleep(rng.uniform(0, 0.2) if target else rng.uniform(0, LOAD_WINDOW_S))
        if proc.poll() is not None:
            return "finished before the kill"
        proc.kill()
        proc.wait()
        return "killed while paused" if paused else "killed"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _snapshot(db: Path) -> tuple[list, list]:
    return (query(db, "SELECT * FROM runs ORDER BY run_id"),
            query(db, "SELECT * FROM rounds ORDER BY run_id, round"))


@pytest.fixture
def forks(tmp_path):
    with ForkServer(tmp_path / "forks.log") as server:
        yield server


def test_sigkill_at_random_points_then_resume_records_exactly_the_missing_cells(tiny_dir, tmp_path, forks):
    rng = random.Random(SEED)
    prompts = write_prompts(tmp_path / "prompts.jsonl", PROMPTS)
    planned = sorted(planned_cells(PROMPTS, DRAFTS, KS), key=repr)
    outcomes: Counter[str] = Counter()
    for trial in range(TRIALS):
        db = tmp_path / f"trial{trial}.duckdb"
        args = sweep_args(tiny_dir, db, prompts, DRAFTS, KS)
        paused = trial % 2 == 1
        landed = _kill(forks, args, db, rng, len(planned), tmp_path / f"trial{trial}.log", paused)
        if not db.exists():
            outcomes["killed before the file was created"] += 1
            continue
        # The file opens, read-only and read-write, and holds no partial run.
        assert query(db, PARTIAL_RUNS)[0][:2] == (0, 0)
        init_db(db)  # completes the migrations a kill may have interrupted
        ids = sweep_ids(db)
        if not ids:
            outcomes[f"{landed}, before any run was recorded"] += 1
            continue
        (sweep_id,) = ids
        runs_before, rounds_before = _snapshot(db)
        outcomes[f"{landed}, {'all' if len(runs_before) == len(planned) else 'some'} runs recorded: resumed"] += 1
        result = CliRunner().invoke(app, ["sweep", *args, "--resume", sweep_id])
        assert result.exit_code == 0, result.stderr
        recorded = sorted(query(db, CELLS, [sweep_id]), key=repr)
        assert recorded == planned, f"trial {trial}: after resume the cells differ from the plan"
        assert query(db, PARTIAL_RUNS) == [(0, 0, len(planned))]
        runs_after, rounds_after = _snapshot(db)
        kept = {row[0] for row in runs_before}
        assert [row for row in runs_after if row[0] in kept] == runs_before  # untouched, byte for byte
        assert [row for row in rounds_after if row[0] in kept] == rounds_before
    print(f"\ncrash trials: {dict(outcomes)}", file=sys.stderr)
    # every paused sweep was killed mid-sweep, and resumed; the others landed wherever chance put them
    assert outcomes["killed while paused, some runs recorded: resumed"] == TRIALS // 2
