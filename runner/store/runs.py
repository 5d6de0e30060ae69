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

from runner.records import BASELINE_KEY, CELL_KEY, RunRecord
from runner.store import metrics, pending, run_facts
from runner.store.connect import Locked, open_for_write, read, upgrade
from runner.store.round_counts import OUTCOME
from runner.store.schema import StoreError, migrate

T = TypeVar("T")

# One statement for all rounds: unnest zips the column lists (executemany pays a statement per round).
_ROUND_TYPES = {"run_id": "TEXT", "round": "INTEGER", "k": "INTEGER", "accepted": "INTEGER", "rejected": "INTEGER",
                "thrown": "INTEGER", "bonus": "BOOLEAN", "emitted": "INTEGER", "draft_s": "DOUBLE",
                "verify_s": "DOUBLE", "draft_tokens": "INTEGER[]", "target_tokens": "INTEGER[]",
                "draft_parents": "INTEGER[]", "accepted_path": "INTEGER[]", "depth": "INTEGER",
                "draft_p": "DOUBLE[]", "draft_q": "DOUBLE[]", "draft_u": "DOUBLE[]", "from_residual": "BOOLEAN",
                "batch_seqs": "INTEGER", "pass_rows": "INTEGER"}
_COUNT_TYPES = {"run_id": "TEXT", "k": "INTEGER", "depth": "INTEGER", "accepted": "INTEGER", "rejected": "INTEGER",
                "tree": "BOOLEAN", "pass_rows": "INTEGER", "rounds": "INTEGER", "verify_s": "DOUBLE"}
_PROVENANCE = ("torch_version", "transformers_version", "python_version", "host", "git_commit", "device_name")


def run_row(record: RunRecord) -> dict[str, object]:
    """The run's row of `runs`, by column name (`tests/store/test_store.py` holds the names to the schema)."""
    gen = record.generation
    fields = ("run_id", "sweep_id", "target", "draft", "draft_kind", "category", "prompt_id", "prompt_text", "k",
              "mode", "temperature", "top_p", "seed", "max_new_tokens", "device", "dtype", "output_text",
              "baseline_run_id", "lossless", "status", "error", "divergence_at", "divergence_gap",
              "divergence_tolerance", "divergence", "kernels", "threads", "concurrent_workers", "k_policy", "turn",
              "conversation", "batch_size", "batch_slot", "batch_id", "tree_nodes", "repeat", "engine",
              "engine_version", "engine_config", "engine_report", "ttft_s")
    row = {name: getattr(record, name) for name in fields}
    row["started_at"] = datetime.fromisoformat(record.started_at)
    row["conversation"] = record.conversation or record.prompt_id
    row |= {name: record.provenance.get(name) for name in _PROVENANCE}
    generated = {"new_tokens": None, "n_rounds": None, "target_passes": None, "draft_calls": None, "wall_s": None,
                 "prefill_s": None, "draft_s": None, "verify_s": None, "prompt_tokens": None, "output_tokens": None,
                 "stop_reason": None}
    if gen is not None:
        generated = {"new_tokens": len(gen.output_tokens), "n_rounds": len(gen.rounds),
                     "target_passes": gen.target_passes, "draft_calls": gen.draft_calls, "wall_s": gen.wall_s,
                     "prefill_s": gen.prefill_s, "draft_s": gen.draft_s, "verify_s": gen.verify_s,
                     "prompt_tokens": list(gen.prompt_tokens), "output_tokens": list(gen.output_tokens),
                     "stop_reason": gen.stop_reason}
    return row | generated


def round_columns(record: RunRecord) -> dict[str, list]:
    """The run's rows of `rounds`, as one list per column, by column name."""
    rounds = record.generation.rounds
    return {"run_id": [record.run_id] * len(rounds), "round": list(range(len(rounds))),
            "k": [r.k for r in rounds], "accepted": [r.accepted for r in rounds],
            "rejected": [r.rejected for r in rounds], "thrown": [r.thrown for r in rounds],
            "bonus": [r.bonus for r in rounds], "emitted": [r.emitted for r in rounds],
            "draft_s": [r.draft_s for r in rounds], "verify_s": [r.verify_s for r in rounds],
            "draft_tokens": [_listed(r.draft_tokens) for r in rounds],
            "target_tokens": [_listed(r.target_tokens) for r in rounds],
            "draft_parents": [_listed(r.draft_parents) for r in rounds],
            "accepted_path": [_listed(r.accepted_path) for r in rounds], "depth": [r.depth for r in rounds],
            **{name: [_listed(getattr(r, name)) for r in rounds] for name in ("draft_p", "draft_q", "draft_u")},
            "from_residual": [r.from_residual for r in rounds], "batch_seqs": [r.batch_seqs for r in rounds],
            "pass_rows": [r.pass_rows for r in rounds]}


def _listed(values: tuple | None) -> list | None:
    return None if values is None else list(values)


def totals_row(record: RunRecord) -> dict[str, object]:
    """The run's row of `run_totals`: accepted, rejected, thrown, drafted (Σ k) and emitted, summed over the rounds."""
    rounds = record.generation.rounds
    return {"run_id": record.run_id, "accepted": sum(r.accepted for r in rounds),
            "rejected": sum(r.rejected for r in rounds), "thrown": sum(r.thrown for r in rounds),
            "drafted": sum(r.k for r in rounds), "emitted": sum(r.emitted for r in rounds)}


def count_columns(record: RunRecord) -> dict[str, list]:
    """The run's rows of `round_counts`: its rounds counted by outcome, each with their summed verify time (in round
    order, as `FILL_ROUND_COUNTS` sums them), as one list per column."""
    counted: dict[tuple, list] = {}
    for r in record.generation.rounds:
        outcome = (r.k, r.depth, r.accepted, r.rejected, r.draft_parents is not None, r.pass_rows)
        seen = counted.setdefault(outcome, [0, 0.0])
        seen[0] += 1
        seen[1] = None if seen[1] is None or r.verify_s is None else seen[1] + r.verify_s  # untimed rounds: NULL
    outcomes = list(zip(*counted, strict=True))
    return {"run_id": [record.run_id] * len(counted), **dict(zip(OUTCOME, map(list, outcomes), strict=True)),
            "rounds": [n for n, _ in counted.values()], "verify_s": [s for _, s in counted.values()]}


def _insert_sql(table: str, names: list[str], unnest: dict[str, str] | None = None) -> str:
    values = (", ".join(f"unnest(?::{unnest[n]}[])" for n in names) if unnest
              else "VALUES (" + ", ".join("?" * len(names)) + ")")
    return f"INSERT INTO {table} ({', '.join(names)}) " + (f"SELECT {values}" if unnest else values)


def _insert(con: duckdb.DuckDBPyConnection, record: RunRecord) -> None:
    """The run row and all its rounds in one transaction: a reader sees all of it or none."""
    run = run_row(record)
    rounds = round_columns(record) if record.generation and record.generation.rounds else None
    con.begin()
    try:
        con.execute(_insert_sql("runs", list(run)), list(run.values()))
        if rounds:
            con.execute(_insert_sql("rounds", list(rounds), _ROUND_TYPES), list(rounds.values()))
            totals = totals_row(record)
            con.execute(_insert_sql("run_totals", list(totals)), list(totals.values()))
            counts = count_columns(record)
            con.execute(_insert_sql("round_counts", list(counts), _COUNT_TYPES), list(counts.values()))
        run_facts.refresh(con, record.run_id)
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


def baseline_for(db_path: str | os.PathLike, sweep_id: str, key: tuple,
                 lock_timeout_s: float = 30.0) -> tuple[str, tuple[int, ...]] | None:
    """The sweep's newest 'ok' plain-decoding run with these `BASELINE_KEY` values: (run_id, output_tokens), or
    None."""
    path = Path(db_path)
    key = tuple(tuple(v) if name == "prompt_tokens" else v for name, v in zip(BASELINE_KEY, key, strict=True))
    where = " AND ".join(f"{name} = ?" for name in BASELINE_KEY)
    params = [list(v) if name == "prompt_tokens" else v for name, v in zip(BASELINE_KEY, key, strict=True)]
    rows = read(path, f"SELECT run_id, output_tokens FROM runs WHERE sweep_id = ? AND {where} "
                      "AND draft = 'none' AND status = 'ok' ORDER BY started_at DESC LIMIT 1",
                [sweep_id, *params], lock_timeout_s)
    if rows:
        return rows[0][0], tuple(rows[0][1])
    for _, r in pending.pending(path):
        if r.sweep_id == sweep_id and r.baseline_key() == key and r.draft == "none" and r.status == "ok":
            return r.run_id, r.generation.output_tokens
    return None


_SWEEPS = f"""SELECT sweep_id, min(started_at) AS started,
    string_agg(DISTINCT target, ', ' ORDER BY target) AS target,
    string_agg(DISTINCT draft, ', ' ORDER BY draft) AS drafts, count(*) AS runs,
    count(*) FILTER (status = 'error') AS errors,
    count(*) FILTER (lossless = false) AS lossless_failures,
    {metrics.LOSSLESS["real_divergences"]} AS real_divergences, {metrics.LOSSLESS["unjudged"]} AS unjudged
    FROM runs GROUP BY sweep_id ORDER BY started DESC, sweep_id"""


def list_sweeps(db_path: str | os.PathLike, lock_timeout_s: float = 30.0) -> pd.DataFrame:
    """One row per sweep, newest first; a file of an older specdash is upgraded first, as the dashboard does."""
    upgrade(db_path, lock_timeout_s)
    columns = ["sweep_id", "started", "target", "drafts", "runs", "errors", "lossless_failures", "real_divergences",
               "unjudged"]
    return pd.DataFrame(read(Path(db_path), _SWEEPS, [], lock_timeout_s), columns=columns)


SUMMARY_KEYS = ("category", "draft", "k", "mode", "k_policy")
SUMMARY_COLUMNS = (*SUMMARY_KEYS, "runs", "alpha", "tau", "thrown_share", "measured_speedup", "predicted_speedup",
                   "real_divergences", "numeric_ties", "unjudged")


def sweep_summary(db_path: str | os.PathLike, sweep_id: str, lock_timeout_s: float = 30.0) -> pd.DataFrame:
    """Per category × draft × k × mode, the Overview's cells of this sweep (`metrics.cells_sql`)."""
    cells, params = metrics.cells_sql(metrics.Filters(sweep_id=(sweep_id,)), SUMMARY_KEYS)
    sql = f"SELECT {', '.join(SUMMARY_COLUMNS)} FROM ({cells}) ORDER BY {', '.join(SUMMARY_KEYS)}"
    return pd.DataFrame(read(Path(db_path), sql, params, lock_timeout_s), columns=list(SUMMARY_COLUMNS))
