"""`run_facts`: the rows write_run works out equal run_stats' plain query and the per-run sums over every round,
whatever order a run and its baseline are written in; an older file gets the same rows from its migration; and
run_stats reads the table with its columns and numbers unchanged."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pandas as pd
import pytest

from runner.store import run_facts
from runner.store.migrations import MIGRATIONS, add_pass_rows
from runner.store.run_facts import RUN_STATS_SELECT
from runner.store.runs import write_run
from runner.store.schema import migrate
from tests.helpers.dashboard_fixtures import PROMPTS, add_trees, baseline_record, build, retimed, speculative_record

# run_stats as migration 19 made it, a view over runs, run_totals and the baselines' rows of runs (with the runs'
# own times, which run_facts adds): the reference.
PLAIN_STATS = RUN_STATS_SELECT.format(more=", k_policy, batch_size, engine, engine_version, ttft_s, wall_s, prefill_s, "
                                               "draft_s, verify_s")
# What run_facts adds, straight from the rounds: the rounds that drafted (NULL for none, as a sum over no rounds),
# whether any drafted a tree, per k the rounds and their summed verify seconds, and the drafting rounds by outcome.
PLAIN_ADDED = """
    WITH per_k AS (SELECT run_id, k, count(*) AS rounds, sum(verify_s) AS verify_s FROM rounds GROUP BY ALL),
    per_outcome AS (SELECT run_id, depth, accepted, rejected, count(*) AS rounds FROM rounds WHERE k > 0 GROUP BY ALL)
    SELECT run_id, (SELECT nullif(count(*), 0) FROM rounds d WHERE d.run_id = r.run_id AND d.k > 0) AS drafting_rounds,
        (SELECT bool_or(draft_parents IS NOT NULL) FROM rounds d WHERE d.run_id = r.run_id AND d.k > 0) AS tree,
        (SELECT list({'k': k, 'rounds': rounds, 'verify_s': verify_s} ORDER BY k) FROM per_k p
         WHERE p.run_id = r.run_id) AS widths,
        (SELECT list({'depth': depth, 'accepted': accepted, 'rejected': rejected, 'rounds': rounds}
                     ORDER BY depth, accepted, rejected) FROM per_outcome o WHERE o.run_id = r.run_id) AS outcomes
    FROM run_stats r"""


def facts(path: Path) -> pd.DataFrame:
    with duckdb.connect(str(path), read_only=True) as con:
        return con.execute("SELECT * FROM run_facts ORDER BY run_id").df()


def plain(path: Path) -> pd.DataFrame:
    with duckdb.connect(str(path), read_only=True) as con:
        stats = con.execute(f"SELECT * FROM ({PLAIN_STATS}) ORDER BY run_id").df()
        added = con.execute(f"SELECT * FROM ({PLAIN_ADDED}) ORDER BY run_id").df()
    return stats.merge(added, on="run_id", how="left")


def listed(column: pd.Series) -> list:
    """A column of lists of structs as Python values (NULL: None)."""
    return [[dict(item) for item in value] if hasattr(value, "__len__") else None for value in column]


def same(fast: pd.DataFrame, reference: pd.DataFrame) -> None:
    assert len(fast) > 0
    fast, reference = fast.reset_index(drop=True), reference.reset_index(drop=True)
    # widths are lists of dicts: their seconds are summed per outcome first in run_facts, per k at once here, so
    # they may differ in the last bit
    for got, want in zip(fast.pop("widths"), reference.pop("widths"), strict=True):
        assert [(w["k"], w["rounds"]) for w in got] == [(w["k"], w["rounds"]) for w in want]
        assert [w["verify_s"] for w in got] == pytest.approx([w["verify_s"] for w in want], rel=1e-12)
    assert listed(fast.pop("outcomes")) == listed(reference.pop("outcomes"))
    pd.testing.assert_frame_equal(fast, reference, check_exact=True, check_dtype=False)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return retimed(tmp_path_factory.mktemp("facts") / "runs.duckdb")


def test_the_rows_written_equal_the_plain_query_and_the_rounds(tmp_path):
    db = add_trees(build(tmp_path / "runs.duckdb"))
    written = facts(db)
    same(written, plain(db))
    # one row per 'ok' run, none for the failed one; the tree run drafted a tree, the baselines drafted nothing
    with duckdb.connect(str(db), read_only=True) as con:
        assert len(written) == con.execute("SELECT count(*) FROM runs WHERE status = 'ok'").fetchone()[0]
    rows = written.set_index("run_id")
    assert "c1-ls-k8" not in rows.index
    assert rows.loc["c2-tree-k3", "tree"] and not rows.loc["c1-ng-k2", "tree"]
    assert pd.isna(rows.loc["code-01-base", "drafting_rounds"])
    assert [w["k"] for w in rows.loc["code-01-base", "widths"]] == [0]
    assert rows.loc["code-01-base", "widths"][0]["rounds"] == 12
    outcomes = dict(zip(rows.index, listed(rows["outcomes"]), strict=True))
    assert outcomes["code-01-base"] is None
    # c1-ng-k2 accepted 2, 1, 2, 2 of 2 (11 tokens); its last round, with one token left, drafted nothing
    assert [(o["accepted"], o["rejected"], o["rounds"]) for o in outcomes["c1-ng-k2"]] == [(1, 1, 1), (2, 0, 3)]


def test_a_run_written_before_its_baseline_gets_its_speedup_when_the_baseline_comes(tmp_path):
    prompt_id = next(iter(PROMPTS))
    run = speculative_record("early", prompt_id, "ngram", 2, [2, 2, 2, 2], 0.5)
    db = tmp_path / "runs.duckdb"
    write_run(db, run)
    assert pd.isna(facts(db).set_index("run_id").loc["early", "measured_speedup"])  # no baseline yet
    write_run(db, baseline_record(prompt_id))
    rows = facts(db)
    same(rows, plain(db))
    assert rows.set_index("run_id").loc["early", "measured_speedup"] > 0


def test_an_older_file_gets_the_same_rows_from_its_migration(db, tmp_path):
    old = tmp_path / "old.duckdb"
    with duckdb.connect(str(old)) as con:
        migrate(con, to_version=MIGRATIONS.index(add_pass_rows))  # before run_facts as it is now
        con.execute(f"ATTACH '{db}' AS a (READ_ONLY)")
        for table in ("runs", "rounds", "run_totals", "round_counts"):
            # columns of later migrations
            added = {"rounds": "pass_rows", "round_counts": "pass_rows",
                     "runs": "engine, engine_version, engine_config, engine_report, ttft_s, repeat"}.get(table)
            con.execute(f"INSERT INTO {table} BY NAME SELECT * {f'EXCLUDE ({added})' if added else ''} "
                        f"FROM a.{table}")
        before = con.execute("SELECT * FROM run_stats ORDER BY run_id").df()
        migrate(con)
        after = con.execute("SELECT * FROM run_stats ORDER BY run_id").df()
    engines = after.pop("engine"), after.pop("engine_version"), after.pop("ttft_s")
    assert (set(engines[0]), engines[1].isna().all(), engines[2].isna().all()) == ({"specdash"}, True, True)
    pd.testing.assert_frame_equal(after, before, check_exact=True)  # run_stats' columns and numbers unchanged
    same(facts(old), facts(db))


def test_refresh_all_works_out_a_file_changed_by_hand(db, tmp_path):
    changed = tmp_path / "changed.duckdb"
    changed.write_bytes(db.read_bytes())
    with duckdb.connect(str(changed)) as con:
        con.execute("UPDATE runs SET wall_s = wall_s * 2 WHERE run_id = 'code-01-base'")
        stale = con.execute("SELECT measured_speedup FROM run_stats WHERE run_id = 'c1-ng-k2'").fetchone()[0]
        run_facts.refresh_all(con)
        fresh = con.execute("SELECT measured_speedup FROM run_stats WHERE run_id = 'c1-ng-k2'").fetchone()[0]
    assert fresh == pytest.approx(2 * stale)  # the baseline took twice as long: the run's speedup doubles
    same(facts(changed), plain(changed))

