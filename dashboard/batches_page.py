"""Batches: how the gain changes as sequences share the target. Speedup and throughput against batch size per draft
and category, where speculation stops paying, and the best k at each batch size, measured and advised."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, common
from runner.store import advisor, batches, comparable

FILTERS = ("engine", "target", "category", "mode", "device", "kernels", "threads", "sweep_id")
ADVISED_SETUP = ("target", "mode", "device", "kernels", "threads")  # what the advisor's rows share with a setup


def _series(frame: pd.DataFrame) -> pd.Series:
    return pd.Series([("plain decoding" if draft == "none" else f"{draft} · {comparable.choice(k, policy)}")
                      for draft, k, policy in frame[["draft", "k", "k_policy"]].itertuples(index=False)],
                     index=frame.index)


def render() -> None:
    if (start := common.filtered("Batches", FILTERS, batches.curve)) is None:
        return
    filters, curve = start
    if curve["batch_size"].max() <= 1:
        st.info("Every selected run was decoded alone. Record batches with `runner sweep --batch 1,4,8 ...`.")
        return
    curve = curve.assign(series=_series(curve), setup=comparable.labelled(curve.drop(columns="batch_size")))
    advice = common.load(advisor.k_advice, filters).astype({"threads": float})
    for setup, rows in curve.groupby("setup", sort=True):
        st.subheader(setup)
        st.altair_chart(charts.by_batch_size(rows[rows["draft"] != "none"], "speedup",
                                             "speedup over plain decoding at the same batch size"))
        st.altair_chart(charts.by_batch_size(rows, "tokens_per_s_per_batch", "tokens/s per batch"))
        cross = batches.crossovers(rows)
        if not cross.empty:
            st.markdown("**Where speculation stops paying**")
            st.dataframe(cross[["draft", "k", "k_policy", "category", "pays"]], hide_index=True)
        st.markdown("**The best k at each batch size** (measured; what a per-batch-size draft length takes)")
        st.dataframe(batches.best_k_by_batch(rows).drop(columns=list(batches.SETUP)), hide_index=True)
        same = rows[list(ADVISED_SETUP)].drop_duplicates().astype({"threads": float})
        st.markdown("**The advisor's k at each batch size** (predicted from this setup's measured costs; Compare, "
                    "\"Which k\", shows its numbers)")
        st.dataframe(batches.advised_k_by_batch(advice.merge(same, on=list(ADVISED_SETUP))), hide_index=True)
    st.caption("Each run's speedup is against plain decoding of the same prompts, decoded together at the same "
               "batch size; speedups pool by geometric mean. A batch's throughput is its new tokens over its "
               "slowest member's wall time. Sequences that finish leave the batch (`rounds.batch_seqs`).")


if __name__ == "__main__":  # st.navigation runs each page file as __main__
    render()
