"""Overview: acceptance, τ, nodes per round, thrown drafts and speedup per category × draft × k, against the
theory."""

from __future__ import annotations

import streamlit as st

from dashboard import charts, common, frames, queries
from runner.store import comparable, metrics

FILTERS = ("engine", "target", "draft", "category", "k", "k_policy", "mode", "device", "host", "concurrent_workers",
           "kernels", "threads", "sweep_id")
# In display order: the explainer's numbers first, the counts behind them after.
CELL_COLUMNS = {
    "category": st.column_config.TextColumn("category"),
    "mode": st.column_config.TextColumn("mode"),
    "kernels": st.column_config.TextColumn("kernels"),
    "threads": st.column_config.NumberColumn("threads"),
    "draft": st.column_config.TextColumn("draft"),
    "k": st.column_config.NumberColumn("k"),
    "tree": st.column_config.CheckboxColumn("tree", help="the draft proposed trees: k is the tree's depth"),
    "k_policy": st.column_config.TextColumn("policy", help="how each round's k was chosen from k"),
    "alpha": st.column_config.NumberColumn("α", format="%.3f", help="accepted / (accepted + rejected)"),
    "tau": st.column_config.NumberColumn("τ", format="%.2f", help="tokens emitted per round, mean over runs"),
    "nodes_per_round": st.column_config.NumberColumn(
        "nodes/round", format="%.2f", help="drafted tokens (a tree's nodes) per round that drafted, over all its "
        "rounds: a chain's drafts per round, a tree's size"),
    "thrown": st.column_config.NumberColumn("thrown", help="drafts after a rejection, never judged"),
    "thrown_share": st.column_config.NumberColumn("thrown share", format="percent", help="thrown / all drafts"),
    "measured_speedup": st.column_config.NumberColumn("measured ×", format="%.2f", help="geometric mean over runs"),
    "predicted_speedup": st.column_config.NumberColumn("formula ×", format="%.2f", help="at each run's α and c"),
    "c": st.column_config.NumberColumn("c", format="%.3f", help="one draft token's time / one target pass"),
    "runs": st.column_config.NumberColumn("runs"),
    "accepted": st.column_config.NumberColumn("accepted"),
    "rejected": st.column_config.NumberColumn("rejected"),
    "drafted": st.column_config.NumberColumn("drafted"),
    "lossless_failures": st.column_config.NumberColumn("lossless ✗", help="greedy runs whose output differs"),
    "real_divergences": st.column_config.NumberColumn(
        "real ✗", help="lossless failures where the target's choice was clear: a bug, not rounding"),
    "numeric_ties": st.column_config.NumberColumn(
        "ties", help="lossless failures at a numeric tie: the contested logits within rounding of each other"),
    "target": st.column_config.TextColumn("target"),
}


RUNS_SHOWN = 1000  # a table of every run would ship 100k rows to the browser on a large database
THEORY_DOTS = 5000  # the theory chart draws at most this many runs, the newest at its k


def _headline(filters: metrics.Filters, runs: int) -> None:
    """Per setup, the best draft of each category with its k, policy and speedup (`comparable.best_cells`, as the
    Compare page's leaderboard): not one pool of every draft, mode, policy and kernel path."""
    st.metric("speculative runs", f"{runs:,}", help="baselines not counted")
    st.subheader("Best draft per category")
    top = frames.best_per_category(common.load(comparable.best_cells, filters))
    if top.empty:
        st.info("No category has a prompt that every selected draft, k and policy ran with a baseline.")
    for setup, rows in top.groupby("setup", sort=False):
        st.markdown(f"**{setup}**")
        lines = [f"- **{row.category}**: {frames.short_draft(row.draft)} at {row.choice}, **{row.speedup:.2f}×** "
                 f"(α {row.alpha:.3f}, {row.prompts} prompt{'s' * (row.prompts > 1)})" for row in rows.itertuples()]
        st.markdown("\n".join(lines))
    st.caption("Each setup (mode, kernels, threads, device) is judged on its own; within a category every draft × "
               "k × policy is measured on the same prompts (geometric mean of its runs' speedups). The Compare "
               "page's leaderboard has every draft. " + frames.left_out_note(common.load(comparable.left_out, filters)))


def _theory_chart(ks: list[int], filters: metrics.Filters) -> None:
    st.subheader("Measured speedup against the theory")
    k = st.selectbox("k for this chart", ks, key="chart_k", bind="query-params")
    runs = common.load(queries.runs, filters, THEORY_DOTS, k)
    frame = frames.theory_vs_measured(runs, common.load(metrics.formula_over_alpha, filters, k), k)
    if frame.empty:
        st.info("No run at this k has a baseline to measure its speedup against.")
        return
    st.altair_chart(charts.speedup_vs_theory(frame, k))
    newest = f" The newest {THEORY_DOTS:,} runs at this k are drawn." if len(runs) == THEORY_DOTS else ""
    st.caption("Each dot is one run at (α, measured speedup); the line is the formula "
               "(1 − α^(k+1)) / ((1 − α)(1 + k·c)) at the mean c of the draft's runs at this k." + newest)


def _runs_table(filters: metrics.Filters, total: int) -> None:
    shown = f"the newest {RUNS_SHOWN:,} shown; " if total > RUNS_SHOWN else ""
    with st.expander(f"runs ({total:,}): {shown}open one in the replay"):
        runs = common.load(queries.runs, filters, RUNS_SHOWN)
        table = runs.assign(replay="replay?run=" + runs["run_id"])
        st.dataframe(table, hide_index=True, column_order=["replay", *runs.columns], column_config={
            "replay": st.column_config.LinkColumn("replay", display_text="open ↗"),
            **{name: CELL_COLUMNS[name] for name in ("alpha", "tau", "thrown_share", "c")},
            "measured_speedup": st.column_config.NumberColumn("measured ×", format="%.2f"),
            "theoretical_speedup": st.column_config.NumberColumn("formula ×", format="%.2f"),
        })


def render() -> None:
    if (start := common.filtered("Overview", FILTERS, queries.cells)) is None:
        return
    filters, cells = start
    _headline(filters, int(cells["runs"].sum()))
    st.subheader("Acceptance per category × draft × k")
    st.dataframe(cells, hide_index=True, column_config=CELL_COLUMNS, column_order=list(CELL_COLUMNS))
    _theory_chart(sorted(int(k) for k in cells["k"].unique()), filters)
    st.subheader("Speedup against k")
    st.altair_chart(charts.speedup_by_k(frames.speedup_by_k(cells, common.load(metrics.formula_over_k, filters))))
    st.subheader("Verify pass time against k")
    st.altair_chart(charts.verify_growth(common.load(queries.verify_growth, filters)))
    st.caption("The explainer assumes one target pass costs the same for 1 and for k+1 tokens. Each point is "
               "the mean verify time of passes k rows wider than the newest token (k drafts for a chain, a tree's "
               "nodes, lookahead's window too), over the baselines' one-token pass.")
    _runs_table(filters, int(cells["runs"].sum()))


if __name__ == "__main__":  # st.navigation runs each page file as __main__
    with common.one_connection():
        render()
