"""The version of runs.duckdb: `schema_migrations` records which migrations a file has, a new file is made at the
current version, an older one migrated to it, and foreign and newer files are refused.

The schema itself is `schema_now.py` (what a new file is made from) and `migrations.py` (how an older file gets there).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path

import duckdb

from runner.store import schema_now
from runner.store.migrations import MIGRATIONS

SCHEMA_VERSION = len(MIGRATIONS)


class StoreError(Exception):
    """A one-line, user-facing problem with the database file."""



def _db_name(con: duckdb.DuckDBPyConnection) -> str:
    return con.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchone()[0]


def schema_version(con: duckdb.DuckDBPyConnection) -> int:
    """The applied schema version (0 for an empty database); refuses foreign or newer files."""
    try:
        version, has_runs = con.execute(
            "SELECT (SELECT max(version) FROM schema_migrations), (SELECT count(*) "
            "FROM duckdb_tables() WHERE schema_name = 'main' AND table_name = 'runs')").fetchone()
    except duckdb.CatalogException:
        if con.execute("SELECT count(*) FROM duckdb_tables()").fetchone()[0]:
            raise StoreError(f"{_db_name(con)} is not a specdash database") from None
        return 0
    if (version or 0) > SCHEMA_VERSION:
        raise StoreError(f"{Path(_db_name(con)).name} has schema version {version}, newer than this specdash "
                         f"({SCHEMA_VERSION}); upgrade specdash")
    if version and not has_runs:
        raise StoreError(f"{_db_name(con)} is not a specdash database")
    return version or 0


def migrate(con: duckdb.DuckDBPyConnection, to_version: int = SCHEMA_VERSION) -> None:
    """Bring the file to `to_version`: a new, empty one to the current version in one step, from `schema_now`, with
    every migration recorded as a migrated file has them; any other by the missing migrations, each in its own
    transaction."""
    version = schema_version(con)
    if version == 0:
        con.execute("CREATE TABLE IF NOT EXISTS schema_migrations "
                    "(version INTEGER PRIMARY KEY, name TEXT, applied_at TIMESTAMP)")
        if to_version == SCHEMA_VERSION:
            _apply(con, schema_now.create, range(1, SCHEMA_VERSION + 1))
            return
    for number in range(version + 1, to_version + 1):
        _apply(con, MIGRATIONS[number - 1], [number])


def _apply(con: duckdb.DuckDBPyConnection, step: Callable[[duckdb.DuckDBPyConnection], None],
           numbers: Iterable[int]) -> None:
    """Run `step` and record the migrations `numbers` as applied, in one transaction."""
    con.begin()
    try:
        step(con)
        applied_at = datetime.now(UTC)
        for number in numbers:
            con.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)",
                        [number, MIGRATIONS[number - 1].__name__, applied_at])
        con.commit()
    except BaseException:
        con.rollback()
        raise
