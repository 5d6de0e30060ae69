"""Which draft, which k, which policy: answers that compare like with like.

A speedup depends on more than the draft: the kernels and threads change the pass itself, the mode and temperature
the acceptance, and an easy prompt lifts any cell that ran it. So the answers are per **setup** (target, device,
kernels, threads, mode, temperature, top-p, batch size), never pooled across setups, and within a setup × category every
(draft, k, policy) cell is judged on the **common prompts**: those that the most selected cells of that setup ×
category ran (with a baseline to measure against), which is all of them when they share any. A cell that missed one
is left out and named (`left_out`). Baselines are kept to the same prompts.

The Overview's headline, the Compare page's leaderboard and the k advisor all read these, so they give one answer.
"""

from __future__ import annotations

import duckdb
import pandas as pd

from runner.store import spread
from runner.store.metrics import LOSSLESS, LOSSLESS_SQL, Filters

SETUP = ("engine", "target", "device", "kernels", "threads", "mode", "temperature", "top_p", "batch_size")
# NULL never matches in a join: runs recorded before kernels or threads existed get a stand-in value.
_NORMALISED = "coalesce(kernels, 'not recorded') AS kernels, coalesce(threads, 0) AS threads"
_KEYS = ", ".join(SETUP)


def _ctes(filters: Filters) -> tuple[str, list]:
    """The CTEs every answer starts from, and their parameters:

    - `cell_prompts`: each selected speculative (draft, k, policy) cell of a setup × category, and the prompts it
      ran with a baseline;
    - `common`: the setup × category's common prompts, those run by the most cells (all of them, when every cell
      ran a shared prompt);
    - `kept_cells`: the cells that ran every common prompt; a cell that did not is left out of the answers (it
      cannot be compared like with like), and `left_out` names it.
    """
    where, params = filters.where()
    return f"""
        cell_prompts AS (
            SELECT DISTINCT * EXCLUDE (kernels, threads), {_NORMALISED} FROM (
                SELECT {_KEYS}, category, draft, k, k_policy, prompt_id FROM run_stats
                WHERE draft <> 'none' AND measured_speedup IS NOT NULL AND {where})),
        prompt_cells AS (SELECT {_KEYS}, category, prompt_id, count(*) AS cells FROM cell_prompts GROUP BY ALL),
        common AS (SELECT {_KEYS}, category, prompt_id FROM prompt_cells
            QUALIFY cells = max(cells) OVER (PARTITION BY {_KEYS}, category)),
        n_common AS (SELECT {_KEYS}, category, count(*) AS n FROM common GROUP BY ALL),
        kept_cells AS (SELECT {_KEYS}, category, draft, k, k_policy, true AS kept
            FROM cell_prompts JOIN common USING ({_KEYS}, category, prompt_id) JOIN n_common USING ({_KEYS}, category)
            GROUP BY ALL HAVING count(*) = any_value(n))""", params


def comparable_runs_sql(filters: Filters) -> tuple[str, list]:
    """The run ids on a common prompt of their setup × category: the baselines, and the kept cells' runs."""
    ctes, params = _ctes(filters)
    return f"""
        WITH {ctes}
        SELECT r.run_id FROM (SELECT run_id, category, prompt_id, draft, k, k_policy,
            {_KEYS.replace('kernels, threads, ', '')}, {_NORMALISED} FROM runs) r
        JOIN common USING ({_KEYS}, category, prompt_id)
        LEFT JOIN kept_cells USING ({_KEYS}, category, draft, k, k_policy)
        WHERE r.draft = 'none' OR kept""", params


# The cells' keys: a setup × category, then what is compared within it.
CELL = (*SETUP, "category", "draft", "k", "k_policy")


def cells(con: duckdb.DuckDBPyConnection, filters: Filters) -> pd.DataFrame:
    """Every kept cell of a setup × category, pooled by `spread.POOLING` over the common prompts: its speedup, the
    interval and the prompts' min–max of it, α pooled over its runs' drafts with the prompts' min–max, τ and c (mean
    over runs), the thrown share, the formula's speedup (geometric mean over runs), runs, prompts and lossless
    checks (`metrics.LOSSLESS`). The Overview's table, the headline, the leaderboard and the Batches page read these
    numbers."""
    sql, params = cells_sql(filters)
    return spread.with_intervals(con.execute(sql, params).df())


def cells_sql(filters: Filters) -> tuple[str, list]:
    """`cells`' query and its parameters (the SQL page shows it: with no filter it has none)."""
    ctes, params = _ctes(filters)
    where, more = filters.where()
    keys = ", ".join(CELL)
    return f"""
        WITH {ctes},
        picked AS (SELECT * REPLACE ({_NORMALISED}) FROM run_stats
            WHERE draft <> 'none' AND measured_speedup IS NOT NULL AND {where}),
        kept AS (SELECT * FROM picked JOIN common USING ({_KEYS}, category, prompt_id)
            JOIN kept_cells USING ({_KEYS}, category, draft, k, k_policy)),
        per_prompt AS (SELECT {keys}, prompt_id, count(*) AS runs, ln(geomean(measured_speedup)) AS ln_speedup,
                sum(accepted) AS accepted, sum(rejected) AS rejected, sum(thrown) AS thrown, sum(drafted) AS drafted,
                sum(tau) AS tau_sum, sum(c) AS c_sum, count(c) AS c_runs, sum(ln(theoretical_speedup)) AS ln_theory,
                count(theoretical_speedup) AS theory_runs, {LOSSLESS_SQL}
            FROM kept GROUP BY ALL)
        SELECT {keys}, sum(runs)::BIGINT AS runs, count(*) AS prompts, exp(avg(ln_speedup)) AS speedup,
            avg(ln_speedup) AS mean_ln, stddev_samp(ln_speedup) AS sd_ln,
            exp(min(ln_speedup)) AS speedup_min, exp(max(ln_speedup)) AS speedup_max,
            alpha(sum(accepted), sum(rejected)) AS alpha, min(alpha(accepted, rejected)) AS alpha_min,
            max(alpha(accepted, rejected)) AS alpha_max, sum(tau_sum) / sum(runs) AS tau,
            sum(c_sum) / nullif(sum(c_runs), 0) AS c, thrown_share(sum(thrown), sum(drafted)) AS thrown_share,
            exp(sum(ln_theory) / nullif(sum(theory_runs), 0)) AS predicted_speedup,
            sum(accepted)::BIGINT AS accepted, sum(rejected)::BIGINT AS rejected, sum(thrown)::BIGINT AS thrown,
            sum(drafted)::BIGINT AS drafted, {", ".join(f"sum({name})::BIGINT AS {name}" for name in LOSSLESS)}
        FROM per_prompt GROUP BY ALL ORDER BY ALL""", params + more


def best_cells(con: duckdb.DuckDBPyConnection, filters: Filters) -> pd.DataFrame:
    """Per setup × category × draft: its best (k, policy) among the kept cells (`cells`), with its spread, and the
    draft's runner-up (k, policy) and whether the two tie (`spread.TIE`)."""
    kept = cells(con, filters)
    if kept.empty:
        return kept.assign(choice=[], runner_up=[], runner_up_speedup=[], tied=[])
    kept = kept.assign(choice=[choice(k, p) for k, p in zip(kept["k"], kept["k_policy"], strict=True)])
    # Sorted first, so that equal speedups resolve to the smaller k, as they always did.
    kept = kept.sort_values([*SETUP, "category", "draft", "k", "k_policy"], kind="stable")
    best = spread.flag_ties(kept, [*SETUP, "category", "draft"], "choice")
    return best.sort_values([*SETUP, "category", "speedup", "draft"], ascending=[True] * (len(SETUP) + 1)
                            + [False, True], ignore_index=True)


def left_out(con: duckdb.DuckDBPyConnection, filters: Filters) -> pd.DataFrame:
    """The cells the answers leave out: they missed a common prompt of their setup × category."""
    ctes, params = _ctes(filters)
    return con.execute(f"""
        WITH {ctes}
        SELECT DISTINCT {_KEYS}, category, draft, k, k_policy FROM cell_prompts
        ANTI JOIN kept_cells USING ({_KEYS}, category, draft, k, k_policy)
        ORDER BY ALL""", params).df()


def lossless_by_setup(con: duckdb.DuckDBPyConnection, filters: Filters) -> pd.DataFrame:
    """Per setup × draft over every selected run: its runs, those checked against their baseline and their
    mismatches by class (`metrics.LOSSLESS`). Every column it reads is one of runs, so it reads the 'ok' runs (those of
    run_stats) without the view's joins."""
    where, params = filters.where()
    return con.execute(f"""
        SELECT * REPLACE ({_NORMALISED}) FROM (
            SELECT {_KEYS}, draft, count(*) AS runs, {LOSSLESS_SQL}
            FROM runs WHERE status = 'ok' AND draft <> 'none' AND {where} GROUP BY ALL)
        ORDER BY ALL""", params).df()


def setup_label(row: pd.Series, several_targets: bool = False) -> str:
    """A setup in words: 'greedy · skinny kernels · 1 thread · cpu' (sampling with its temperature and top-p)."""
    mode = row["mode"] if row["mode"] == "greedy" else f"sample T={row['temperature']:g}" + (
        f" top-p={row['top_p']:g}" if row["top_p"] < 1 else "")
    threads = "threads not recorded" if row["threads"] == 0 else f"{int(row['threads'])} thread" + (
        "s" * (row["threads"] > 1))
    target = f"{row['target']} · " if several_targets else ""
    batch = f" · batch {int(row['batch_size'])}" if row.get("batch_size", 1) > 1 else ""
    return f"{target}{mode} · {row['kernels']} kernels · {threads} · {row['device']}{batch}"


def labelled(frame: pd.DataFrame) -> pd.Series:
    """`setup_label` for every row of a frame holding the SETUP columns."""
    several = frame["target"].nunique() > 1
    return frame.apply(setup_label, axis=1, several_targets=several) if len(frame) else pd.Series([], dtype=str)


def choice(k: object, policy: object) -> str:
    """A best cell's k and policy together, as every page names them: 'k=3 · fixed', 'k=4 · auto'."""
    return f"k={int(k)} · {policy}"
