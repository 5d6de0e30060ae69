"""The Compare page's "Which k" section: acceptance per draft position, and the k advisor's prediction against
what was measured, with its recommendation per draft × category."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, common, frames, queries, words
from runner.store import advisor, comparable
from runner.store.metrics import Filters

MANY = 6  # series the position chart draws before anyone picks more

ADVICE_COLUMNS = {
    "setup": st.column_config.TextColumn("setup", help="mode, kernels, threads and device: never pooled"),
    "category": st.column_config.TextColumn("category"),
    "draft": st.column_config.TextColumn("draft"),
    "measured_choice": st.column_config.TextColumn(
        "measured best", help="the k and policy with the best measured speedup, as the leaderboard has it"),
    "best_speedup": st.column_config.NumberColumn("its speedup", format="%.2f×"),
    "predicted_best_k": st.column_config.NumberColumn(
        "advisor's fixed k", help="the k the advisor predicts fastest, over every k up to the largest recorded"),
    "hit": st.column_config.TextColumn("advisor", help=f"hit: the advisor's k measured within {advisor.WITHIN:.0%} "
                                       "of the fastest fixed k (decode tokens/s); not judged where no run was "
                                       "recorded at its k"),
    "advisor_error": st.column_config.NumberColumn("advisor error", format="percent",
                                                   help="mean |predicted / measured − 1| over the recorded ks"),
    "formula_error": st.column_config.NumberColumn("formula error", format="percent",
                                                   help="the same for the flat formula at the pooled α and c"),
}


def _headline(advice: pd.DataFrame) -> None:
    cols = st.columns(3)
    judged = advice.dropna(subset=["hit"])
    if len(judged):
        cols[0].metric("advisor hits", f"{int(judged['hit'].sum())} of {len(judged)}",
                       help=f"draft × category cells whose predicted best k measured within {advisor.WITHIN:.0%} "
                            "of the measured best")
    cols[1].metric("advisor error", f"{advice['advisor_error'].mean():.1%}", help="mean |predicted / measured − 1|")
    cols[2].metric("flat formula error", f"{advice['formula_error'].mean():.1%}")


def _positions(filters: Filters) -> None:
    """Acceptance per draft position, a line per draft · mode, pooled over the selected categories; past MANY
    series, the MANY with the most rounds are drawn until others are picked."""
    rates = common.load(advisor.positions, filters)
    if rates.empty:
        return
    rates = rates.assign(series=frames.series_label(rates))
    options = sorted(rates["series"].unique())
    if len(options) > MANY:
        picked = st.multiselect("series drawn", options, default=frames.default_series(rates, "position", MANY,
                                                                                         by="reached"),
                                key="position_series", help="draft · mode: those judged at 2 or more positions "
                                "are drawn first, the most rounds first; add any other here")
        rates = rates[rates["series"].isin(picked)]
    if rates.empty:
        st.info("Pick a series to draw.")
        return
    axis = charts.position_title(set(rates["draft"]), set(common.load(queries.tree_drafts)))
    st.altair_chart(charts.position_rates(rates, axis))


def render(filters: Filters) -> None:
    st.subheader("Which k")
    _positions(filters)
    advice, curve = common.load(advisor.k_answer, filters)
    if advice.empty:
        st.info("The advisor needs fixed-k runs and their baselines on one target, device, kernels and threads.")
        return
    _headline(advice)
    table = frames.advice_table(advice, common.load(comparable.best_cells, filters))
    table = table.assign(draft=table["draft"].map(words.draft_name))
    st.dataframe(table, hide_index=True, column_config=ADVICE_COLUMNS, column_order=list(ADVICE_COLUMNS))
    st.altair_chart(charts.k_advisor(frames.k_curve(curve)))
    st.caption("The advisor predicts each k's decode tokens/s from the measured acceptance at each draft position "
               "and the measured verify time at each width on this device, not from the flat formula; "
               "`runner.store.advisor` has the model. \"Measured best\" is the leaderboard's answer: the k and "
               "policy with the best measured speedup, on the prompts every compared cell ran.")
