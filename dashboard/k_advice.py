"""The Compare page's "Which k" section: acceptance per draft position, and the k advisor's prediction against
what was measured, with its recommendation per draft × category."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, common, frames, queries
from runner.store import advisor
from runner.store.metrics import Filters

ADVICE_COLUMNS = {
    "category": st.column_config.TextColumn("category"),
    "draft": st.column_config.TextColumn("draft"),
    "mode": st.column_config.TextColumn("mode"),
    "recommended_k": st.column_config.NumberColumn("recommended k"),
    "recommended_policy": st.column_config.TextColumn("policy", help="an adaptive policy where one measured "
                                                      "faster than every fixed k, else fixed"),
    "predicted_best_k": st.column_config.NumberColumn("advisor's k", help="over every k up to the largest recorded"),
    "measured_best_k": st.column_config.NumberColumn("measured best k"),
    "hit": st.column_config.CheckboxColumn("hit", help=f"the advisor's k measured within {advisor.WITHIN:.0%} of "
                                           "the measured best; empty where no run was recorded at its k"),
    "advisor_error": st.column_config.NumberColumn("advisor error", format="percent",
                                                   help="mean |predicted / measured − 1| over the recorded ks"),
    "formula_error": st.column_config.NumberColumn("formula error", format="percent",
                                                   help="the same for the flat formula at the pooled α and c"),
    "adaptive_policy": st.column_config.TextColumn("best adaptive"),
    "adaptive_k": st.column_config.NumberColumn("its k"),
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


def render(filters: Filters) -> None:
    st.subheader("Which k")
    rates = common.load(advisor.positions, filters)
    if len(rates):
        axis = charts.position_title(set(rates["draft"]), set(common.load(queries.tree_drafts)))
        st.altair_chart(charts.position_rates(rates.assign(series=frames.series_label(rates)), axis))
    advice = common.load(advisor.k_advice, filters)
    if advice.empty:
        st.info("The advisor needs fixed-k runs and their baselines on one target, device, kernels and threads.")
        return
    _headline(advice)
    st.dataframe(advice, hide_index=True, column_config=ADVICE_COLUMNS, column_order=list(ADVICE_COLUMNS))
    st.altair_chart(charts.k_advisor(frames.k_curve(common.load(advisor.k_curve, filters))))
    st.caption("The advisor predicts each k's decode tokens/s from the measured acceptance at each draft position "
               "and the measured verify time at each width on this device, not from the flat formula; "
               "`runner.store.advisor` has the model. A policy is recommended over a fixed k only where it was "
               "measured faster than every fixed k.")
