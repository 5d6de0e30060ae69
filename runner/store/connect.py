"""Opening runs.duckdb: one writer or many readers, lock retries, and a writer that readers let in first.

Any open handle on a DuckDB file blocks a writer, and a writer blocks every reader (docs/design.md,
"DuckDB locking"), so every function of the store opens the file for one short job and closes it
again. Lock conflicts are retried with jittered backoff.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import duckdb

from runner.store.schema import SCHEMA_VERSION, StoreError, migrate, schema_version


class Locked(StoreError):
    """The file stayed locked by another process for the whole retry bound."""

    def __init__(self, db_path: Path, bound_s: float, retries: int) -> None:
        super().__init__(f"{db_path} stayed locked by another process for {bound_s:g} s")
        self.retries = retries


# Extension autoloading would try to download (e.g. sqlite_scanner for a SQLite file); never here.
_CONFIG = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}
_process_db: duckdb.DuckDBPyConnection | None = None  # an in-memory DuckDB that files are attached to for writes
_attachments = itertools.count()


class _Attachment:
    """A file attached to this process's in-memory DuckDB for one write: attaching a file to a running
    DuckDB is much cheaper than starting one. Closing checkpoints the file, then detaches it, which frees its lock.
    The explicit CHECKPOINT matters: without it, readers in other processes intermittently failed with "Could not
    read enough bytes" (bench/lock_race.py shows it)."""

    def __init__(self, path: Path) -> None:
        global _process_db
        if _process_db is None:
            _process_db = duckdb.connect(":memory:", config=_CONFIG)
        self.alias = f"specdash_{next(_attachments)}"
        self.con = _process_db.cursor()
        quoted = str(path).replace("'", "''")
        try:
            self.con.execute(f"ATTACH '{quoted}' AS {self.alias}")
            self.con.execute(f"USE {self.alias}")
        except BaseException:
            self.con.close()
            raise

    def __getattr__(self, name: str):  # execute, begin, commit, rollback: the attached file is the default
        return getattr(self.con, name)

    def close(self) -> None:
        try:
            self.con.execute(f"CHECKPOINT {self.alias}")
            self.con.execute("USE memory")
            self.con.execute(f"DETACH {self.alias}")
        finally:
            self.con.close()




T = TypeVar("T")


def _is_torn_read(error: duckdb.Error) -> bool:
    # A reader that met another process's checkpoint half-written. Rare even with the writer's explicit CHECKPOINT
    # (1 failed read in a 4-reader test of 236), and gone when the file is opened again.
    return isinstance(error, duckdb.IOException) and "Could not read enough bytes" in str(error)


def reading(db_path: str | os.PathLike, query: Callable[[duckdb.DuckDBPyConnection], T], bound_s: float) -> T:
    """`query` on a short-lived read-only connection, opened again for a read torn by a concurrent checkpoint."""
    deadline = time.monotonic() + bound_s
    while True:
        con, _ = open_db(db_path, read_only=True, bound_s=bound_s)
        try:
            return query(con)
        except duckdb.IOException as error:
            if not _is_torn_read(error) or time.monotonic() > deadline:
                raise
        finally:
            con.close()
        time.sleep(0.01)


def _is_lock_conflict(error: duckdb.Error) -> bool:
    # Across processes the OS file lock; within one process a second config on one file.
    text = str(error)
    return (isinstance(error, duckdb.IOException) and "lock" in text.lower()) or (
        isinstance(error, duckdb.ConnectionException) and "different configuration" in text)


READER_YIELD_S = 1.0  # a reader waits at most this long for a writer that is waiting
# How long a reader (a dashboard page, `runner sql`, the SQL page) waits for the file before it says it is busy. A
# run's write holds it for milliseconds on an idle machine and far longer on a loaded one, where a bound of a few
# seconds can be outlasted by one write after another (tests/test_reliability_concurrency.py).
READ_BOUND_S = 10.0


def _writer_flag(path: Path) -> Path:
    return path.with_name(path.name + ".writer")


def _yield_to_writer(path: Path, bound_s: float) -> None:
    """DuckDB admits a writer only when no reader holds the file, so readers in a loop could starve the
    runner forever. A waiting writer holds an exclusive flock on `<db>.writer`; a reader lets it in first."""
    try:
        fd = os.open(_writer_flag(path), os.O_RDONLY)
    except OSError:  # no writer has waited here yet
        return
    try:
        deadline = time.monotonic() + min(bound_s, READER_YIELD_S)
        while time.monotonic() < deadline:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # free: no writer waiting
                return
            except BlockingIOError:
                time.sleep(0.005)
    finally:
        os.close(fd)


def _claim_writer(path: Path) -> int | None:
    """Announce a waiting writer (the kernel drops the flock if the process dies); None if impossible."""
    try:
        fd = os.open(_writer_flag(path), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return None
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def open_db(db_path: str | os.PathLike, *, read_only: bool, bound_s: float = 30.0,
            config: dict | None = None) -> tuple[duckdb.DuckDBPyConnection, int]:
    """Connect, retrying lock conflicts with jittered exponential backoff; (connection, retries)."""
    path = Path(db_path)
    if not _may_be_duckdb(path):
        raise StoreError(f"{path} is not a specdash database (not a DuckDB file)")
    if read_only:
        _yield_to_writer(path, bound_s)
    flag = None if read_only else _claim_writer(path)
    deadline, retries = time.monotonic() + bound_s, 0
    try:
        while True:
            try:
                if read_only or config:
                    return duckdb.connect(str(path), read_only=read_only, config={**_CONFIG, **(config or {})}), retries
                return _Attachment(path), retries
            except duckdb.Error as error:
                if not (_is_lock_conflict(error) or _is_torn_read(error)):
                    raise _open_error(path, error) from None
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise Locked(path, bound_s, retries) from None
                time.sleep(min(remaining, min(0.5, 0.01 * 2**retries) * random.uniform(0.5, 1.5)))
                retries += 1
    finally:
        if flag is not None:
            os.close(flag)


def _may_be_duckdb(path: Path) -> bool:
    # Checked before connecting: DuckDB would hand a SQLite file to its sqlite extension. A file
    # still without its 12-byte header is left to DuckDB (a writer may be creating it right now).
    try:
        with path.open("rb") as file:
            head = file.read(12)
    except OSError:  # missing (DuckDB creates it or says so) or unreadable (DuckDB says why)
        return True
    return len(head) < 12 or head[8:] == b"DUCK"


def _open_error(path: Path, error: duckdb.Error) -> StoreError:
    text = str(error)
    if "not a valid DuckDB database file" in text:
        return StoreError(f"{path} is not a specdash database (not a DuckDB file)")
    if "read-only mode: database does not exist" in text:
        return StoreError(f"{path} does not exist")
    return StoreError(f"cannot open {path}: {text.splitlines()[0].removeprefix('IO Error: ')}")


def open_for_write(db_path: Path, bound_s: float) -> tuple[duckdb.DuckDBPyConnection, int]:
    if not db_path.parent.is_dir():
        raise StoreError(f"cannot create {db_path}: {db_path.parent} is not a directory")
    con, retries = open_db(db_path, read_only=False, bound_s=bound_s)
    try:
        migrate(con)
    except BaseException:
        con.close()
        raise
    return con, retries


def check_db(db_path: str | os.PathLike, lock_timeout_s: float = 30.0) -> None:
    """Fail now on a --db that cannot be used, creating and changing nothing (the first write creates it)."""
    path = Path(db_path)
    if path.exists():
        read(path, "SELECT 1", [], lock_timeout_s)  # read-only: refuses foreign, newer and non-DuckDB files
        return
    if not path.parent.is_dir():
        raise StoreError(f"cannot create {path}: {path.parent} is not a directory")
    try:
        with tempfile.TemporaryFile(dir=path.parent):  # /proc and read-only mounts refuse even root
            pass
    except OSError as error:
        raise StoreError(f"cannot create {path}: {error.strerror}") from None


def init_db(db_path: str | os.PathLike, lock_timeout_s: float = 30.0) -> None:
    """Create or migrate the database now, so a bad path fails before any model is loaded."""
    con, _ = open_for_write(Path(db_path), lock_timeout_s)
    con.close()


def upgrade(db_path: str | os.PathLike, lock_timeout_s: float = 30.0) -> None:
    """Migrate a file written by an older specdash, as its next write would: readers (the dashboard, user SQL)
    need the current views and metric macros. A current, missing or empty file is left untouched."""
    path = Path(db_path)
    if not path.is_file():
        return
    con, _ = open_db(path, read_only=True, bound_s=lock_timeout_s)
    try:
        version = schema_version(con)  # refuses foreign and newer files
    finally:
        con.close()
    if 0 < version < SCHEMA_VERSION:
        init_db(path, lock_timeout_s)



def read(db_path: Path, sql: str, params: list, bound_s: float) -> list[tuple]:
    if not db_path.exists():
        return []
    return reading(db_path, lambda con: con.execute(sql, params).fetchall() if schema_version(con) else [], bound_s)

