"""Compare drafts: a leaderboard per target × mode, two drafts head to head, and which k to use."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, common, frames, k_advice, queries, words
from runner.store import comparable

HEAD_TO_HEAD = {
    "category": st.column_config.TextColumn("category"),
    "k": st.column_config.NumberColumn("k", help=words.GLOSSARY["k"]),
    "k_policy": st.column_config.TextColumn("policy", help=words.GLOSSARY["k_policy"]),
    "speedup_a": st.column_config.NumberColumn("A ×", format="%.3f", help=words.GLOSSARY["speedup"]),
    "speedup_b": st.column_config.NumberColumn("B ×", format="%.3f"),
    "b_over_a": st.column_config.NumberColumn("B / A", format="%.3f", help="> 1: B is faster"),
    "tie": st.column_config.CheckboxColumn("tie", help=words.GLOSSARY["tie"]),
    "low_a": st.column_config.NumberColumn("A 95% low", format="%.2f"),
    "high_a": st.column_config.NumberColumn("A 95% high", format="%.2f"),
    "low_b": st.column_config.NumberColumn("B 95% low", format="%.2f"),
    "high_b": st.column_config.NumberColumn("B 95% high", format="%.2f"),
    "alpha_a": st.column_config.NumberColumn("A α", format="%.3f", help=words.GLOSSARY["alpha"]),
    "alpha_b": st.column_config.NumberColumn("B α", format="%.3f"),
    "prompts_a": st.column_config.NumberColumn("prompts", help=words.GLOSSARY["prompts"]),
    "setup": st.column_config.TextColumn("setup"),
}


def _leaderboard_config(table: pd.DataFrame) -> dict:
    """Formats by the metric each column ends with ('code α', 'code best', …)."""
    formats = {" α": "%.3f", " τ": "%.2f", " speedup": "%.3f×", " (geo-mean)": "%.2f×"}
    config = {column: st.column_config.NumberColumn(column, format=fmt)
              for column in table.columns for suffix, fmt in formats.items() if column.endswith(suffix)}
    config |= {column: st.column_config.TextColumn(column, help="the k and draft-length policy with the best "
                                                   "measured speedup") for column in table.columns
               if column.endswith(" best")}
    config |= {column: st.column_config.TextColumn(column, help=words.GLOSSARY["tie"]) for column in table.columns
               if column.endswith(" tie")}
    config["draft"] = st.column_config.TextColumn("draft", help=words.GLOSSARY["draft"])
    config["setup"] = st.column_config.TextColumn("setup", help="mode, kernels, threads and device: rows of "
                                                  "different setups are never pooled")
    config["prompts"] = st.column_config.NumberColumn(
        "prompts", help="per category: the prompts every compared (draft, k, policy) cell of this setup ran; "
        "each cell is measured on these only")
    config["lossless"] = st.column_config.TextColumn("lossless", help=words.GLOSSARY["lossless"])
    return config


def _head_to_head(cells: pd.DataFrame, drafts: list[str]) -> None:
    st.subheader("Head to head")
    left, right = st.columns(2)
    a = left.selectbox("draft A", drafts, index=0, key="a", bind="query-params", format_func=words.draft_name)
    b = right.selectbox("draft B", drafts, index=min(1, len(drafts) - 1), key="b", bind="query-params",
                        format_func=words.draft_name)
    if a == b:
        st.info("Pick two different drafts.")
        return
    table = frames.head_to_head(cells, a, b)
    if table.empty:
        st.info("The two drafts share no setup, category, k and policy: nothing to put side by side.")
    else:
        st.dataframe(table.assign(setup=comparable.labelled(table)), hide_index=True, column_config=HEAD_TO_HEAD,
                     column_order=list(HEAD_TO_HEAD))
    st.altair_chart(charts.head_to_head(frames.head_to_head_chart(cells, a, b)))
    st.caption("Each cell as the leaderboard has it: " + frames.rule_caption(cells))


def render() -> None:
    if (start := common.filtered("Compare drafts", queries.comparable_cells)) is None:
        return
    filters, cells = start
    st.subheader("Leaderboard")
    rates = common.load(comparable.lossless_by_setup, filters)
    rates["lossless"] = [words.lossless(counts) for counts in rates.to_dict("records")]
    best = common.load(comparable.best_cells, filters)
    table = frames.best_leaderboard(best, rates)
    st.dataframe(table, hide_index=True, column_config=_leaderboard_config(table))
    st.caption("One row per setup × draft: setups (mode, kernels, threads, device, batch) are never pooled. Per "
               "category the k and policy with the best measured speedup, its 95% interval, and \"≈ …\" where the "
               "draft's next-best k and policy ties it. " + frames.rule_caption(cells) + " "
               + frames.left_out_note(common.load(comparable.left_out, filters)))
    _head_to_head(cells, sorted(cells["draft"].unique()))
    k_advice.render(filters)


if __name__ == "__main__":  # st.navigation runs each page file as __main__
    with common.one_connection():
        render()
