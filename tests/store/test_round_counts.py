"""`round_counts`: what write_run records equals the rounds counted, an older file gets the same rows from its
migration, and every query that reads it answers exactly as the same query over every round."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pandas as pd
import pytest

from dashboard import queries
from runner.store import advisor, round_counts
from runner.store.metrics import Filters
from runner.store.migrations import MIGRATIONS, count_rounds
from runner.store.round_counts import FILL_ROUND_COUNTS
from runner.store.schema import migrate
from tests.helpers.dashboard_fixtures import add_trees, build, retimed

SELECTIONS = [Filters(), Filters(draft=("ngram",), category=("code",)), Filters(host=("nowhere",))]
COUNTS = "SELECT * FROM round_counts ORDER BY ALL"

# The queries as they read every round before round_counts, kept here as the reference.
PLAIN_NODES = """
    WITH per_run AS (SELECT run_id, sum(k) AS nodes, count(*) AS drafting, bool_or(draft_parents IS NOT NULL) AS tree
                     FROM rounds WHERE k > 0 GROUP BY run_id)
    SELECT {picked}, sum(p.nodes) / sum(p.drafting) AS nodes_per_round, coalesce(bool_or(p.tree), false) AS tree
    FROM run_stats s LEFT JOIN per_run p USING (run_id)
    WHERE s.draft <> 'none' AND {where} GROUP BY ALL ORDER BY ALL"""
PLAIN_TREE_DRAFTS = """SELECT DISTINCT draft FROM runs
    WHERE run_id IN (SELECT run_id FROM rounds WHERE draft_parents IS NOT NULL) ORDER BY draft"""
# position_stats as migration 15 made it: every round grouped, spread, and grouped again with all of its run's columns.
PLAIN_POSITIONS = """
    WITH outcomes AS (SELECT run_id, depth, accepted AS a, rejected AS r, count(*) AS n FROM rounds
                      WHERE k > 0 GROUP BY ALL),
    spread AS (
        SELECT r.run_id, r.sweep_id, r.target, r.draft, r.category, r.mode, r.k, r.k_policy, r.device, r.kernels,
               r.threads, p.position, sum(o.n)::BIGINT AS proposed,
               coalesce(sum(o.n) FILTER (p.position <= o.a + o.r), 0)::BIGINT AS reached,
               coalesce(sum(o.n) FILTER (p.position <= o.a), 0)::BIGINT AS accepted
        FROM outcomes o JOIN runs r USING (run_id) CROSS JOIN LATERAL range(1, o.depth + 1) p(position)
        WHERE r.status = 'ok' GROUP BY ALL)
    SELECT *, reached - accepted AS rejected, alpha(accepted, reached - accepted) AS rate FROM spread"""
PLAIN_PER_RUN_K = ("(SELECT run_id, pass_rows - 1 AS k, count(*) AS rounds, sum(verify_s) AS verify_s FROM rounds "
                   "GROUP BY ALL)")
# verify time by width over every round: per (run, k), joined to the runs, pooled per setting and k.
PLAIN_VERIFY_GROWTH = f"""
    WITH picked AS (
        SELECT s.target, s.device, s.kernels, s.threads, p.k, p.rounds AS n, p.verify_s AS s,
            s.draft = 'none' AS baseline
        FROM {PLAIN_PER_RUN_K} p JOIN runs s USING (run_id)
        WHERE s.status = 'ok' AND ((s.draft <> 'none' AND {{spec}}) OR (s.draft = 'none' AND {{base}}))
            AND run_id NOT IN (SELECT run_id FROM rounds WHERE pass_rows IS NULL)),
    one_token AS (SELECT target, device, kernels, threads, sum(s) / sum(n) AS one_token_s FROM picked
                  WHERE baseline GROUP BY ALL)
    SELECT p.target, p.device, p.kernels, p.threads, p.k, sum(p.n)::BIGINT AS rounds,
        sum(p.s) / sum(p.n) AS verify_s, sum(p.s) / sum(p.n) / any_value(o.one_token_s) AS relative
    FROM picked p LEFT JOIN one_token o ON o.target = p.target AND o.device = p.device
        AND o.kernels IS NOT DISTINCT FROM p.kernels AND o.threads IS NOT DISTINCT FROM p.threads
    GROUP BY ALL ORDER BY p.target, p.device, p.kernels, p.threads, p.k"""
PLAIN_WIDTHS = ("SELECT {group}, o.pass_rows AS rows, count(*) AS n, sum(o.verify_s) AS seconds FROM rounds o"
                " JOIN picked USING (run_id) WHERE batch_size = 1")
FAST_WIDTHS = ("SELECT {group}, o.rows, sum(o.rounds) AS n, sum(o.verify_s) AS seconds\n"
               "            FROM (SELECT {group}, unnest(widths) AS o FROM picked WHERE batch_size = 1)")
PLAIN_TREE_WIDTHS = ("SELECT {key}, f.k, o.pass_rows AS rows, count(*) AS n FROM rounds o"
                     " JOIN fixed f USING (run_id) WHERE batch_size = 1 GROUP BY ALL")
FAST_TREE_WIDTHS = ("SELECT {key}, k, o.rows, sum(o.rounds) AS n\n"
                    "            FROM (SELECT {key}, k, unnest(widths) AS o FROM fixed WHERE batch_size = 1)"
                    " GROUP BY ALL")


def counted(con: duckdb.DuckDBPyConnection) -> list[tuple]:
    """round_counts as the migration's backfill makes it from the rounds."""
    con.execute("CREATE OR REPLACE TEMP TABLE recorded AS SELECT * FROM round_counts")
    con.execute("DELETE FROM round_counts")
    con.execute(FILL_ROUND_COUNTS)
    rows = con.execute(COUNTS).fetchall()
    con.execute("DELETE FROM round_counts")
    con.execute("INSERT INTO round_counts SELECT * FROM recorded")
    return rows


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return retimed(tmp_path_factory.mktemp("counts") / "runs.duckdb")


def same(fast: pd.DataFrame, plain: pd.DataFrame) -> None:
    assert len(fast) > 0
    pd.testing.assert_frame_equal(fast, plain, check_exact=True, check_dtype=False)


def test_write_run_counts_every_round_as_the_backfill_does(tmp_path):
    path = add_trees(build(tmp_path / "runs.duckdb"))
    with duckdb.connect(str(path)) as con:
        recorded = con.execute(COUNTS).fetchall()
        assert recorded == counted(con)
        # a few rows per run, and every round counted once
        assert con.execute("SELECT count(*) FROM round_counts").fetchone()[0] < \
            con.execute("SELECT count(*) FROM rounds").fetchone()[0]
        assert con.execute("""SELECT count(*) FROM runs r JOIN (SELECT run_id, sum(rounds) AS n FROM round_counts
            GROUP BY run_id) c USING (run_id) WHERE c.n <> r.n_rounds""").fetchone()[0] == 0


def test_an_older_file_gets_the_same_counts_and_numbers_from_its_migration(tmp_path):
    recorded = retimed(tmp_path / "recorded.duckdb")
    old = tmp_path / "old.duckdb"
    with duckdb.connect(str(old)) as con:
        migrate(con, to_version=MIGRATIONS.index(count_rounds))  # before round_counts
        con.execute(f"ATTACH '{recorded}' AS a (READ_ONLY)")
        for table in ("runs", "rounds", "run_totals"):
            added = {"runs": "tree_nodes, engine, engine_version, engine_config, engine_report, ttft_s, repeat",
                     "rounds": "pass_rows"}.get(table)  # columns of later migrations
            columns = f"* EXCLUDE ({added})" if added else "*"
            con.execute(f"INSERT INTO {table} BY NAME SELECT {columns} FROM a.{table}")
        migrate(con)
        assert con.execute(COUNTS).fetchall() == con.execute("SELECT * FROM a.round_counts ORDER BY ALL").fetchall()
    for fn, args in ((queries.comparable_cells, (Filters(),)), (queries.verify_growth, (Filters(),)),
                     (queries.tree_drafts, ()), (advisor.positions, (Filters(),))):
        upgraded, written = queries.read(old, fn, *args), queries.read(recorded, fn, *args)
        if isinstance(upgraded, pd.DataFrame):
            pd.testing.assert_frame_equal(upgraded, written, check_exact=True)
        else:
            assert upgraded == written


@pytest.mark.parametrize("filters", SELECTIONS)
def test_nodes_per_round_equals_it_over_every_round(db, filters):
    keys = ("target", "mode", "draft", "category")
    where, params = filters.where(alias="s.")
    with duckdb.connect(str(db), read_only=True) as con:
        fast = queries.nodes_per_round(con, filters, keys)
        plain = con.execute(PLAIN_NODES.format(picked=", ".join(f"s.{k}" for k in keys), where=where), params).df()
    if filters.host:
        assert fast.empty and plain.empty
        return
    same(fast, plain)
    assert fast["tree"].any() == (not filters.draft)


def test_tree_drafts_equal_them_over_every_round(db):
    with duckdb.connect(str(db), read_only=True) as con:
        assert queries.tree_drafts(con) == [d for (d,) in con.execute(PLAIN_TREE_DRAFTS).fetchall()] == ["ngram-tree"]


@pytest.mark.parametrize("filters", SELECTIONS[:2])
def test_verify_growth_equals_it_over_every_round(db, filters):
    spec, spec_params = filters.where(alias="s.")
    base, base_params = filters.where(alias="s.", skip=("draft", "k", "k_policy"))
    with duckdb.connect(str(db), read_only=True) as con:
        fast = queries.verify_growth(con, filters)
        plain = con.execute(PLAIN_VERIFY_GROWTH.format(spec=spec, base=base), spec_params + base_params).df()
    same(fast, plain)


def test_position_stats_equal_them_over_every_round(db):
    with duckdb.connect(str(db), read_only=True) as con:
        fast = con.execute("SELECT * FROM position_stats ORDER BY ALL").df()
        plain = con.execute(f"SELECT * FROM ({PLAIN_POSITIONS}) ORDER BY ALL").df()
    same(fast, plain)


@pytest.mark.parametrize("filters", SELECTIONS[:2])
def test_the_advisor_equals_it_over_every_round(db, filters):
    sql, params = advisor.advisor_sql(filters)
    group, key = ", ".join(advisor.CURVE), ", ".join(advisor.KEY)
    fast, plain = FAST_WIDTHS.format(group=group), PLAIN_WIDTHS.format(group=group)
    fast_tree, plain_tree = FAST_TREE_WIDTHS.format(key=key), PLAIN_TREE_WIDTHS.format(key=key)
    assert fast in sql and fast_tree in sql
    with duckdb.connect(str(db), read_only=True) as con:
        same(con.execute(f"SELECT * FROM ({sql}) ORDER BY ALL", params).df(),
             con.execute(f"SELECT * FROM ({sql.replace(fast, plain).replace(fast_tree, plain_tree)}) ORDER BY ALL",
                         params).df())


def summed_position_stats(keys: str, runs: str) -> str:
    """What `positions_pooled` stands for: position_stats, one row per run and position, summed by `keys`."""
    picked = ", ".join(f"r.{key.strip()}" for key in keys.split(","))
    return f"""SELECT {picked}, s.position, sum(s.proposed)::BIGINT AS proposed, sum(s.reached)::BIGINT AS reached,
        sum(s.accepted)::BIGINT AS accepted FROM position_stats s JOIN ({runs}) r USING (run_id) GROUP BY ALL"""


@pytest.mark.parametrize("keys", ["draft", "target, mode, draft, category", "run_id"])
def test_positions_pooled_per_key_equal_position_stats_summed(db, keys):
    runs = "SELECT * FROM run_facts"
    with duckdb.connect(str(db), read_only=True) as con:
        same(con.execute(f"SELECT * FROM ({round_counts.positions_pooled(keys, runs)}) ORDER BY ALL").df(),
             con.execute(f"SELECT * FROM ({summed_position_stats(keys, runs)}) ORDER BY ALL").df())
        # a run's levels, Σ rounds · depth, as the advisor tells a tree from a chain by them
        levels = con.execute("""SELECT run_id, sum(rounds * depth) FROM round_counts WHERE k > 0
                                GROUP BY ALL ORDER BY ALL""").fetchall()
        assert levels == con.execute("SELECT run_id, sum(proposed) FROM position_stats GROUP BY ALL ORDER BY ALL"
                                     ).fetchall()


@pytest.mark.parametrize("filters", [*SELECTIONS[:2], Filters(batch_size=(1,))])  # position_stats has no batch_size
def test_the_advisor_on_pooled_positions_equals_it_on_every_runs_positions(db, filters, monkeypatch):
    sql, params = advisor.advisor_sql(filters)
    assert "position_stats" not in sql
    monkeypatch.setattr(round_counts, "positions_pooled", summed_position_stats)
    per_run, _ = advisor.advisor_sql(filters)
    with duckdb.connect(str(db), read_only=True) as con:
        same(con.execute(f"SELECT * FROM ({sql}) ORDER BY ALL", params).df(),
             con.execute(f"SELECT * FROM ({per_run}) ORDER BY ALL", params).df())
        where, where_params = filters.where()
        picked = summed_position_stats("target, mode, draft", f"SELECT * FROM runs WHERE {where}")
        same(advisor.positions(con, filters), con.execute(
            f"SELECT *, alpha(accepted, reached - accepted) AS rate FROM ({picked}) ORDER BY ALL", where_params).df())
