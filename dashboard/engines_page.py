"""Engines: our engine and vLLM side by side on the same prompts (runner/vllm/, docs/engines.md)."""

from __future__ import annotations

import streamlit as st

from dashboard import common, engine_queries


def render() -> None:
    st.title("Engines")
    if not common.require_data(common.db_path()):
        return
    frame = common.load(engine_queries.side_by_side)
    if frame.empty or frame["engine"].nunique() < 2:
        st.info("No prompt has speculative runs from both engines yet: sweep the same prompts with "
                "`--engine vllm` and with our engine (docs/engines.md).")
        return
    st.caption("Only prompts both engines ran on the same prompt ids. vLLM's n-gram drafts copy from the earliest "
               "occurrence: compare it with our ngram:<n>:earliest. Speedups are each engine's own, against its own "
               "plain decoding.")
    st.subheader("α, τ and speedup, vLLM against ours")
    st.dataframe(engine_queries.differences(frame), hide_index=True)
    st.subheader("Acceptance per draft position")
    positions = common.load(engine_queries.positions)
    wide = positions.pivot_table(index=["draft_kind", "k", "position"], columns="engine", values="rate")
    if {"vllm", "specdash"} <= set(wide.columns):
        wide["Δ"] = wide["vllm"] - wide["specdash"]
    st.dataframe(wide.reset_index(), hide_index=True)
    st.subheader("The same steps, by each definition")
    st.caption("τ is tokens per target pass over every round. vLLM's mean acceptance length counts only the verify "
               "steps that drafted: it leaves out the steps where its n-gram found no match, so for prompt lookup it "
               "is higher than τ. vLLM's acceptance rate is accepted over drafted, thrown drafts included; α leaves "
               "the thrown drafts out (they were never judged). 'own' columns are vLLM's figures as it reported "
               "them; the two before them are ours, worked out from the same recorded steps.")
    st.dataframe(frame[["engine", "category", "draft_kind", "k", "drafts", "runs", "tau", "tau_drafting_steps",
                        "own_mean_acceptance_length", "alpha", "accepted_over_drafted", "own_acceptance_rate"]],
                 hide_index=True)


if __name__ == "__main__":  # st.navigation runs each page file as __main__
    render()
