"""How the gain changes as sequences share the target: speedup and throughput against batch size, per setup × draft
× k × policy × category; where speculation stops paying (the crossover); the best k at each batch size, measured and
as the k advisor recommends it.

Each run's speedup is against plain decoding of the same prompts at the same batch size (`run_stats`); they pool by
geometric mean, as every speedup does. A batch's throughput is its new tokens over its slowest member's wall time.
"""

from __future__ import annotations

from dataclasses import fields

import duckdb
import pandas as pd

from runner.store.advisor import WITHIN
from runner.store.comparable import choice
from runner.store.metrics import Filters

SETUP = ("target", "mode", "temperature", "top_p", "device", "kernels", "threads")
CURVE = (*SETUP, "draft", "k", "k_policy", "category", "batch_size")


def curve(con: duckdb.DuckDBPyConnection, filters: Filters) -> pd.DataFrame:
    """Per `CURVE` key (plain decoding too, its k and k_policy NULL): runs, batches, the speedup's geometric mean,
    tokens/s per sequence (mean over runs) and per batch (mean over batches: each holds batch_size runs)."""
    # The draft, k and policy filters pick speculative runs; plain decoding, the reference, stays.
    where, params = filters.where("r.", skip=("draft", "k", "k_policy"))
    drafts, more = filters.where("r.", skip=tuple(f.name for f in fields(Filters)
                                                  if f.name not in ("draft", "k", "k_policy")))
    return con.execute(f"""
        WITH picked AS (
            SELECT {", ".join(f"r.{key}" for key in CURVE)}, coalesce(r.batch_id, r.run_id) AS batch,
                   s.measured_speedup, s.tokens_per_s,
                   sum(r.new_tokens) OVER batch / nullif(max(r.wall_s) OVER batch, 0) AS per_batch
            FROM runs r JOIN run_stats s USING (run_id) WHERE {where} AND (r.draft = 'none' OR {drafts})
            WINDOW batch AS (PARTITION BY coalesce(r.batch_id, r.run_id)))
        SELECT {", ".join(CURVE)}, count(*) AS runs, count(DISTINCT batch) AS batches,
               geomean(measured_speedup) AS speedup, avg(tokens_per_s) AS tokens_per_s_per_seq,
               avg(per_batch) AS tokens_per_s_per_batch
        FROM picked GROUP BY ALL ORDER BY ALL""", params + more).df()


def crossovers(frame: pd.DataFrame) -> pd.DataFrame:
    """Per setup × draft × k × policy × category with speedups measured: the batch sizes, the smallest one at which
    the speedup is below 1 after paying at a smaller one (`crossover`), and that in words (`pays`)."""
    drafts = frame[frame["draft"] != "none"].dropna(subset=["speedup"])
    rows = []
    for key, group in drafts.groupby([*SETUP, "draft", "k", "k_policy", "category"], dropna=False, sort=True):
        group = group.sort_values("batch_size")
        sizes, speedups = group["batch_size"].tolist(), group["speedup"].tolist()
        below = [b for b, s in zip(sizes, speedups, strict=True) if s < 1]
        paid = [b for b, s in zip(sizes, speedups, strict=True) if s >= 1]
        crossover = next((b for b in below if paid and b > min(paid)), None)
        if not paid:
            pays = f"never: below 1× from batch {sizes[0]}"
        elif crossover is None:
            pays = f"at every batch measured (to {sizes[-1]})"
        else:
            pays = f"up to batch {max(b for b in paid if b < crossover)}; below 1× at {crossover}"
        rows.append(dict(zip([*SETUP, "draft", "k", "k_policy", "category"], key, strict=True))
                    | {"batch_sizes": sizes, "crossover": crossover, "pays": pays})
    return pd.DataFrame(rows)


def best_k_by_batch(best: pd.DataFrame) -> pd.DataFrame:
    """Per setup × draft × category of `comparable.best_cells` (the leaderboard's cells, pooled by its rule), a
    column per batch size: the best k and policy there, its speedup and interval, and '≈' where the draft's next
    (k, policy) ties it, e.g. 'k=2 · fixed 1.31× (1.10–1.56) ≈ k=3 · fixed': the table a serving engine's draft
    length per batch size takes."""
    if best.empty:
        return pd.DataFrame()
    text = [f"{choice(row.k, row.k_policy)} {row.speedup:.2f}×"
            + (f" ({row.low:.2f}–{row.high:.2f})" if row.prompts > 1 else " (1 prompt)")
            + (f" ≈ {row.runner_up}" if row.tied and row.runner_up else "") for row in best.itertuples()]
    return _by_batch_size(best.assign(best=text), [*SETUP, "draft", "category"], "best")


def advised_k_by_batch(advice: pd.DataFrame) -> pd.DataFrame:
    """Per draft × category of `advisor.k_advice` (one setup's rows), a column per batch size: what the advisor
    recommends there and how that measured, e.g. 'k=2 · fixed · measured best', 'k=4 · fixed · k=3 +4.0%, over 3%'
    (k=3 measured 4.0% faster)."""
    if advice.empty:
        return pd.DataFrame()
    cells = advice.assign(advised=[_verdict(row) for row in advice.itertuples(index=False)])
    return _by_batch_size(cells, ["draft", "category"], "advised")


def _by_batch_size(cells: pd.DataFrame, index: list[str], values: str) -> pd.DataFrame:
    """`values` of each `index` row in a column per batch size, 'batch 1', 'batch 4', ..."""
    table = cells.pivot_table(index=index, columns="batch_size", values=values, aggfunc="first")
    table.columns = [f"batch {int(b)}" for b in table.columns]
    return table.reset_index()


def _verdict(row) -> str:
    if pd.isna(row.recommended_k):  # too little measured to predict from (one k of one prompt, say)
        return f"no advice · k={int(row.measured_best_k)} measured best" if pd.notna(row.measured_best_k) else "–"
    advised = choice(row.recommended_k, row.recommended_policy)
    if row.recommended_policy != "fixed":
        return f"{advised} · beat every fixed k"
    if pd.isna(row.hit):
        return f"{advised} · not measured"
    if row.recommended_k == row.measured_best_k:
        return f"{advised} · measured best"
    faster = f"k={int(row.measured_best_k)} {row.measured_best / row.measured_at_predicted - 1:+.1%}"
    return f"{advised} · {faster}{'' if row.hit else f', over {WITHIN:.0%}'}"
