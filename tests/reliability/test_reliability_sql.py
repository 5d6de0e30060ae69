"""Hostile SQL through both doors users have: `runner sql` and the dashboard's SQL page.

tests/store/test_sql.py covers runner.sql.run_query itself; here the same attacks go through the CLI and through the
SQL page under AppTest. Each must be refused with one clear line, change no file, and leave the door open: a
normal query right after it works, in the same session.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from typer.testing import CliRunner

from runner.cli import app as cli
from tests.helpers.dashboard_fixtures import build

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")
READ_ONLY = "refused: only read statements"
ONE_STATEMENT = "refused: only one statement at a time"
FILES = "refused: file access is disabled"
TIME = "time limit of 5 s reached"
MEMORY = "memory limit reached (512MB)"
NORMAL = "SELECT count(*) AS n FROM runs"
RUNS = 13  # in tests/helpers/dashboard_fixtures.py: 3 baselines, 9 speculative runs, 1 failed run

# (what it tries, the SQL ({tmp}: the database's folder, {db}: the file), the start of the refusal)
ATTACKS = [
    ("read a file as CSV", "SELECT * FROM read_csv('/etc/passwd')", FILES),
    ("read a file as text", "SELECT * FROM read_text('/etc/passwd')", FILES),
    ("read a file as a blob", "SELECT * FROM read_blob('/etc/passwd')", FILES),
    # without external access DuckDB does not even try the path as a file: it looks for a table of that name
    ("read a file by its name", "SELECT * FROM '/etc/passwd'", "Catalog Error: Table with name /etc/passwd does not"),
    ("list files", "SELECT * FROM glob('/etc/*')", FILES),
    # DuckDB exempts the connection's own database and WAL from enable_external_access = false
    ("read the database file raw", "SELECT size FROM read_blob('{db}')", FILES),
    ("read the WAL raw", "SELECT size FROM read_blob('{db}.wal')", FILES),
    ("read a file through query()", "SELECT * FROM query('SELECT * FROM read_text(''/etc/passwd'')')", FILES),
    ("read a spilled run next to the database", "SELECT * FROM read_text('{db}.pending/r1.json')", FILES),
    ("write a file", "COPY runs TO '{tmp}/stolen.csv'", READ_ONLY),
    ("write a query's result", "COPY (SELECT * FROM runs) TO '{tmp}/stolen.parquet' (FORMAT parquet)", READ_ONLY),
    ("export the database", "EXPORT DATABASE '{tmp}/export'", READ_ONLY),
    ("attach another file", "ATTACH '{tmp}/other.duckdb' AS other", READ_ONLY),
    ("attach the database read-write", "ATTACH '{db}' AS rw", READ_ONLY),
    ("install an extension", "INSTALL httpfs", READ_ONLY),
    ("load an extension", "LOAD httpfs", READ_ONLY),
    ("loosen a limit", "SET memory_limit = '100GB'", READ_ONLY),
    ("turn file access on", "SET enable_external_access = true", READ_ONLY),
    ("reset a limit", "RESET max_execution_time", READ_ONLY),
    ("create a table", "CREATE TABLE evil AS SELECT 1", READ_ONLY),
    ("drop a table", "DROP TABLE runs", READ_ONLY),
    ("insert", "INSERT INTO runs (run_id, sweep_id) VALUES ('x', 'y')", READ_ONLY),
    ("update", "UPDATE runs SET status = 'error'", READ_ONLY),
    ("delete", "DELETE FROM rounds", READ_ONLY),
    ("alter", "ALTER TABLE runs RENAME TO gone", READ_ONLY),
    ("several statements", "SELECT 1; DROP TABLE runs", ONE_STATEMENT),
    ("a read hiding a write", "SELECT 1; COPY runs TO '{tmp}/x.csv'", ONE_STATEMENT),
    # 10^12 pairs: hours. (count(*) over range(10^10) alone finishes in ~2 s: DuckDB is fast at counting.)
    ("run forever", "SELECT count(*) FROM range(1000000) a, range(1000000) b WHERE a.range + b.range = -1", TIME),
    ("exhaust memory", "SELECT string_agg(repeat('x', 1000), '') FROM range(1000000)", MEMORY),
]
IDS = [a[0] for a in ATTACKS]


def state(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("hostile") / "runs.duckdb")


def _sql(db: Path, text: str) -> str:
    return text.format(tmp=db.parent, db=db)


@pytest.mark.parametrize(("sql", "refusal"), [a[1:] for a in ATTACKS], ids=IDS)
def test_runner_sql_refuses_the_attack_and_answers_the_next_query(db, sql, refusal):
    before = state(db.parent)
    result = CliRunner().invoke(cli, ["sql", "--db", str(db), _sql(db, sql)])
    assert result.exit_code == 2, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {refusal}"), result.stderr
    assert state(db.parent) == before
    after = CliRunner().invoke(cli, ["sql", "--db", str(db), NORMAL])
    assert after.exit_code == 0 and f"│ {RUNS} │" in after.stdout, after.stderr


@pytest.fixture(scope="module")
def session(db: Path) -> Iterator[AppTest]:
    """One browser session on the SQL page, kept across attacks as a persistent attacker would."""
    mp = pytest.MonkeyPatch()
    mp.setenv("SPECDASH_DB", str(db))
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.switch_page("sql_page.py")
    at.run()
    yield at
    mp.undo()


def _submit(at: AppTest, sql: str) -> AppTest:
    at.text_area(key="sql").input(sql)
    return at.button(key="run_sql").click().run()


@pytest.mark.parametrize(("sql", "refusal"), [a[1:] for a in ATTACKS], ids=IDS)
def test_the_sql_page_refuses_the_attack_and_stays_up(db, session, sql, refusal):
    before = state(db.parent)
    at = _submit(session, _sql(db, sql))
    assert not at.exception, [e.value for e in at.exception]
    assert [e.value for e in at.error] and at.error[0].value.startswith(refusal), [e.value for e in at.error]
    assert len(at.error) == 1 and not at.dataframe
    assert state(db.parent) == before
    at = _submit(session, NORMAL)  # the same user, next query
    assert not at.exception and not at.error
    assert at.dataframe[0].value["n"].tolist() == [RUNS]


def test_after_every_attack_a_new_user_gets_the_overview(db, monkeypatch):
    monkeypatch.setenv("SPECDASH_DB", str(db))
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception and not at.error
    assert {m.label: m.value for m in at.metric}["speculative runs"] == "9"
    assert at.get("vega_lite_chart")
