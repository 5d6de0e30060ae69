"""Compare drafts: a leaderboard per target × mode, and two drafts head to head."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, common, frames, queries

FILTERS = ("target", "category", "mode", "device", "kernels", "threads", "sweep_id")


def _leaderboard_config(table: pd.DataFrame) -> dict:
    """Formats by the metric each column ends with ('code α', 'code best k', …)."""
    formats = {" α": "%.3f", " τ": "%.2f", " speedup": "%.2f×", " (geo-mean)": "%.2f×", "best k": "%d"}
    config = {column: st.column_config.NumberColumn(column, format=fmt)
              for column in table.columns for suffix, fmt in formats.items() if column.endswith(suffix)}
    config["lossless_rate"] = st.column_config.TextColumn(
        "lossless", help="greedy runs whose output equals the baseline's token for token")
    return config


def _lossless(rate: float) -> str:
    return "n/a (sampling)" if pd.isna(rate) else f"{rate:.0%}"


def _head_to_head(cells: pd.DataFrame, drafts: list[str]) -> None:
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
    st.altair_chart(charts.speedup_by_k(frames.speedup_by_k(cells[cells["draft"].isin([a, b])])))


def render() -> None:
    if (start := common.filtered("Compare drafts", FILTERS, queries.draft_categories)) is None:
        return
    filters, per_category = start
    st.subheader("Leaderboard")
    table = frames.leaderboard(per_category, common.load(queries.lossless_rates, filters))
    table["lossless_rate"] = table["lossless_rate"].map(_lossless)
    st.dataframe(table, hide_index=True, column_config=_leaderboard_config(table))
    st.caption("Per category: α over every k, then the k with the best measured speedup (geometric mean over "
               "prompts), its speedup and its τ. Ranked by the geometric mean of those best speedups.")
    cells = common.load(queries.cells, filters)
    _head_to_head(cells, sorted(cells["draft"].unique()))


if __name__ == "__main__":  # st.navigation runs each page file as __main__
    render()
