"""The explainer's numbers pooled over runs, on the SQL macros that define each number once
(`METRIC_MACROS` in runner/store/schema_now.py): the Overview, the Compare page, the sweep's printed summary,
the bench and users' SQL examples all read them from here or from those macros.

A cell pools α and the thrown share over its runs' drafts, averages τ and c over runs, and takes the
geometric mean of speedups (they are ratios). Every value a user picks travels as a `?` parameter; column
names come only from the fixed fields of `Filters` and the fixed key tuples below.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, fields

import duckdb
import pandas as pd

CELL = ("target", "mode", "category", "draft", "k", "k_policy")  # the Overview's cell: a line per draft, k, policy
# What changes the target's pass itself: cells and curves the dashboard draws are kept apart by these too.
PASS_SETUP = ("device", "kernels", "threads", "batch_size")
K_RANGE = 16  # the formula's best k is looked for in 1..K_RANGE
ALPHA_STEPS = 50  # the formula's curve over α in [0, 1]: fine enough to look smooth, few rows
RUNS_ONLY = ("host", "concurrent_workers")  # filters on `runs` columns that run_stats does not carry


@dataclass(frozen=True)
class Filters:
    """The selected values per `runs` column; an empty tuple selects everything."""

    target: tuple[str, ...] = ()
    draft: tuple[str, ...] = ()
    category: tuple[str, ...] = ()
    k: tuple[int, ...] = ()
    mode: tuple[str, ...] = ()
    device: tuple[str, ...] = ()
    sweep_id: tuple[str, ...] = ()
    kernels: tuple[str, ...] = ()
    threads: tuple[int, ...] = ()
    host: tuple[str, ...] = ()
    concurrent_workers: tuple[int, ...] = ()
    k_policy: tuple[str, ...] = ()
    batch_size: tuple[int, ...] = ()
    engine: tuple[str, ...] = ()  # 'specdash' (ours) or 'vllm'

    def where(self, alias: str = "", skip: tuple[str, ...] = ()) -> tuple[str, list]:
        """A SQL condition (always valid, 'true' when nothing is picked) and its parameters."""
        clauses, params = ["true"], []
        for field, values in zip(fields(self), astuple(self), strict=True):
            if values and field.name not in skip:
                picked = f"{field.name} IN ({', '.join('?' * len(values))})"
                clauses.append(f"{alias}run_id IN (SELECT run_id FROM runs WHERE {picked})"
                               if field.name in RUNS_ONLY else f"{alias}{picked}")
                params.extend(values)
        return " AND ".join(clauses), params


# A greedy run's output against its baseline's, counted one way wherever runs are pooled, in counts that add up over
# runs: the runs checked (a sampled run is not) and their mismatches by class (docs/measuring.md, "Lossless,
# classified"): a real divergence (a bug), a numeric tie (the contested logits within rounding of each other), or
# unjudged (no logits came back to tell, as from vLLM, or it was recorded before mismatches were classified).
LOSSLESS = {
    "checked": "count(lossless)",
    "real_divergences": "count(*) FILTER (NOT lossless AND divergence = 'real')",
    "numeric_ties": "count(*) FILTER (NOT lossless AND divergence = 'tie')",
    "unjudged": "count(*) FILTER (NOT lossless AND coalesce(divergence, '') NOT IN ('real', 'tie'))",
}
LOSSLESS_SQL = ", ".join(f"{count} AS {name}" for name, count in LOSSLESS.items())


def cells_sql(filters: Filters, keys: tuple[str, ...] = CELL) -> tuple[str, list]:
    """The pooled numbers of the selected speculative runs, one row per value of `keys` (none: one row)."""
    where, params = filters.where()
    group = f"GROUP BY {', '.join(keys)} ORDER BY {', '.join(keys)}" if keys else ""
    return f"""
        SELECT {''.join(f'{key}, ' for key in keys)}count(*) AS runs, sum(n_rounds)::BIGINT AS rounds,
            sum(accepted)::BIGINT AS accepted, sum(rejected)::BIGINT AS rejected,
            sum(thrown)::BIGINT AS thrown, sum(drafted)::BIGINT AS drafted,
            alpha(sum(accepted), sum(rejected)) AS alpha, thrown_share(sum(thrown), sum(drafted)) AS thrown_share,
            avg(tau) AS tau, avg(c) AS c,
            geomean(measured_speedup) AS measured_speedup, geomean(theoretical_speedup) AS predicted_speedup,
            count(*) FILTER (lossless = false) AS lossless_failures, {LOSSLESS_SQL}
        FROM run_stats WHERE draft <> 'none' AND {where} {group}""", params


def cells(con: duckdb.DuckDBPyConnection, filters: Filters, keys: tuple[str, ...] = CELL) -> pd.DataFrame:
    sql, params = cells_sql(filters, keys)
    return con.execute(sql, params).df()


def draft_categories(con: duckdb.DuckDBPyConnection, filters: Filters) -> pd.DataFrame:
    """Per target × mode × draft × category: α over every k, the k with the best measured speedup, that
    speedup and τ there; and per draft, the geometric mean of its best speedups over categories."""
    sql, params = cells_sql(filters)
    return con.execute(f"""
        WITH cell AS ({sql}),
        best AS (
            SELECT target, mode, draft, category, alpha(sum(accepted), sum(rejected)) AS alpha,
                arg_max(k, measured_speedup) AS best_k, max(measured_speedup) AS best_speedup,
                arg_max(tau, measured_speedup) AS tau_at_best_k
            FROM cell GROUP BY ALL)
        SELECT *, geomean(best_speedup) OVER (PARTITION BY target, mode, draft) AS overall_speedup
        FROM best ORDER BY target, mode, draft, category""", params).df()


def formula_over_alpha(con: duckdb.DuckDBPyConnection, filters: Filters, k: int) -> pd.DataFrame:
    """Per target × draft × mode, the formula's speedup at k over α in [0, 1], at the mean c of the runs at k
    that have both α and a measured speedup (the runs the theory chart shows)."""
    where, params = filters.where()
    return con.execute(f"""
        WITH series AS (
            SELECT target, draft, mode, avg(c) AS c FROM run_stats
            WHERE draft <> 'none' AND {where} AND k = ? AND alpha IS NOT NULL AND measured_speedup IS NOT NULL
            GROUP BY ALL HAVING avg(c) IS NOT NULL)
        SELECT target, draft, mode, c, g.range / {ALPHA_STEPS} AS alpha,
            formula_speedup(g.range / {ALPHA_STEPS}, ?, c) AS speedup
        FROM series CROSS JOIN range({ALPHA_STEPS + 1}) g ORDER BY target, draft, mode, alpha""",
                       [*params, k, k]).df()


def formula_over_k(con: duckdb.DuckDBPyConnection, filters: Filters) -> pd.DataFrame:
    """Per target × mode × draft × category × `PASS_SETUP`, the formula's speedup at k = 1..K_RANGE at the α pooled
    over every k and the mean c over runs, with the k the formula favours (`best`)."""
    where, params = filters.where()
    keys = ", ".join(("target", "mode", "draft", "category", *PASS_SETUP))
    return con.execute(f"""
        WITH series AS (
            SELECT {keys}, alpha(sum(accepted), sum(rejected)) AS alpha, avg(c) AS c
            FROM run_stats WHERE draft <> 'none' AND {where} GROUP BY ALL
            HAVING alpha IS NOT NULL AND c IS NOT NULL),
        curve AS (
            SELECT series.*, g.range AS k, formula_speedup(alpha, g.range, c) AS speedup
            FROM series CROSS JOIN range(1, {K_RANGE + 1}) g)
        SELECT *, k = arg_max(k, speedup) OVER (PARTITION BY {keys}) AS best
        FROM curve ORDER BY {keys}, k""", params).df()
