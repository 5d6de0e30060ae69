"""Which draft, which k, which policy: answers that compare like with like.

A speedup depends on more than the draft: the kernels and threads change the pass itself, the mode and temperature
the acceptance, and an easy prompt lifts any cell that ran it. So the answers are per **setup** (target, device,
kernels, threads, mode, temperature, top-p), never pooled across setups, and within a setup × category every
(draft, k, policy) cell is judged on the **common prompts**: those that every selected cell of that setup ×
category ran (with a baseline to measure against). Baselines are kept to the same prompts.

The Overview's headline, the Compare page's leaderboard and the k advisor all read these, so they give one answer.
"""

from __future__ import annotations

import duckdb
import pandas as pd

from runner.store.metrics import Filters

SETUP = ("target", "device", "kernels", "threads", "mode", "temperature", "top_p")
# NULL never matches in a join: runs recorded before kernels or threads existed get a stand-in value.
_NORMALISED = "coalesce(kernels, 'not recorded') AS kernels, coalesce(threads, 0) AS threads"
_KEYS = ", ".join(SETUP)


def common_prompts_sql(filters: Filters) -> tuple[str, list]:
    """Per setup × category, the prompts that every selected speculative (draft, k, policy) cell of it ran."""
    where, params = filters.where()
    return f"""
        WITH cell_prompts AS (
            SELECT DISTINCT * EXCLUDE (kernels, threads), {_NORMALISED} FROM (
                SELECT {_KEYS}, category, draft, k, k_policy, prompt_id FROM run_stats
                WHERE draft <> 'none' AND measured_speedup IS NOT NULL AND {where})),
        cells AS (SELECT {_KEYS}, category, count(DISTINCT (draft, k, k_policy)) AS n FROM cell_prompts GROUP BY ALL)
        SELECT {_KEYS}, category, prompt_id FROM cell_prompts JOIN cells USING ({_KEYS}, category)
        GROUP BY ALL HAVING count(*) = any_value(n)""", params


def comparable_runs_sql(filters: Filters) -> tuple[str, list]:
    """The run ids, speculative and baseline, on a common prompt of their setup × category."""
    common, params = common_prompts_sql(filters)
    return f"""
        SELECT r.run_id FROM (SELECT run_id, category, prompt_id, {_KEYS.replace('kernels, threads, ', '')},
            {_NORMALISED} FROM runs) r JOIN ({common}) c USING ({_KEYS}, category, prompt_id)""", params


def best_cells(con: duckdb.DuckDBPyConnection, filters: Filters) -> pd.DataFrame:
    """Per setup × category × draft: its best (k, policy) by measured speedup (geometric mean over its runs on the
    common prompts), with that cell's α, τ and runs, and how many common prompts the category has."""
    common, params = common_prompts_sql(filters)
    where, more = filters.where()
    return con.execute(f"""
        WITH common AS ({common}),
        picked AS (SELECT * REPLACE ({_NORMALISED}) FROM run_stats
            WHERE draft <> 'none' AND measured_speedup IS NOT NULL AND {where}),
        kept AS (SELECT * FROM picked JOIN common USING ({_KEYS}, category, prompt_id)),
        cell AS (SELECT {_KEYS}, category, draft, k, k_policy, count(*) AS runs,
                count(DISTINCT prompt_id) AS prompts, alpha(sum(accepted), sum(rejected)) AS alpha, avg(tau) AS tau,
                geomean(measured_speedup) AS speedup
            FROM kept GROUP BY ALL)
        SELECT * FROM cell
        QUALIFY row_number() OVER (PARTITION BY {_KEYS}, category, draft ORDER BY speedup DESC, k, k_policy) = 1
        ORDER BY {_KEYS}, category, speedup DESC, draft""", params + more).df()


def lossless_by_setup(con: duckdb.DuckDBPyConnection, filters: Filters) -> pd.DataFrame:
    """Per setup × draft over every selected run: the share of checked runs equal to their baseline, and the
    mismatches by class (`queries.lossless_rates`, per setup)."""
    where, params = filters.where()
    return con.execute(f"""
        SELECT * REPLACE ({_NORMALISED}) FROM (
            SELECT {_KEYS}, draft, count(*) AS runs, avg(lossless::INTEGER) AS lossless_rate,
                count(*) FILTER (divergence = 'tie') AS numeric_ties,
                count(*) FILTER (divergence = 'real') AS real_divergences
            FROM run_stats WHERE draft <> 'none' AND {where} GROUP BY ALL)
        ORDER BY ALL""", params).df()


def setup_label(row: pd.Series, several_targets: bool = False) -> str:
    """A setup in words: 'greedy · skinny kernels · 1 thread · cpu' (sampling with its temperature and top-p)."""
    mode = row["mode"] if row["mode"] == "greedy" else f"sample T={row['temperature']:g}" + (
        f" top-p={row['top_p']:g}" if row["top_p"] < 1 else "")
    threads = "threads not recorded" if row["threads"] == 0 else f"{int(row['threads'])} thread" + (
        "s" * (row["threads"] > 1))
    target = f"{row['target']} · " if several_targets else ""
    return f"{target}{mode} · {row['kernels']} kernels · {threads} · {row['device']}"


def labelled(frame: pd.DataFrame) -> pd.Series:
    """`setup_label` for every row of a frame holding the SETUP columns."""
    several = frame["target"].nunique() > 1
    return frame.apply(setup_label, axis=1, several_targets=several) if len(frame) else pd.Series([], dtype=str)


def choice(k: object, policy: object) -> str:
    """A best cell's k and policy together, as every page names them: 'k=3 · fixed', 'k=4 · auto'."""
    return f"k={int(k)} · {policy}"
