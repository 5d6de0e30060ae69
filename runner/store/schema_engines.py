"""Migration `add_engines`: which engine decoded a run (ours, or vLLM: runner/vllm/), and what that engine reports
that ours does not (kept here to keep `schema.py` short)."""

from __future__ import annotations

import duckdb

from runner.store import schema_facts


def add_engines(con: duckdb.DuckDBPyConnection) -> None:
    """`runs.engine` ('specdash' for every run before: our engine decoded them all), the engine's version, the exact
    speculative config it ran and its own report of the request's steps (vLLM), its time to first token; run_facts
    gains the engine's columns, so its table is worked out again. A vLLM round's tokens and times are not reported:
    those columns of `rounds` are NULL for its runs, and so are draft_s, verify_s and c of the run."""
    for column, kind in (("engine", "TEXT"), ("engine_version", "TEXT"), ("engine_config", "TEXT"),
                         ("engine_report", "TEXT"), ("ttft_s", "DOUBLE")):
        con.execute(f"ALTER TABLE runs ADD COLUMN {column} {kind}")
    con.execute("UPDATE runs SET engine = 'specdash'")
    con.execute("DROP VIEW run_stats")
    con.execute("DROP TABLE run_facts")
    schema_facts.create_run_facts(con)
