"""A new file, made from schema_now.py, and a file made at version 1 and migrated have one schema: the same catalog
(tables, columns, constraints, indexes, views, macros, schema_migrations) and, after the same writes, the same rows in
every table and view. The comparison itself is shown to notice one planted difference of each kind."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from runner.store.schema import SCHEMA_VERSION, migrate
from tests.helpers.catalog import Catalog, catalog, differences
from tests.helpers.dashboard_fixtures import add_benches, add_trees, build


def new_file() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    migrate(con)
    return con


def migrated_file() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    migrate(con, to_version=1)
    migrate(con)
    return con


def test_a_file_made_at_version_1_and_migrated_has_the_schema_of_a_new_file():
    new, migrated = catalog(new_file()), catalog(migrated_file())
    assert differences(new, migrated) == []
    # not two empty catalogs: every table, view and macro is there, and every migration is recorded
    assert sorted({row[0] for row in new["columns"]}) == [
        "batch_stats", "bench_results", "comparable_runs", "context_stats", "position_stats", "round_counts",
        "rounds", "run_facts", "run_stats", "run_totals", "runs", "schema_migrations", "training_epochs",
        "training_positions", "trainings"]
    assert [row[0] for row in new["views"]] == ["batch_stats", "comparable_runs", "context_stats", "position_stats",
                                                "run_stats"]
    assert [row[0] for row in new["macros"]] == ["alpha", "draft_cost", "formula_speedup", "geomean", "tau",
                                                 "thrown_share"]
    assert [version for version, _ in new["schema_migrations"]] == list(range(1, SCHEMA_VERSION + 1))


def test_a_new_file_records_when_each_migration_was_applied():
    assert new_file().execute("SELECT count(applied_at) FROM schema_migrations").fetchone()[0] == SCHEMA_VERSION


def test_a_migrated_file_and_a_new_one_hold_the_same_rows_after_the_same_writes(tmp_path: Path):
    new, old = tmp_path / "new.duckdb", tmp_path / "old.duckdb"
    with duckdb.connect(str(old)) as con:
        migrate(con, to_version=1)
    for db in (new, old):  # the first write migrates the old file
        add_benches(add_trees(build(db)))
    with duckdb.connect(str(new), read_only=True) as con:
        relations = sorted({row[0] for row in catalog(con)["columns"]} - {"schema_migrations"})
        rows = {name: con.execute(f"SELECT * FROM {name} ORDER BY ALL").fetchall() for name in relations}
    with duckdb.connect(str(old), read_only=True) as con:
        assert {name: con.execute(f"SELECT * FROM {name} ORDER BY ALL").fetchall() for name in relations} == rows
    # the writes reached every table and view but the trainings': none of them is compared empty
    assert {name for name, got in rows.items() if not got} == {"training_epochs", "training_positions", "trainings"}


# A small schema written by hand, and the same with one thing changed: the comparison must name exactly that thing.
TABLE, MACRO, VIEW = ("CREATE TABLE t (a INTEGER PRIMARY KEY, b TEXT)", "CREATE MACRO half(x) AS x / 2",
                      "CREATE VIEW v AS SELECT a, half(a) AS h FROM t")


def hand_made(statements: list[str]) -> Catalog:
    con = duckdb.connect()
    for statement in statements:
        con.execute(statement)
    return catalog(con)


@pytest.mark.parametrize("planted, expected", [
    (["CREATE TABLE t (a BIGINT PRIMARY KEY, b TEXT)", MACRO, VIEW], [  # a column's type
        ("columns", "one", ("t", 1, "a", "INTEGER", False, None)),
        ("columns", "other", ("t", 1, "a", "BIGINT", False, None)),
        ("columns", "one", ("v", 1, "a", "INTEGER", True, None)),
        ("columns", "other", ("v", 1, "a", "BIGINT", True, None))]),
    (["CREATE TABLE t (a INTEGER PRIMARY KEY, b TEXT NOT NULL)", MACRO, VIEW], [  # its nullability
        ("columns", "one", ("t", 2, "b", "VARCHAR", True, None)),
        ("columns", "other", ("t", 2, "b", "VARCHAR", False, None)),
        ("constraints", "other", ("t", "NOT NULL", ["b"], "NOT NULL"))]),
    (["CREATE TABLE t (a INTEGER PRIMARY KEY, b TEXT DEFAULT 'x')", MACRO, VIEW], [  # its default
        ("columns", "one", ("t", 2, "b", "VARCHAR", True, None)),
        ("columns", "other", ("t", 2, "b", "VARCHAR", True, "'x'"))]),
    (["CREATE TABLE t (b TEXT, a INTEGER PRIMARY KEY)", MACRO, VIEW], [  # the columns' order
        ("columns", "one", ("t", 1, "a", "INTEGER", False, None)),
        ("columns", "one", ("t", 2, "b", "VARCHAR", True, None)),
        ("columns", "other", ("t", 1, "b", "VARCHAR", True, None)),
        ("columns", "other", ("t", 2, "a", "INTEGER", False, None))]),
    (["CREATE TABLE t (a INTEGER, b TEXT)", MACRO, VIEW], [  # the key
        ("columns", "one", ("t", 1, "a", "INTEGER", False, None)),
        ("columns", "other", ("t", 1, "a", "INTEGER", True, None)),
        ("constraints", "one", ("t", "NOT NULL", ["a"], "NOT NULL")),
        ("constraints", "one", ("t", "PRIMARY KEY", ["a"], "PRIMARY KEY(a)"))]),
    ([TABLE, "CREATE MACRO half(x) AS x / 3", VIEW], [  # a macro's body (the view's SQL that calls it is the same)
        ("macros", "one", ("half", "macro", ["x"], "(x / 2)")),
        ("macros", "other", ("half", "macro", ["x"], "(x / 3)"))]),
    ([TABLE, MACRO, VIEW, "CREATE MACRO twice(x) AS 2 * x"], [  # a macro more
        ("macros", "other", ("twice", "macro", ["x"], "(2 * x)"))]),
    ([TABLE, MACRO, "CREATE VIEW v AS SELECT a, half(a) AS h FROM t WHERE a > 0"], [  # a view's SQL
        ("views", "one", ("v", "CREATE VIEW v AS SELECT a, half(a) AS h FROM t;")),
        ("views", "other", ("v", "CREATE VIEW v AS SELECT a, half(a) AS h FROM t WHERE (a > 0);"))]),
    ([TABLE, MACRO], [  # a view missing
        ("columns", "one", ("v", 1, "a", "INTEGER", True, None)),
        ("columns", "one", ("v", 2, "h", "DOUBLE", True, None)),
        ("views", "one", ("v", "CREATE VIEW v AS SELECT a, half(a) AS h FROM t;"))]),
    ([TABLE, MACRO, VIEW, "CREATE TABLE u (a INTEGER)"], [  # a table more
        ("columns", "other", ("u", 1, "a", "INTEGER", True, None))]),
    ([TABLE, MACRO, VIEW, "CREATE INDEX t_b ON t (b)"], [  # an index
        ("indexes", "other", ("t", "t_b", False, False, "[b]", "CREATE INDEX t_b ON t(b);"))]),
])
def test_the_comparison_names_one_planted_difference(planted, expected):
    assert differences(hand_made([TABLE, MACRO, VIEW]), hand_made([TABLE, MACRO, VIEW])) == []
    assert sorted(differences(hand_made([TABLE, MACRO, VIEW]), hand_made(planted))) == sorted(expected)


@pytest.mark.parametrize("drift, expected", [
    # schema_now.py without a migration's column
    ("ALTER TABLE runs DROP COLUMN repeat", [("columns", "one", ("runs", 59, "repeat", "INTEGER", True, "0"))]),
    # a column's type changed on one side only
    ("ALTER TABLE round_counts ALTER pass_rows TYPE BIGINT", [
        ("columns", "one", ("round_counts", 9, "pass_rows", "INTEGER", True, None)),
        ("columns", "other", ("round_counts", 9, "pass_rows", "BIGINT", True, None))]),
    # a metric macro redefined on one side only
    ("CREATE OR REPLACE MACRO tau(emitted, rounds) AS emitted / rounds", [
        ("macros", "one", ("tau", "macro", ["emitted", "rounds"], '(emitted / "nullif"(rounds, 0))')),
        ("macros", "other", ("tau", "macro", ["emitted", "rounds"], "(emitted / rounds)"))]),
    # a migration not recorded
    ("DELETE FROM schema_migrations WHERE version = 27", [
        ("schema_migrations", "one", (27, "create_comparable_runs"))]),
])
def test_drift_planted_in_a_throwaway_file_is_caught(drift, expected):
    drifted = new_file()
    drifted.execute(drift)
    assert differences(catalog(migrated_file()), catalog(drifted)) == expected


def test_a_view_left_out_of_a_throwaway_file_is_caught():
    migrated, drifted = catalog(migrated_file()), new_file()
    drifted.execute("DROP VIEW batch_stats")
    found = differences(migrated, catalog(drifted))
    assert len(found) == 21 + 1  # its 21 columns and its SQL, each on the migrated side alone
    assert found == [(kind, "one", row) for kind in ("columns", "views") for row in migrated[kind]
                     if row[0] == "batch_stats"]
