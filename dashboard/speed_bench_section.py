"""SPEED-Bench's section of the Spec-Bench page: the acceptance matrix of the qualitative split (draft × category),
per-position acceptance, and τ and speedup by input length over the throughput splits, one set per engine: the
page's sweep, and beside it each other engine's newest SPEED-Bench sweep."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import common, length_chart
from runner.store import speed_bench

METRICS = {"tau": "τ: mean acceptance length, bonus included (1 + accepted / drafts)",
           "alpha": "α: accepted / (accepted + rejected)",
           "acceptance_rate": "acceptance rate: accepted / drafted (vLLM's)"}
NEEDS = ("This sweep ran no SPEED-Bench prompt (ids like qualitative-12 or throughput_2k-3). The section needs a "
         "sweep of SPEED-Bench's files: `runner sweep --prompts <directory with qualitative.jsonl and "
         "throughput_<n>k.jsonl> --draft ...`.")


def wide(matrix: pd.DataFrame, metric: str) -> pd.DataFrame:
    """One engine's matrix: a row per method, a column per category (`all` last), two decimals."""
    categories = [c for c in dict.fromkeys(matrix["category"]) if c != speed_bench.ALL] + [speed_bench.ALL]
    table = matrix.pivot(index="method", columns="category", values=metric).reindex(columns=categories)
    return table.map(lambda v: "–" if pd.isna(v) else f"{v:.2f}").reset_index()


def positions(matrix: pd.DataFrame) -> pd.DataFrame:
    """Per-position acceptance: a row per method × category, a column per draft position."""
    columns = [c for c in matrix.columns if c[:1] == "p" and c[1:].isdigit() and matrix[c].notna().any()]
    out = matrix[["method", "category", *columns]].rename(columns={c: f"pos {c[1:]}" for c in columns})
    return out.round(3)


def show(sweep: str) -> None:
    st.header("SPEED-Bench")
    sweeps = common.load(speed_bench.beside_other_engines, sweep)
    matrix = common.load(speed_bench.acceptance, sweeps)
    lengths = common.load(speed_bench.by_length, sweeps)
    if matrix.empty and lengths.empty:
        others = [s for s in common.load(speed_bench.sweeps) if s != sweep]
        st.info(NEEDS + (f" Sweeps with them: {', '.join(others)}." if others else ""))
        return
    st.caption("vLLM's definitions (`vllm bench serve`): a draft is a round that proposed tokens; per-position "
               "acceptance at i = drafts that accepted at least i tokens / drafts, so τ = 1 + their sum."
               + (f" Beside this sweep, each other engine's newest: {', '.join(sweeps[1:])}." if sweeps[1:] else ""))
    metric = st.radio("matrix", list(METRICS), format_func=METRICS.get, key="speed_metric", bind="query-params")
    for engine, part in matrix.groupby("engine", sort=True):
        st.subheader(f"{engine}: {METRICS[metric].split(':')[0]} by category (qualitative split)")
        st.dataframe(wide(part, metric), hide_index=True)
        with st.expander(f"{engine}: per-position acceptance"):
            st.dataframe(positions(part), hide_index=True)
    if matrix.empty:
        st.info("No run of the qualitative split in this sweep: the matrix needs qualitative.jsonl.")
    st.subheader("Does a draft degrade on long prompts?")
    if lengths.empty:
        st.info("No run of a throughput split in this sweep: the chart needs throughput_<n>k.jsonl files.")
        return
    st.caption("Over each throughput split: τ, and the speedup as the draft's tokens per second over plain "
               "decoding's on the same prompts (prefill included, as a served request's).")
    st.altair_chart(length_chart.by_input_length(lengths))
