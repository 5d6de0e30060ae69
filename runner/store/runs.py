"""The runner's writes and reads of runs: a run and its rounds in one transaction, the sweeps recorded,
what a resumed sweep still has to do, and the sweep's summary."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TypeVar

import duckdb
import pandas as pd

from runner.records import CELL_KEY, RunRecord
from runner.store import metrics, pending
from runner.store.connect import Locked, open_for_write, read, upgrade
from runner.store.schema import StoreError, migrate

T = TypeVar("T")

_RUN_COLUMNS = (
    "run_id", "sweep_id", "started_at", "target", "draft", "draft_kind", "category", "prompt_id", "prompt_text", "k",
    "mode", "temperature", "top_p", "seed", "max_new_tokens", "device", "dtype", "new_tokens", "n_rounds",
    "target_passes", "draft_calls", "wall_s", "prefill_s", "draft_s", "verify_s", "prompt_tokens", "output_tokens",
    "output_text", "stop_reason", "baseline_run_id", "lossless", "status", "error", "torch_version",
    "transformers_version", "python_version", "host", "git_commit", "device_name", "divergence_at",
    "divergence_gap", "divergence_tolerance", "divergence", "kernels", "threads", "concurrent_workers", "k_policy",
)
_INSERT_RUN = f"INSERT INTO runs ({', '.join(_RUN_COLUMNS)}) VALUES ({', '.join('?' * len(_RUN_COLUMNS))})"
# One statement for all rounds: unnest zips the column lists (~10x faster than executemany).
_ROUND_TYPES = ("TEXT", "INTEGER", "INTEGER", "INTEGER", "INTEGER", "INTEGER", "BOOLEAN", "INTEGER", "DOUBLE",
                "DOUBLE", "INTEGER[]", "INTEGER[]")
_INSERT_ROUNDS = "INSERT INTO rounds SELECT " + ", ".join(f"unnest(?::{t}[])" for t in _ROUND_TYPES)



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
                                        "git_commit", "device_name")),
            record.divergence_at, record.divergence_gap, record.divergence_tolerance, record.divergence,
            record.kernels, record.threads, record.concurrent_workers, record.k_policy]


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


def in_scratch(records: list[RunRecord], query: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
    """`query` over runs that are not recorded anywhere (`runner generate`, the bench's own runs), written into a
    throwaway in-memory database: their run_stats and pooled numbers are exactly a recorded sweep's."""
    with duckdb.connect(":memory:") as con:
        migrate(con)
        for record in records:
            _insert(con, record)
        return query(con)


def _flush(con: duckdb.DuckDBPyConnection, db_path: Path) -> int:
    written = 0
    for file, record in pending.pending(db_path):
        # A crash between commit and unlink leaves a file whose run is already stored.
        if not con.execute("SELECT 1 FROM runs WHERE run_id = ?", [record.run_id]).fetchone():
            _insert(con, record)
            written += 1
        file.unlink()
    return written



def write_run(db_path: str | os.PathLike, record: RunRecord, lock_timeout_s: float = 30.0) -> int:
    """Record one run, then any spilled ones; returns how many lock retries it needed.

    The run in hand goes first so that a bad pending file can never cost it.
    """
    path = Path(db_path)
    try:
        con, retries = open_for_write(path, lock_timeout_s)
    except Locked as locked:
        pending.spill(path, record)
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
    if not pending.pending(path):
        return 0
    con, _ = open_for_write(path, lock_timeout_s)
    try:
        return _flush(con, path)
    finally:
        con.close()


def recorded_runs(db_path: str | os.PathLike, sweep_id: str, lock_timeout_s: float = 30.0) -> set[tuple]:
    """The `CELL_KEY` of every 'ok' run of the sweep, spilled ones too."""
    path = Path(db_path)
    rows = read(path, f"SELECT {', '.join(CELL_KEY)} FROM runs WHERE sweep_id = ? AND status = 'ok'", [sweep_id],
                lock_timeout_s)
    spilled = {r.cell_key() for _, r in pending.pending(path) if r.sweep_id == sweep_id and r.status == "ok"}
    return set(rows) | spilled


def baseline_for(db_path: str | os.PathLike, sweep_id: str, prompt_id: str, mode: str, temperature: float,
                 top_p: float, seed: int, prompt_tokens: list[int], device: str, dtype: str,
                 lock_timeout_s: float = 30.0) -> tuple[str, tuple[int, ...]] | None:
    """The sweep's newest 'ok' plain-decoding run for this cell, fed the same prompt ids on the same device and
    dtype: (run_id, output_tokens), or None."""
    path = Path(db_path)
    key = (sweep_id, prompt_id, mode, temperature, top_p, seed, list(prompt_tokens), device, dtype)
    rows = read(path, "SELECT run_id, output_tokens FROM runs WHERE sweep_id = ? AND prompt_id = ? "
                       "AND mode = ? AND temperature = ? AND top_p = ? AND seed = ? AND prompt_tokens = ? "
                       "AND device = ? AND dtype = ? AND draft = 'none' AND status = 'ok' "
                       "ORDER BY started_at DESC LIMIT 1",
                 list(key), lock_timeout_s)
    if rows:
        return rows[0][0], tuple(rows[0][1])
    for _, r in pending.pending(path):
        if (r.sweep_id, r.prompt_id, r.mode, r.temperature, r.top_p, r.seed, list(r.generation.prompt_tokens)
                if r.generation else None, r.device, r.dtype) == key and r.draft == "none" and r.status == "ok":
            return r.run_id, r.generation.output_tokens
    return None


_SWEEPS = """SELECT sweep_id, min(started_at) AS started,
    string_agg(DISTINCT target, ', ' ORDER BY target) AS target,
    string_agg(DISTINCT draft, ', ' ORDER BY draft) AS drafts, count(*) AS runs,
    count(*) FILTER (status = 'error') AS errors,
    count(*) FILTER (lossless = false) AS lossless_failures,
    count(*) FILTER (divergence = 'real') AS real_divergences
    FROM runs GROUP BY sweep_id ORDER BY started DESC, sweep_id"""


def list_sweeps(db_path: str | os.PathLike, lock_timeout_s: float = 30.0) -> pd.DataFrame:
    """One row per sweep, newest first; a file of an older specdash is upgraded first, as the dashboard does."""
    upgrade(db_path, lock_timeout_s)
    columns = ["sweep_id", "started", "target", "drafts", "runs", "errors", "lossless_failures", "real_divergences"]
    return pd.DataFrame(read(Path(db_path), _SWEEPS, [], lock_timeout_s), columns=columns)


SUMMARY_KEYS = ("category", "draft", "k", "mode", "k_policy")
SUMMARY_COLUMNS = (*SUMMARY_KEYS, "runs", "alpha", "tau", "thrown_share", "measured_speedup", "predicted_speedup",
                   "real_divergences", "numeric_ties")


def sweep_summary(db_path: str | os.PathLike, sweep_id: str, lock_timeout_s: float = 30.0) -> pd.DataFrame:
    """Per category × draft × k × mode, the Overview's cells of this sweep (`metrics.cells_sql`)."""
    cells, params = metrics.cells_sql(metrics.Filters(sweep_id=(sweep_id,)), SUMMARY_KEYS)
    sql = f"SELECT {', '.join(SUMMARY_COLUMNS)} FROM ({cells}) ORDER BY {', '.join(SUMMARY_KEYS)}"
    return pd.DataFrame(read(Path(db_path), sql, params, lock_timeout_s), columns=list(SUMMARY_COLUMNS))
