"""`runner merge`: runs, benchmarks and draft-head trainings recorded in other databases, brought into one by
run_id, bench_id and train_id.

Every source is checked before anything is written, so one foreign or newer file refuses the whole merge.
A source from an older specdash is upgraded through the migrations on a temporary copy, never in place.
Then everything goes in as one transaction: a merge happens whole or not at all, and merging again adds
nothing.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import duckdb

from runner.store import pending
from runner.store.connect import check_db, open_db, open_for_write
from runner.store.schema import SCHEMA_VERSION, StoreError, migrate, schema_version


@dataclass(frozen=True)
class Added:
    """What one source brought."""

    source: Path
    runs: int  # runs new to the destination
    sweeps: int  # sweeps those runs belong to
    present: int  # runs the destination already had (skipped)
    rows: dict[str, int]  # rows added per table keyed by run_id, runs aside (rounds, run_totals, …)
    benches: int  # benchmarks (bench_id) new to the destination
    trainings: int  # draft-head trainings (train_id) new to the destination
    unflushed: int  # runs still spilled next to the source (`<db>.pending/`), not in the file, so not merged

    def line(self) -> str:
        parts = [f"+{self.runs} runs ({self.sweeps} sweeps)"] + [f"+{n} {t}" for t, n in sorted(self.rows.items())]
        text = (f"{self.source}: {', '.join(parts)}, +{self.benches} benchmarks, +{self.trainings} trainings; "
                f"{self.present} runs already there")
        if self.unflushed:
            text += f"; {self.unflushed} runs spilled in {pending.pending_dir(self.source)} were not merged"
        return text


def merge(sources: list[Path], into: Path, lock_timeout_s: float = 30.0) -> list[Added]:
    """Add every run and benchmark of `sources` that `into` lacks; `into` is created if absent."""
    check_db(into, lock_timeout_s)
    unique = list(dict.fromkeys(Path(os.path.abspath(s)) for s in sources))
    for source in unique:
        if source == Path(os.path.abspath(into)) or (source.exists() and into.exists() and source.samefile(into)):
            raise StoreError(f"{source} is the database merged into")
    with tempfile.TemporaryDirectory(prefix="specdash-merge-") as scratch:
        current = [_current(source, Path(scratch) / f"{i}.duckdb", lock_timeout_s) for i, source in enumerate(unique)]
        con, _ = open_for_write(into, lock_timeout_s)
        try:
            return _merge_all(con, unique, current)
        finally:
            con.close()


def _current(source: Path, copy: Path, lock_timeout_s: float) -> Path:
    """`source` itself when it has this specdash's schema, else an upgraded copy; StoreError if unusable."""
    con, _ = open_db(source, read_only=True, bound_s=lock_timeout_s)
    try:
        version = schema_version(con)  # refuses foreign and newer files
        if version == 0:
            raise StoreError(f"{source} holds no specdash data")
        if version == SCHEMA_VERSION:
            return source
        # Copied while our read-only handle keeps writers out, so the file and its WAL are consistent.
        shutil.copyfile(source, copy)
        wal = source.with_name(source.name + ".wal")
        if wal.exists():
            shutil.copyfile(wal, copy.with_name(copy.name + ".wal"))
    finally:
        con.close()
    with duckdb.connect(str(copy)) as upgrading:
        migrate(upgrading)
    return copy


def _merge_all(con: duckdb.DuckDBPyConnection, sources: list[Path], files: list[Path]) -> list[Added]:
    aliases = [f"merge_source_{i}" for i in range(len(files))]
    attached = []
    try:
        for alias, file, source in zip(aliases, files, sources, strict=True):
            quoted = str(file).replace("'", "''")
            try:
                con.execute(f"ATTACH '{quoted}' AS {alias} (READ_ONLY)")
            except duckdb.Error as error:
                raise StoreError(f"cannot read {source}: {str(error).splitlines()[0]}") from None
            attached.append(alias)
        con.begin()
        try:
            added = [_merge_one(con, alias, source) for alias, source in zip(aliases, sources, strict=True)]
            con.commit()
        except BaseException:
            con.rollback()
            raise
        return added
    finally:
        for alias in attached:
            con.execute(f"DETACH {alias}")


def _tables_with(con: duckdb.DuckDBPyConnection, alias: str, column: str) -> list[str]:
    return [name for (name,) in con.execute(
        "SELECT DISTINCT c.table_name FROM duckdb_columns() c JOIN duckdb_tables() t "
        "ON t.database_name = c.database_name AND t.schema_name = c.schema_name AND t.table_name = c.table_name "
        "WHERE c.database_name = ? AND c.schema_name = 'main' AND c.column_name = ? ORDER BY 1",
        [alias, column]).fetchall()]


def _merge_one(con: duckdb.DuckDBPyConnection, alias: str, source: Path) -> Added:
    """One source's new runs with their per-run rows, and its new benchmarks."""
    new = "run_id NOT IN (SELECT run_id FROM runs)"
    runs, sweeps, present = con.execute(
        f"SELECT count(*) FILTER ({new}), count(DISTINCT sweep_id) FILTER ({new}), count(*) FILTER (NOT {new}) "
        f"FROM {alias}.runs").fetchone()
    # The per-run rows first: once the runs are in, `new` no longer tells which runs are new.
    rows = {table: _insert(con, table, f"SELECT * FROM {alias}.{table} WHERE {new}")
            for table in _tables_with(con, alias, "run_id") if table != "runs"}
    _insert(con, "runs", f"SELECT * FROM {alias}.runs WHERE {new}")
    benches, trainings = _merge_keyed(con, alias, "bench_id"), _merge_keyed(con, alias, "train_id")
    return Added(source, runs, sweeps, present, rows, benches, trainings, len(pending.pending(source)))


def _merge_keyed(con: duckdb.DuckDBPyConnection, alias: str, key: str) -> int:
    """The source's rows of every table keyed by `key` (a benchmark's, a training's) whose key that table lacks;
    returns how many keys were new."""
    added = 0
    for table in _tables_with(con, alias, key):
        fresh = f"{key} NOT IN (SELECT {key} FROM {table})"
        new = con.execute(f"SELECT count(DISTINCT {key}) FROM {alias}.{table} WHERE {fresh}").fetchone()[0]
        added = max(added, new)
        _insert(con, table, f"SELECT * FROM {alias}.{table} WHERE {fresh}")
    return added


def _insert(con: duckdb.DuckDBPyConnection, table: str, select: str) -> int:
    # BY NAME: an upgraded copy can order its columns differently from a file created at this version.
    return con.execute(f"INSERT INTO {table} BY NAME {select}").fetchone()[0]
