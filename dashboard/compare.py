"""Compare drafts: a leaderboard per target × mode, two drafts head to head, and which k to use."""

from __future__ import annotations

import dataclasses

import pandas as pd
import streamlit as st

from dashboard import charts, common, frames, k_advice, queries
from runner.store import comparable, metrics

FILTERS = ("engine", "target", "category", "mode", "device", "host", "concurrent_workers", "kernels", "threads",
           "sweep_id")


def _leaderboard_config(table: pd.DataFrame) -> dict:
    """Formats by the metric each column ends with ('code α', 'code best', …)."""
    formats = {" α": "%.3f", " τ": "%.2f", " speedup": "%.2f×", " (geo-mean)": "%.2f×"}
    config = {column: st.column_config.NumberColumn(column, format=fmt)
              for column in table.columns for suffix, fmt in formats.items() if column.endswith(suffix)}
    config |= {column: st.column_config.TextColumn(column, help="the k and draft-length policy with the best "
                                                   "measured speedup") for column in table.columns
               if column.endswith(" best")}
    config["setup"] = st.column_config.TextColumn("setup", help="mode, kernels, threads and device: rows of "
                                                  "different setups are never pooled")
    config["prompts"] = st.column_config.NumberColumn(
        "prompts", help="per category: the prompts every compared (draft, k, policy) cell of this setup ran; "
        "each cell is measured on these only")
    config["lossless_rate"] = st.column_config.TextColumn(
        "lossless", help="greedy runs whose output equals the baseline's token for token; a mismatch is a numeric "
        "tie (the target's contested logits within rounding of each other) or a real divergence")
    return config


def _lossless(rate: float, ties: int, real: int) -> str:
    """The rate, then what the mismatches were: a real divergence is a bug, a numeric tie is rounding."""
    if pd.isna(rate):
        return "n/a (sampling)"
    notes = [f"{n} {name}{'s' * (n > 1)}" for n, name in ((real, "real divergence"), (ties, "numeric tie")) if n]
    return f"{rate:.0%}" + (f" ({', '.join(notes)})" if notes else "")


def _head_to_head(cells: pd.DataFrame, drafts: list[str], filters: metrics.Filters) -> None:
    st.subheader("Head to head")
    left, right = st.columns(2)
    a = left.selectbox("draft A", drafts, index=0, key="a", bind="query-params")
    b = right.selectbox("draft B", drafts, index=min(1, len(drafts) - 1), key="b", bind="query-params")
    if a == b:
        st.info("Pick two different drafts.")
        return
    table = frames.head_to_head(cells, a, b)
    st.dataframe(table, hide_index=True, column_config={
        column: st.column_config.NumberColumn(column, format="%.3f" if column.startswith("α") else "%.2f")
        for column in table.columns if "·" in column})
    curves = common.load(metrics.formula_over_k, dataclasses.replace(filters, draft=(a, b)))
    st.altair_chart(charts.speedup_by_k(frames.speedup_by_k(cells[cells["draft"].isin([a, b])], curves)))


def render() -> None:
    if (start := common.filtered("Compare drafts", FILTERS, queries.cells)) is None:
        return
    filters, cells = start
    st.subheader("Leaderboard")
    rates = common.load(comparable.lossless_by_setup, filters)
    rates["lossless_rate"] = [_lossless(*row) for row in
                              rates[["lossless_rate", "numeric_ties", "real_divergences"]].itertuples(index=False)]
    best = common.load(comparable.best_cells, filters)
    if best.empty:
        st.info("No category has a prompt that every selected draft, k and policy ran with a baseline.")
    else:
        table = frames.best_leaderboard(best, rates)
        st.dataframe(table, hide_index=True, column_config=_leaderboard_config(table))
    st.caption("One row per setup × draft: setups (mode, kernels, threads, device) are never pooled. Per category "
               "the k and policy with the best measured speedup (geometric mean over its runs), with that cell's "
               "α and τ; every cell is measured on the same prompts, those that all compared cells ran. Ranked "
               "within a setup by the geometric mean of the best speedups. "
               + frames.left_out_note(common.load(comparable.left_out, filters)))
    _head_to_head(cells, sorted(cells["draft"].unique()), filters)
    k_advice.render(filters)


if __name__ == "__main__":  # st.navigation runs each page file as __main__
    with common.one_connection():
        render()
