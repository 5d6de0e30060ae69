"""`make bench` results: the `bench_results` rows, and what each metric measures (its unit, its goal and a
one-line description), shared by `bench/bench.py`, which prints and records them, and the dashboard's
Benchmark page."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import pandas as pd

from runner.store.connect import open_for_write, read
from runner.store.schema import StoreError

# The goals on the medians: (metric, the value judged, comparison, bound).
GOALS = {"plain_tokens_per_s": ("ratio", ">=", 1.0), "spec_tokens_per_s": ("ratio", ">=", 1.15),
         "overhead_share": ("ours", "<=", 0.05), "record_share": ("ours", "<=", 0.02)}
UNITS = {"plain_tokens_per_s": "tokens/s", "spec_tokens_per_s": "tokens/s", "target_passes": "passes",
         "draft_passes": "passes", "overhead_share": "share",
         "loop_overhead_share": "share", "record_share": "share", "record_ms": "ms", "speedup": "x",
         "verify_ms": "ms"}
ABOUT = {
    "plain_tokens_per_s": "(a) plain decoding, tokens/s: ours | transformers generate(do_sample=False)",
    "spec_tokens_per_s": "(b) speculative decoding, tokens/s: ours | transformers assisted generation",
    "target_passes": "(a, b) the target's forward passes per run, prefill included: ours | transformers",
    "draft_passes": "(b) the draft model's forward passes per run: ours | transformers",
    "overhead_share": "(c) wall time outside the target's and the draft's forward passes: ours | transformers",
    "loop_overhead_share": "(c) ours: wall − prefill − Σdraft_s − Σverify_s (the round loop's own time), of wall",
    "record_share": "(c) ours: store.write_run of the run's RunRecord into a DuckDB file, of the run's wall time",
    "record_ms": "(c) ours: the same recording, milliseconds per run",
    "speedup": "(d) ours over our plain decoding: measured | the formula at the run's α and c",
    "verify_ms": "verify curve: one target pass over k+1 tokens at the context length | the same at k=0",
}


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
    con, _ = open_for_write(path, lock_timeout_s)
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
    rows = read(Path(db_path), f"SELECT {', '.join(BENCH_COLUMNS)} FROM bench_results WHERE bench_id = ? "
                                "ORDER BY rowid", [bench_id], lock_timeout_s)
    return pd.DataFrame(rows, columns=list(BENCH_COLUMNS))
