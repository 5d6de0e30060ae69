"""The Engines page's queries (no Streamlit here): our engine and vLLM on the prompts both ran, per category, draft
kind and k, with vLLM's own figures beside ours computed from the same verify steps."""

from __future__ import annotations

import duckdb
import pandas as pd

from runner.store.round_counts import positions_pooled

KEYS = ("category", "draft_kind", "k")
# The speculative runs of prompts that both engines ran (the same prompt ids: run on the same chat template).
_BOTH = """SELECT f.*, r.engine_report FROM run_facts f JOIN runs r USING (run_id)
    WHERE f.draft <> 'none' AND (f.prompt_id, r.prompt_tokens) IN (
        SELECT (prompt_id, prompt_tokens) FROM runs WHERE status = 'ok' GROUP BY ALL
        HAVING count(DISTINCT engine) > 1)"""


def side_by_side(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Per engine, category, draft kind and k: α, τ over every round, speedup; then, from the same steps, τ over the
    steps that drafted and accepted over drafted (vLLM's definitions), and vLLM's own figures where it reported them."""
    report = "CAST(json_extract(engine_report, '$.{}') AS DOUBLE)"
    return con.execute(f"""
        SELECT engine, category, draft_kind, k, string_agg(DISTINCT draft, ', ' ORDER BY draft) AS drafts,
            count(*) AS runs, alpha(sum(accepted), sum(rejected)) AS alpha,
            sum(new_tokens - 1) / nullif(sum(n_rounds), 0) AS tau,
            geomean(measured_speedup) AS speedup,
            1 + sum(accepted) / nullif(sum(drafting_rounds), 0) AS tau_drafting_steps,
            sum(accepted) / nullif(sum(drafted), 0) AS accepted_over_drafted,
            1 + sum({report.format('num_accepted_draft_tokens')}) / nullif(sum({report.format('num_spec_steps')}), 0)
                AS own_mean_acceptance_length,
            sum({report.format('num_accepted_draft_tokens')}) / nullif(sum({report.format('num_draft_tokens')}), 0)
                AS own_acceptance_rate
        FROM ({_BOTH}) GROUP BY ALL ORDER BY category, draft_kind, k, engine""").df()


def differences(frame: pd.DataFrame) -> pd.DataFrame:
    """vLLM's α, τ and speedup beside ours per category, draft kind and k, and vLLM's minus ours."""
    wide = frame.pivot_table(index=list(KEYS), columns="engine", values=["alpha", "tau", "speedup"], aggfunc="first")
    out = pd.DataFrame(index=wide.index)
    for figure in ("alpha", "tau", "speedup"):
        if ("vllm" in frame["engine"].values) and ("specdash" in frame["engine"].values):
            out[f"{figure} vLLM"] = wide[(figure, "vllm")]
            out[f"{figure} ours"] = wide[(figure, "specdash")]
            out[f"{figure} Δ"] = out[f"{figure} vLLM"] - out[f"{figure} ours"]
    return out.reset_index()


def positions(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Acceptance per draft position (accepted / reached), per engine, draft kind and k, on the prompts both ran."""
    pooled = positions_pooled("engine, draft_kind, k", _BOTH)
    return con.execute(f"""SELECT engine, draft_kind, k, position, reached, accepted,
            accepted / nullif(reached, 0) AS rate FROM ({pooled}) ORDER BY draft_kind, k, position, engine""").df()
