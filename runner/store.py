"""runs.duckdb: its schema (an ordered list of migrations), the runner's writes and reads.

DESIGN §5: any open handle on the file blocks a writer, and a writer blocks every reader, so
each function here opens the file for one short job and closes it again. Lock conflicts are
retried with jittered backoff; a write that stays locked is spilled to `<db>.pending/` and the
next write (or `flush_pending`) moves it into the database.
"""

from __future__ import annotations

import dataclasses
import fcntl
import itertools
import json
import os
import random
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

import duckdb
import pandas as pd

from runner.records import Generation, Round, RunRecord
from runner.schema import MIGRATIONS, SCHEMA_VERSION


class StoreError(Exception):
    """A one-line, user-facing problem with the database file."""


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
    """A file attached to this process's in-memory DuckDB for one write. Starting a DuckDB costs ~18 ms,
    attaching a file to a running one ~2 ms. Closing checkpoints the file, then detaches it, which frees its lock.
    The explicit CHECKPOINT matters: without it, readers in other processes intermittently failed with "Could not
    read enough bytes" (4 readers, 60 s: 2 of them failed thousands of times; with it, 0 errors)."""

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



_RUN_COLUMNS = (
    "run_id", "sweep_id", "started_at", "target", "draft", "draft_kind", "category", "prompt_id", "prompt_text", "k",
    "mode", "temperature", "top_p", "seed", "max_new_tokens", "device", "dtype", "new_tokens", "n_rounds",
    "target_passes", "draft_calls", "wall_s", "prefill_s", "draft_s", "verify_s", "prompt_tokens", "output_tokens",
    "output_text", "stop_reason", "baseline_run_id", "lossless", "status", "error", "torch_version",
    "transformers_version", "python_version", "host", "git_commit", "device_name",
)
_INSERT_RUN = f"INSERT INTO runs ({', '.join(_RUN_COLUMNS)}) VALUES ({', '.join('?' * len(_RUN_COLUMNS))})"
# One statement for all rounds: unnest zips the column lists (~10x faster than executemany).
_ROUND_TYPES = ("TEXT", "INTEGER", "INTEGER", "INTEGER", "INTEGER", "INTEGER", "BOOLEAN", "INTEGER", "DOUBLE",
                "DOUBLE", "INTEGER[]", "INTEGER[]")
_INSERT_ROUNDS = "INSERT INTO rounds SELECT " + ", ".join(f"unnest(?::{t}[])" for t in _ROUND_TYPES)


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
    """Apply the missing migrations up to `to_version`, each in its own transaction."""
    version = schema_version(con)
    if version == 0:
        con.execute("CREATE TABLE IF NOT EXISTS schema_migrations "
                    "(version INTEGER PRIMARY KEY, name TEXT, applied_at TIMESTAMP)")
    for number in range(version + 1, to_version + 1):
        step = MIGRATIONS[number - 1]
        con.begin()
        try:
            step(con)
            con.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)", [number, step.__name__.lstrip("_"),
                                                                            datetime.now(UTC)])
            con.commit()
        except BaseException:
            con.rollback()
            raise


def _is_lock_conflict(error: duckdb.Error) -> bool:
    # Across processes the OS file lock; within one process a second config on one file.
    text = str(error)
    return (isinstance(error, duckdb.IOException) and "lock" in text.lower()) or (
        isinstance(error, duckdb.ConnectionException) and "different configuration" in text)


READER_YIELD_S = 1.0  # a reader waits at most this long for a writer that is waiting


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
                if not _is_lock_conflict(error):
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


def record_to_dict(record: RunRecord) -> dict:
    return dataclasses.asdict(record)


def _tuples(data: dict) -> dict:
    return {key: tuple(value) if isinstance(value, list) else value for key, value in data.items()}


def record_from_dict(data: dict) -> RunRecord:
    """Inverse of record_to_dict, after a JSON round trip turned tuples into lists."""
    gen = data["generation"]
    if gen is not None:
        gen = Generation(**{**_tuples(gen), "rounds": tuple(Round(**_tuples(r)) for r in gen["rounds"])})
    return RunRecord(**{**data, "generation": gen})


def _run_row(record: RunRecord) -> list:
    gen, prov = record.generation, record.provenance
    generated = ([len(gen.output_tokens), len(gen.rounds), gen.target_passes, gen.draft_calls, gen.wall_s,
                  gen.prefill_s, gen.draft_s, gen.verify_s, list(gen.prompt_tokens), list(gen.output_tokens)]
                 if gen else [None] * 10)
    return [record.run_id, record.sweep_id, datetime.fromisoformat(record.started_at), record.target, record.draft,
            record.draft_kind, record.category, record.prompt_id, record.prompt_text, record.k, record.mode,
            record.temperature, record.top_p, record.seed, record.max_new_tokens, record.device, record.dtype,
            *generated, record.output_text, gen.stop_reason if gen else None, record.baseline_run_id,
            record.lossless, record.status, record.error,
            *(prov.get(key) for key in ("torch_version", "transformers_version", "python_version", "host",
                                        "git_commit", "device_name"))]


def _totals_row(record: RunRecord) -> list:
    """run_totals: accepted, rejected, thrown, drafted (Σ k) and emitted, summed over the rounds."""
    rounds = record.generation.rounds
    return [record.run_id, sum(r.accepted for r in rounds), sum(r.rejected for r in rounds),
            sum(r.thrown for r in rounds), sum(r.k for r in rounds), sum(r.emitted for r in rounds)]


def _round_columns(record: RunRecord) -> list[list]:
    rows = [(record.run_id, i, r.k, r.accepted, r.rejected, r.thrown, r.bonus, r.emitted, r.draft_s, r.verify_s,
             list(r.draft_tokens), list(r.target_tokens)) for i, r in enumerate(record.generation.rounds)]
    return [list(column) for column in zip(*rows, strict=True)]


def _insert(con: duckdb.DuckDBPyConnection, record: RunRecord) -> None:
    """The run row and all its rounds in one transaction: a reader sees all of it or none."""
    run_row = _run_row(record)
    rounds = _round_columns(record) if record.generation and record.generation.rounds else None
    con.begin()
    try:
        con.execute(_INSERT_RUN, run_row)
        if rounds:
            con.execute(_INSERT_ROUNDS, rounds)
            con.execute("INSERT INTO run_totals VALUES (?, ?, ?, ?, ?, ?)", _totals_row(record))
        con.commit()
    except duckdb.Error as error:
        con.rollback()
        raise StoreError(f"could not record run {record.run_id}: {str(error).splitlines()[0]}") from None


def _pending_dir(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + ".pending")


def _spill(db_path: Path, record: RunRecord) -> None:
    final = _pending_dir(db_path) / f"{quote(record.run_id, safe='')}.json"
    temp = final.with_name(final.name + ".tmp")
    try:
        final.parent.mkdir(exist_ok=True)
        temp.write_text(json.dumps(record_to_dict(record)))
        os.replace(temp, final)  # atomic: a reader never sees half a record
    except OSError as error:
        raise StoreError(f"{db_path} is locked and run {record.run_id} could not be spilled: {error}") from None


def _pending(db_path: Path) -> list[tuple[Path, RunRecord]]:
    folder = _pending_dir(db_path)
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    loaded = [(f, _load_pending(f)) for f in files]
    return [(f, record) for f, record in loaded if record is not None]


def _load_pending(file: Path) -> RunRecord | None:
    try:
        return record_from_dict(json.loads(file.read_text()))
    except FileNotFoundError:  # flushed by a writer since the listing
        return None
    except (ValueError, TypeError, KeyError) as error:
        raise StoreError(f"{file} is not a readable pending run ({error}); move it away") from None


def _flush(con: duckdb.DuckDBPyConnection, db_path: Path) -> int:
    written = 0
    for file, record in _pending(db_path):
        # A crash between commit and unlink leaves a file whose run is already stored.
        if not con.execute("SELECT 1 FROM runs WHERE run_id = ?", [record.run_id]).fetchone():
            _insert(con, record)
            written += 1
        file.unlink()
    return written


def _open_for_write(db_path: Path, bound_s: float) -> tuple[duckdb.DuckDBPyConnection, int]:
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
        _read(path, "SELECT 1", [], lock_timeout_s)  # read-only: refuses foreign, newer and non-DuckDB files
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
    con, _ = _open_for_write(Path(db_path), lock_timeout_s)
    con.close()


def write_run(db_path: str | os.PathLike, record: RunRecord, lock_timeout_s: float = 30.0) -> int:
    """Record one run, then any spilled ones; returns how many lock retries it needed.

    The run in hand goes first so that a bad pending file can never cost it.
    """
    path = Path(db_path)
    try:
        con, retries = _open_for_write(path, lock_timeout_s)
    except Locked as locked:
        _spill(path, record)
        return locked.retries
    try:
        _insert(con, record)
        _flush(con, path)
    finally:
        con.close()
    return retries


def flush_pending(db_path: str | os.PathLike, lock_timeout_s: float = 30.0) -> int:
    """Move spilled runs into the database; returns how many were written."""
    path = Path(db_path)
    if not _pending(path):
        return 0
    con, _ = _open_for_write(path, lock_timeout_s)
    try:
        return _flush(con, path)
    finally:
        con.close()


def _read(db_path: Path, sql: str, params: list, bound_s: float) -> list[tuple]:
    if not db_path.exists():
        return []
    con, _ = open_db(db_path, read_only=True, bound_s=bound_s)
    try:
        return con.execute(sql, params).fetchall() if schema_version(con) else []
    finally:
        con.close()


def recorded_runs(db_path: str | os.PathLike, sweep_id: str, lock_timeout_s: float = 30.0) -> set[tuple]:
    """Cells (prompt_id, draft, k, mode, temperature, top_p, seed) with an 'ok' run, pending too."""
    path = Path(db_path)
    rows = _read(path, "SELECT prompt_id, draft, k, mode, temperature, top_p, seed FROM runs "
                       "WHERE sweep_id = ? AND status = 'ok'", [sweep_id], lock_timeout_s)
    pending = {(r.prompt_id, r.draft, r.k, r.mode, r.temperature, r.top_p, r.seed)
               for _, r in _pending(path) if r.sweep_id == sweep_id and r.status == "ok"}
    return set(rows) | pending


def baseline_for(db_path: str | os.PathLike, sweep_id: str, prompt_id: str, mode: str, temperature: float,
                 top_p: float, seed: int, lock_timeout_s: float = 30.0) -> tuple[str, tuple[int, ...]] | None:
    """The sweep's 'ok' plain-decoding run for this cell: (run_id, output_tokens), or None."""
    path = Path(db_path)
    key = (sweep_id, prompt_id, mode, temperature, top_p, seed)
    rows = _read(path, "SELECT run_id, output_tokens FROM runs WHERE sweep_id = ? AND prompt_id = ? "
                       "AND mode = ? AND temperature = ? AND top_p = ? AND seed = ? "
                       "AND draft = 'none' AND status = 'ok' ORDER BY started_at DESC LIMIT 1",
                 list(key), lock_timeout_s)
    if rows:
        return rows[0][0], tuple(rows[0][1])
    for _, r in _pending(path):
        if (r.sweep_id, r.prompt_id, r.mode, r.temperature, r.top_p, r.seed) == key and r.draft == "none" \
                and r.status == "ok":
            return r.run_id, r.generation.output_tokens
    return None


_SWEEPS = """SELECT sweep_id, min(started_at) AS started,
    string_agg(DISTINCT target, ', ' ORDER BY target) AS target,
    string_agg(DISTINCT draft, ', ' ORDER BY draft) AS drafts, count(*) AS runs,
    count(*) FILTER (status = 'error') AS errors,
    count(*) FILTER (lossless = false) AS lossless_failures
    FROM runs GROUP BY sweep_id ORDER BY started DESC, sweep_id"""


def list_sweeps(db_path: str | os.PathLike, lock_timeout_s: float = 30.0) -> pd.DataFrame:
    """One row per sweep, newest first."""
    columns = ["sweep_id", "started", "target", "drafts", "runs", "errors", "lossless_failures"]
    return pd.DataFrame(_read(Path(db_path), _SWEEPS, [], lock_timeout_s), columns=columns)


_SWEEP_SUMMARY = """SELECT category, draft, k, mode, count(*) AS runs,
    round(sum(accepted) / nullif(sum(accepted) + sum(rejected), 0), 3) AS alpha,
    round(avg(tau), 2) AS tau, round(sum(thrown) / nullif(sum(drafted), 0), 3) AS thrown_share,
    round(exp(avg(ln(measured_speedup))), 2) AS measured_speedup,
    round(exp(avg(ln(theoretical_speedup))), 2) AS predicted_speedup,
    count(*) FILTER (lossless = false) AS lossless_failures
    FROM run_stats WHERE sweep_id = ? AND draft <> 'none'
    GROUP BY ALL ORDER BY category, draft, k, mode"""


def sweep_summary(db_path: str | os.PathLike, sweep_id: str, lock_timeout_s: float = 30.0) -> pd.DataFrame:
    """Per category × draft × k × mode: pooled α and thrown share, mean τ, geometric-mean speedups."""
    columns = ["category", "draft", "k", "mode", "runs", "alpha", "tau", "thrown_share", "measured_speedup",
               "predicted_speedup", "lossless_failures"]
    return pd.DataFrame(_read(Path(db_path), _SWEEP_SUMMARY, [sweep_id], lock_timeout_s), columns=columns)


BENCH_COLUMNS = (
    "bench_id", "started_at", "device", "device_name", "dtype", "threads", "target", "draft", "k", "category", "metric",
    "unit",
    "ours", "ours_min", "ours_max", "theirs", "theirs_min", "theirs_max", "ratio", "ratio_min", "ratio_max",
    "repeats", "prompts", "max_new_tokens", "mismatches", "alpha", "c", "goal", "goal_met", "load_before",
    "load_after", "command", "torch_version", "transformers_version", "host", "git_commit",
)
_INSERT_BENCH = (f"INSERT INTO bench_results ({', '.join(BENCH_COLUMNS)}) "
                 f"VALUES ({', '.join('?' * len(BENCH_COLUMNS))})")


def write_bench(db_path: str | os.PathLike, rows: list[dict], lock_timeout_s: float = 30.0) -> None:
    """Record one `make bench` table (each dict holds every BENCH_COLUMNS key) in one transaction."""
    path = Path(db_path)
    con, _ = _open_for_write(path, lock_timeout_s)
    try:
        con.begin()
        try:
            con.executemany(_INSERT_BENCH, [[row[c] for c in BENCH_COLUMNS] for row in rows])
            con.commit()
        except duckdb.Error as error:
            con.rollback()
            raise StoreError(f"could not record the bench: {str(error).splitlines()[0]}") from None
    finally:
        con.close()


def bench_results(db_path: str | os.PathLike, bench_id: str, lock_timeout_s: float = 30.0) -> pd.DataFrame:
    """The rows of one bench, in the order they were printed (metric, draft, k, category as written)."""
    rows = _read(Path(db_path), f"SELECT {', '.join(BENCH_COLUMNS)} FROM bench_results WHERE bench_id = ? "
                                "ORDER BY rowid", [bench_id], lock_timeout_s)
    return pd.DataFrame(rows, columns=list(BENCH_COLUMNS))
