"""Spec-Bench and SPEED-Bench: a sweep's Spec-Bench leaderboard by its definitions (`runner report spec-bench`),
acceptance by context length, and SPEED-Bench's acceptance matrix and input-length chart (`runner report
speed-bench`). Each section says what data it needs when the sweep has none."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import common, context_chart, speed_bench_section
from runner.store import spec_bench

SPEEDUPS = [name for name, _ in spec_bench.COLUMNS] + [spec_bench.OVERALL]


def shown(table: pd.DataFrame) -> pd.DataFrame:
    """The table as printed: speedups as `2.10x`, accepted tokens to 2 decimals, – where a column has no question."""
    out = table.copy()
    for name in SPEEDUPS:
        out[name] = table[name].map(lambda v: "–" if pd.isna(v) else f"{v:.2f}x")
    out[spec_bench.MEAN_ACCEPTED] = table[spec_bench.MEAN_ACCEPTED].map(lambda v: "–" if pd.isna(v) else f"{v:.2f}")
    return out


def leaderboard(sweep: str) -> None:
    st.header("Spec-Bench")
    table = common.load(spec_bench.leaderboard, sweep)
    st.caption("Spec-Bench's definitions: a column's speedup is the mean over its questions of tokens/s (turns "
               "summed) over the same mean for plain decoding; #Mean Accepted Tokens is new tokens per target pass, "
               "the prefill's included. Multi-turn Conversation pools the eight MT-bench categories.")
    if table.empty:
        st.info("This sweep has no speculative run with a baseline.")
        return
    note = spec_bench.coverage_note(common.load(spec_bench.sweep_categories, sweep))
    if note:
        st.info(note)
    st.dataframe(shown(table), hide_index=True)
    with st.expander("Markdown, to paste beside the published table"):
        st.code(spec_bench.markdown(table), language="markdown")


def context_section(sweep: str) -> None:
    st.header("Acceptance by context length")
    metric = st.radio("metric", list(context_chart.METRICS), format_func=context_chart.METRICS.get, key="metric",
                      bind="query-params", horizontal=True)
    curve = common.load(spec_bench.context_curve, sweep)
    if curve.empty:
        st.info("This sweep has no speculative rounds.")
        return
    st.caption("Each round sits in the bucket of the tokens in the text when it started: the prompt (a later "
               "turn's holds the earlier turns and answers) and the new tokens before it. Pooled over runs, k "
               "and policies of the sweep (the `context_stats` view).")
    st.altair_chart(context_chart.acceptance_by_context(curve, metric))


st.title("Spec-Bench · SPEED-Bench")
if common.require_data(common.db_path()):
    sweeps = common.load(spec_bench.sweeps)
    if not sweeps:
        st.info("No sweep with a speculative run yet.")
        st.stop()
    sweep = st.sidebar.selectbox("sweep", sweeps, key="spec_sweep", bind="query-params")
    leaderboard(sweep)
    speed_bench_section.show(sweep)
    context_section(sweep)
