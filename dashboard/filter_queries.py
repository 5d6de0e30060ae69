"""The reads behind the sidebar's filters: the values each can take, the sweeps named by what they ran, how many
runs a selection holds, and which filter emptied it. Pure `(con, …)` functions, as in `queries`."""

from __future__ import annotations

from dataclasses import fields

import duckdb
import pandas as pd

from runner.store.metrics import Filters


def filter_options(con: duckdb.DuckDBPyConnection) -> dict[str, list]:
    """The values each filter can take, from the speculative runs that have statistics."""
    names = [field.name for field in fields(Filters)]
    # NULL is no option: runs recorded before a column existed have none.
    lists = ", ".join(f"list(DISTINCT {name} ORDER BY {name}) FILTER ({name} IS NOT NULL)" for name in names)
    # Every filter is a column of runs, and run_stats holds exactly the 'ok' runs: read runs alone, not the view's
    # joins (at a million runs that was most of the query's time).
    row = con.execute(f"SELECT {lists} FROM runs WHERE status = 'ok' AND draft <> 'none'").fetchone()
    return {name: values or [] for name, values in zip(names, row, strict=True)}


def emptied_by(con: duckdb.DuckDBPyConnection, filters: Filters) -> tuple[str, tuple, int] | None:
    """The filter that empties the selection, taking the filters one at a time in `Filters`' order: its name, its
    values and how many speculative runs matched before it; None when every filter leaves runs (then what emptied
    a page is its own condition, e.g. a baseline to measure against)."""
    applied: dict[str, tuple] = {}
    before = con.execute("SELECT count(*) FROM runs WHERE status = 'ok' AND draft <> 'none'").fetchone()[0]
    for field in fields(Filters):
        values = getattr(filters, field.name)
        if not values:
            continue
        applied[field.name] = values
        where, params = Filters(**applied).where()
        count = con.execute(f"SELECT count(*) FROM runs WHERE status = 'ok' AND draft <> 'none' AND {where}",
                            params).fetchone()[0]
        if count == 0:
            return field.name, values, before
        before = count
    return None


def sweeps(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Per sweep: when it started, the draft kinds, categories and batch sizes it ran, and its runs: what names it."""
    return con.execute("""
        SELECT sweep_id, min(started_at) AS started,
            list(DISTINCT draft_kind ORDER BY draft_kind) FILTER (draft <> 'none') AS kinds,
            list(DISTINCT category ORDER BY category) AS categories,
            list(DISTINCT batch_size ORDER BY batch_size) AS batches,
            list(DISTINCT k_policy ORDER BY k_policy) FILTER (k_policy IS NOT NULL) AS policies,
            list(DISTINCT mode ORDER BY mode) AS modes, list(DISTINCT kernels ORDER BY kernels) AS kernels,
            list(DISTINCT threads ORDER BY threads) AS threads, count(*) AS runs
        FROM runs WHERE status = 'ok' GROUP BY sweep_id ORDER BY started DESC""").df()


def run_total(con: duckdb.DuckDBPyConnection, filters: Filters) -> int:
    """The selected speculative 'ok' runs."""
    where, params = filters.where()
    return con.execute(f"SELECT count(*) FROM runs WHERE status = 'ok' AND draft <> 'none' AND {where}",
                       params).fetchone()[0]
