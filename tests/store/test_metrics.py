"""Each number defined once: the SQL macros by hand, and the SQL page's examples, the Overview's cells, the
Compare page's leaderboard and the sweep's summary agreeing on the shipped database."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from runner.store import metrics
from runner.store.connect import init_db, upgrade
from runner.store.runs import sweep_summary
from runner.store.schema import SCHEMA_VERSION, schema_version
from runner.store.sql import EXAMPLES, run_query

SHIPPED = Path(__file__).resolve().parents[2] / "runs.duckdb"


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("shipped") / "runs.duckdb"
    shutil.copy(SHIPPED, copy)
    upgrade(copy)  # as the dashboard and `runner sql` do with a file from an older specdash
    return copy


def scalar(db: Path, sql: str) -> object:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql).fetchone()[0]


@pytest.mark.parametrize(("sql", "expected"), [
    ("alpha(3, 1)", 0.75),
    ("alpha(0, 0)", None),  # nothing judged: α is undefined, not 0
    ("tau(9, 4)", 2.25),
    ("thrown_share(1, 8)", 0.125),
    ("draft_cost(0.002, 0.04)", 0.05),
    ("formula_speedup(0.5, 2, 0)", (1 - 0.5 ** 3) / 0.5),
    ("formula_speedup(0.5, 2, 0.1)", (1 - 0.5 ** 3) / (0.5 * 1.2)),
    ("formula_speedup(1, 4, 0.1)", 5 / 1.4),  # the limit at α = 1
    ("(SELECT geomean(x) FROM (VALUES (2.0), (8.0)) t(x))", 4.0),
])
def test_each_macro_by_hand(tmp_path, sql, expected):
    db = tmp_path / "runs.duckdb"
    init_db(db)
    assert scalar(db, f"SELECT {sql}") == pytest.approx(expected) if expected is not None else \
        scalar(db, f"SELECT {sql}") is None


def test_an_older_file_is_upgraded_for_readers_and_a_current_one_is_left_alone(shipped, tmp_path):
    with duckdb.connect(str(shipped), read_only=True) as con:
        assert schema_version(con) == SCHEMA_VERSION
    before = shipped.read_bytes()
    upgrade(shipped)
    assert shipped.read_bytes() == before
    upgrade(tmp_path / "absent.duckdb")
    assert not (tmp_path / "absent.duckdb").exists()


def test_the_sql_example_and_the_overview_give_the_same_cells_on_the_shipped_database(shipped):
    example = run_query(shipped, EXAMPLES["α per category × draft × k"]).frame
    with duckdb.connect(str(shipped), read_only=True) as con:
        overview = metrics.cells(con, metrics.Filters())
    assert len(example) == len(overview) > 0
    keys = list(metrics.CELL)
    joined = example.merge(overview, on=keys, suffixes=("_sql", "_overview"))
    assert len(joined) == len(example)
    assert joined["runs_sql"].tolist() == joined["runs_overview"].tolist()
    # the example rounds to 3 (α) and 2 (τ, speedup) decimals for reading: at most half a unit of the last off
    assert joined["alpha_sql"].tolist() == pytest.approx(joined["alpha_overview"].tolist(), abs=5.01e-4, nan_ok=True)
    assert joined["tau_sql"].tolist() == pytest.approx(joined["tau_overview"].tolist(), abs=5.01e-3)
    assert joined["measured_speedup_sql"].tolist() == pytest.approx(joined["measured_speedup_overview"].tolist(),
                                                                    abs=5.01e-3)


def test_the_best_k_example_agrees_with_the_leaderboard(shipped):
    example = run_query(shipped, EXAMPLES["best k per category and draft (measured speedup)"]).frame
    with duckdb.connect(str(shipped), read_only=True) as con:
        leaderboard = metrics.draft_categories(con, metrics.Filters())
    joined = example.merge(leaderboard, on=["target", "mode", "category", "draft"])
    assert len(joined) == len(example) == len(leaderboard) > 0
    assert joined["best_k_x"].tolist() == joined["best_k_y"].tolist()
    assert joined["speedup"].tolist() == pytest.approx(joined["best_speedup"].tolist(), abs=5.01e-3)


def test_the_policy_example_sets_each_policy_against_the_overviews_best_fixed_k(shipped):
    example = run_query(shipped, EXAMPLES["each draft-length policy against the best fixed k"]).frame
    keys = ["target", "mode", "category", "draft"]
    with duckdb.connect(str(shipped), read_only=True) as con:
        overview = metrics.cells(con, metrics.Filters(), (*keys, "k", "k_policy"))
    fixed = overview[overview["k_policy"] == "fixed"]
    best = fixed.loc[fixed.groupby(keys)["measured_speedup"].idxmax(), [*keys, "k", "measured_speedup"]]
    adaptive = overview[overview["k_policy"] != "fixed"].merge(best, on=keys, suffixes=("", "_best"))
    joined = example.merge(adaptive, left_on=[*keys, "k_policy", "start_k"], right_on=[*keys, "k_policy", "k"])
    assert len(joined) == len(example) == len(adaptive) > 0
    assert joined["best_k"].tolist() == joined["k_best"].tolist()
    assert joined["of_best_fixed"].tolist() == pytest.approx(
        (joined["measured_speedup"] / joined["measured_speedup_best"]).tolist(), abs=5.01e-4)


def test_the_sweep_summary_is_the_overview_of_one_sweep(shipped):
    with duckdb.connect(str(shipped), read_only=True) as con:
        sweep_id = con.execute("SELECT any_value(sweep_id) FROM runs").fetchone()[0]
        overview = metrics.cells(con, metrics.Filters(sweep_id=(sweep_id,)),
                                 ("category", "draft", "k", "mode", "k_policy"))
    summary = sweep_summary(shipped, sweep_id)
    assert summary.columns.tolist()[:5] == ["category", "draft", "k", "mode", "k_policy"]
    shared = [c for c in summary.columns if c in overview.columns]
    assert len(summary) > 0
    pd.testing.assert_frame_equal(summary[shared], overview[shared], check_dtype=False)
