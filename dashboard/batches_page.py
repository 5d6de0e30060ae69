"""Batches: how the gain changes as sequences share the target. Speedup and throughput against batch size per draft
and category, where speculation stops paying, and the best k at each batch size, measured and advised."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, common, frames, words
from runner.store import advisor, batches, comparable

ADVISED_SETUP = ("target", "mode", "device", "kernels", "threads")  # what the advisor's rows share with a setup
MANY = 6  # series a chart draws before anyone picks more


def _series(frame: pd.DataFrame) -> pd.Series:
    return pd.Series([("plain decoding" if draft == "none" else f"{words.draft_name(draft)} · "
                       f"{comparable.choice(k, policy)}")
                      for draft, k, policy in frame[["draft", "k", "k_policy"]].itertuples(index=False)],
                     index=frame.index)


def _picked(rows: pd.DataFrame, setup: str) -> pd.DataFrame:
    """The series the charts draw: those measured at 2 or more batch sizes, the fastest first; any other on demand.
    Plain decoding is drawn with them (the throughput chart's reference)."""
    drafts = rows[rows["draft"] != "none"]
    options = sorted(drafts["series"].unique())
    default = frames.default_series(drafts, "batch_size", MANY)
    picked = st.multiselect("series drawn", options, default=default, key=f"series {setup}",
                            help="draft · k · policy: those measured at 2 or more batch sizes are drawn first, the "
                                 "fastest; add any other here")
    return rows[rows["series"].isin(picked) | (rows["draft"] == "none")]


def _setup(setup: str, rows: pd.DataFrame, cells: pd.DataFrame, best: pd.DataFrame, advice: pd.DataFrame) -> None:
    st.subheader(setup)
    shown = _picked(rows, setup)
    drawn = cells[cells["series"].isin(shown["series"])]
    if len(drawn):
        st.altair_chart(charts.by_batch_size(drawn, "speedup", "speedup over plain decoding at the same batch size"))
        st.altair_chart(charts.by_batch_size(shown, "tokens_per_s_per_batch", "tokens/s per batch"))
    cross = batches.crossovers(rows)
    if not cross.empty:
        st.markdown("**Where speculation stops paying**")
        cross = cross.assign(draft=cross["draft"].map(words.draft_name))
        st.dataframe(cross[["draft", "k", "k_policy", "category", "pays"]], hide_index=True, column_config={
            "k": st.column_config.NumberColumn("k", help=words.GLOSSARY["k"]),
            "k_policy": st.column_config.TextColumn("policy", help=words.GLOSSARY["k_policy"])})
    st.markdown("**The best k at each batch size** (measured, as the Compare page's leaderboard has it; what a "
                "per-batch-size draft length takes)")
    table = batches.best_k_by_batch(best)
    if not table.empty:
        st.dataframe(table.drop(columns=list(batches.SETUP)).assign(draft=table["draft"].map(words.draft_name)),
                     hide_index=True)
    same = rows[list(ADVISED_SETUP)].drop_duplicates().astype({"threads": float})
    st.markdown("**The advisor's k at each batch size** (predicted from this setup's measured costs; Compare, "
                "\"Which k\", shows its numbers)")
    st.dataframe(batches.advised_k_by_batch(advice.merge(same, on=list(ADVISED_SETUP))), hide_index=True)


def render() -> None:
    if (start := common.filtered("Batches", batches.curve)) is None:
        return
    filters, curve = start
    if curve["batch_size"].max() <= 1:
        st.info("Every selected run was decoded alone. Record batches with `runner sweep --batch 1,4,8 ...`.")
        return
    curve = curve.assign(series=_series(curve), setup=comparable.labelled(curve.drop(columns="batch_size")))
    advice = common.load(advisor.k_advice, filters).astype({"threads": float})
    best = common.load(comparable.best_cells, filters)
    best = best.assign(setup=comparable.labelled(best.drop(columns="batch_size")))
    cells = common.load(comparable.cells, filters)
    cells = cells.assign(series=_series(cells), setup=comparable.labelled(cells.drop(columns="batch_size")))
    for setup, rows in curve.groupby("setup", sort=True):
        _setup(setup, rows, cells[cells["setup"] == setup], best[best["setup"] == setup], advice)
    st.caption("Each run's speedup is against plain decoding of the same prompts, decoded together at the same "
               "batch size; speedups and the best-k table pool by the leaderboard's rule. "
               + frames.rule_caption(cells) + " A batch's throughput is its new tokens over its slowest member's "
               "wall time (every run). Sequences that finish leave the batch (`rounds.batch_seqs`).")


if __name__ == "__main__":  # st.navigation runs each page file as __main__
    with common.one_connection():
        render()
