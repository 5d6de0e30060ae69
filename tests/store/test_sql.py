"""User SQL: reads work with exact values; every write, file access, setting change or runaway is refused."""

from __future__ import annotations

import hashlib
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from runner.records import Generation, Round, RunRecord
from runner.store import sql as user_sql
from runner.store.runs import write_run
from runner.store.sql import EXAMPLES, QueryError, run_query


def run(run_id: str, draft: str, k: int | None, rounds: tuple[Round, ...], wall_s: float) -> RunRecord:
    gen = Generation((1, 2), (5, 6, 7, 8), rounds, 0.1, wall_s, len(rounds), "max_new_tokens")
    return RunRecord(run_id, "s1", "2025-03-01T12:00:00", "smollm2", draft, "ngram", "code", "p1", "x", k,
                     "greedy", 0.0, 1.0, 0, 4, "cpu", "float32", "ok", None, gen, "x",
                     None if draft == "none" else "base", None if draft == "none" else True)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sql") / "runs.duckdb"
    one_token = Round(0, 0, 0, 0, False, 1, 0.0, 0.05, (), (5,))
    write_run(path, run("base", "none", None, (one_token,) * 4, 0.3))
    # k=3: Σaccepted 3, Σrejected 1, emitted 4 + 0: α = 3/4
    write_run(path, run("spec", "ngram", 3, (
        Round(3, 3, 0, 0, True, 4, 0.003, 0.06, (5, 6, 7), (5, 6, 7, 8)),
        Round(3, 0, 1, 2, False, 0, 0.003, 0.06, (1, 1, 1), (9, 0, 0, 0)),  # cut by max_new_tokens
    ), 0.2))
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_select_returns_exact_values(db):
    result = run_query(db, "SELECT run_id, draft, k, alpha, tau, n_rounds FROM run_stats ORDER BY run_id")
    assert result.columns == ["run_id", "draft", "k", "alpha", "tau", "n_rounds"]
    rows = result.frame.astype(object).where(result.frame.notna(), None).values.tolist()
    assert rows == [["base", "none", None, None, 1.0, 4], ["spec", "ngram", 3, 0.75, 2.0, 2]]
    assert result.truncated is False


def test_queries_run_under_the_sandbox_settings(db):
    names = ["threads", "memory_limit", "max_execution_time", "enable_external_access", "lock_configuration",
             "autoload_known_extensions", "autoinstall_known_extensions", "allow_community_extensions", "access_mode"]
    result = run_query(db, "SELECT " + ", ".join(f"current_setting('{n}') AS {n}" for n in names), timeout_ms=1234)
    assert result.frame.values.tolist() == [[2, "488.2 MiB", 1234, False, True, False, False, False, "read_only"]]


def test_more_rows_than_max_rows_are_cut_and_flagged(db):
    cut = run_query(db, "SELECT round FROM rounds WHERE run_id = 'base' ORDER BY round", max_rows=3)
    assert (cut.frame["round"].tolist(), cut.truncated) == ([0, 1, 2], True)
    whole = run_query(db, "SELECT round FROM rounds WHERE run_id = 'base' ORDER BY round", max_rows=4)
    assert (whole.frame["round"].tolist(), whole.truncated) == ([0, 1, 2, 3], False)


@pytest.mark.parametrize("sql", [
    "WITH r AS (SELECT * FROM runs) SELECT count(*) FROM r", "FROM runs SELECT count(*)", "VALUES (1), (2)",
    "DESCRIBE runs", "SHOW TABLES", "SUMMARIZE rounds", "EXPLAIN SELECT * FROM runs",
    "EXPLAIN ANALYZE SELECT count(*) FROM rounds", "PRAGMA table_info('runs')", "PRAGMA show_tables",
    "PIVOT rounds ON accepted USING count(*) GROUP BY run_id", "-- a comment first\nSELECT 1;",
])
def test_read_statements_are_allowed(db, sql):
    assert len(run_query(db, sql).frame) > 0


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_runs(db, name):
    assert run_query(db, EXAMPLES[name]).columns


def test_a_plain_sql_error_is_duckdbs_first_line(db):
    with pytest.raises(QueryError, match=r'^Binder Error: Referenced column "nope" not found in FROM clause!$'):
        run_query(db, "SELECT nope FROM runs")
    with pytest.raises(QueryError, match=r'^Parser Error: syntax error at or near "SELEC"$'):
        run_query(db, "SELEC 1")


@pytest.mark.parametrize("sql", ["", "   ", ";", "-- nothing but a comment"])
def test_empty_sql_is_refused(db, sql):
    with pytest.raises(QueryError, match="^empty query$"):
        run_query(db, sql)


def test_a_missing_database_is_a_query_error(tmp_path):
    with pytest.raises(QueryError, match="^no database at "):
        run_query(tmp_path / "none.duckdb", "SELECT 1")


READ_ONLY = "^refused: only read statements"
FILES = "^(refused: )?file access is disabled"
HOSTILE = [
    ("SELECT * FROM read_csv('/etc/passwd')", FILES),
    ("SELECT * FROM read_text('/etc/passwd')", FILES),
    ("SELECT * FROM glob('/*')", FILES),
    ("SELECT * FROM read_parquet('{tmp}/other.parquet')", FILES),
    ("SELECT * FROM duckdb_secrets()", FILES),
    ("COPY runs TO '{tmp}/x.csv'", READ_ONLY),
    ("EXPORT DATABASE '{tmp}/export'", READ_ONLY),
    ("ATTACH ':memory:' AS scratch", READ_ONLY),
    ("ATTACH '{tmp}/other.duckdb' AS other", READ_ONLY),
    ("DETACH runs", READ_ONLY),
    ("INSTALL httpfs", READ_ONLY),
    ("LOAD httpfs", READ_ONLY),
    ("SET threads = 8", READ_ONLY),
    ("RESET threads", READ_ONLY),
    ("SET memory_limit = '100GB'", READ_ONLY),
    ("USE memory", READ_ONLY),
    ("CREATE TABLE t (x INTEGER)", READ_ONLY),
    ("CREATE MACRO m(x) AS x", READ_ONLY),
    ("CREATE SECRET s (TYPE s3, KEY_ID 'a', SECRET 'b')", READ_ONLY),
    ("INSERT INTO runs (run_id, sweep_id) VALUES ('x', 'y')", READ_ONLY),
    ("WITH x AS (SELECT 1) INSERT INTO runs (run_id, sweep_id) SELECT 'x', 'y'", READ_ONLY),
    ("DELETE FROM runs", READ_ONLY),
    ("UPDATE runs SET error = 'x'", READ_ONLY),
    ("DROP TABLE runs", READ_ONLY),
    ("ALTER TABLE runs ADD COLUMN z INTEGER", READ_ONLY),
    ("PRAGMA enable_profiling", READ_ONLY),
    ("PRAGMA threads = 8", READ_ONLY),
    ("CALL pragma_table_info('runs')", READ_ONLY),
    ("CHECKPOINT", READ_ONLY),
    ("VACUUM", READ_ONLY),
    ("BEGIN TRANSACTION", READ_ONLY),
    ("EXPLAIN ANALYZE CREATE TABLE t AS SELECT 1", READ_ONLY),
    ("EXPLAIN ANALYZE COPY runs TO '{tmp}/y.csv'", READ_ONLY),
    ("SELECT 1; SELECT 2", "^refused: only one statement at a time$"),
    ("SELECT 1; DROP TABLE runs", "^refused: only one statement at a time$"),
]


@pytest.mark.parametrize(("sql", "refusal"), HOSTILE)
def test_hostile_statements_are_refused_and_change_nothing(db, sql, refusal):
    tmp = db.parent
    before, files = digest(db), sorted(tmp.iterdir())
    with pytest.raises(QueryError, match=refusal):
        run_query(db, sql.format(tmp=tmp))
    assert run_query(db, "SELECT count(*) AS n FROM runs").frame["n"].tolist() == [2]
    assert (digest(db), sorted(tmp.iterdir())) == (before, files)


def test_python_variables_cannot_be_scanned(db, monkeypatch):
    # DuckDB's replacement scan would read a DataFrame visible where the query runs.
    monkeypatch.setattr(user_sql, "leak", pd.DataFrame({"secret": [42]}), raising=False)
    with pytest.raises(QueryError, match="leak does not exist"):
        run_query(db, "SELECT * FROM leak")


def test_a_runaway_query_hits_the_time_limit(db):
    # DuckDB's interrupt, not the query's end: counting 10^10 rows takes minutes
    with pytest.raises(QueryError, match=r"^time limit of 0\.3 s reached$"):
        run_query(db, "SELECT count(*) FROM range(10000000000) a", timeout_ms=300)
    assert run_query(db, "SELECT 1 AS one").frame["one"].tolist() == [1]


@pytest.mark.parametrize("bomb", ["SELECT string_agg(repeat('x', 1000), '') FROM range(1000000)",
                                  "SELECT list(i) FROM range(200000000) t(i)"])
def test_a_memory_bomb_hits_the_memory_limit(db, bomb):
    with pytest.raises(QueryError, match=r"^memory limit reached \(512MB\)$"):
        run_query(db, bomb)
    assert run_query(db, "SELECT 1 AS one").frame["one"].tolist() == [1]


def test_a_database_held_by_a_writer_is_busy_then_readable(db):
    writer = duckdb.connect(str(db))  # same process: a second config on the file is refused, then retried
    try:
        with pytest.raises(QueryError, match="is busy"):
            run_query(db, "SELECT 1", lock_bound_s=0.5)
    finally:
        writer.close()
    assert run_query(db, "SELECT 1 AS one").frame["one"].tolist() == [1]
