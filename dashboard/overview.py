"""Overview: acceptance, τ, nodes per round, thrown drafts and speedup per category × draft × k, against the
theory."""

from __future__ import annotations

import streamlit as st

from dashboard import charts, common, filter_queries, frames, queries, words
from runner.store import advisor, comparable, metrics

G = words.GLOSSARY
# The setup's keys, the cell's, then its numbers: speedup and α each with its spread and count.
CELL_COLUMNS = {
    "target": st.column_config.TextColumn("target"),
    "mode": st.column_config.TextColumn("mode"),
    "device": st.column_config.TextColumn("device"),
    "kernels": st.column_config.TextColumn("kernels", help=G["kernels"]),
    "threads": st.column_config.NumberColumn("threads", help=G["threads"]),
    "batch_size": st.column_config.NumberColumn("batch", help=G["batch_size"]),
    "category": st.column_config.TextColumn("category"),
    "name": st.column_config.TextColumn("draft", help=G["draft"]),
    "k": st.column_config.NumberColumn("k", help=G["k"]),
    "k_policy": st.column_config.TextColumn("policy", help=G["k_policy"]),
    "speedup": st.column_config.NumberColumn("speedup ×", format="%.3f", help=G["speedup"]),
    "low": st.column_config.NumberColumn("95% low", format="%.2f", help="the interval's lower end; none for 1 prompt"),
    "high": st.column_config.NumberColumn("95% high", format="%.2f"),
    "speedup_min": st.column_config.NumberColumn("prompt min ×", format="%.2f", help="the slowest prompt's speedup"),
    "speedup_max": st.column_config.NumberColumn("prompt max ×", format="%.2f", help="the fastest prompt's speedup"),
    "prompts": st.column_config.NumberColumn("prompts", help=G["prompts"]),
    "runs": st.column_config.NumberColumn("runs", help="runs pooled: prompts × repeats"),
    "alpha": st.column_config.NumberColumn("α", format="%.3f", help=G["alpha"]),
    "alpha_min": st.column_config.NumberColumn("α min", format="%.3f"),
    "alpha_max": st.column_config.NumberColumn("α max", format="%.3f"),
    "tau": st.column_config.NumberColumn("τ", format="%.2f", help=G["tau"]),
    "c": st.column_config.NumberColumn("c", format="%.2e", help=G["c"]),
    "nodes_per_round": st.column_config.NumberColumn(
        "nodes/round", format="%.2f", help="drafted tokens (a tree's nodes) per round that drafted: a chain's "
        "drafts per round, a tree's size"),
    "thrown_share": st.column_config.NumberColumn("thrown share", format="percent",
                                                  help="drafts after a rejection, never judged, of all drafts"),
    "predicted_speedup": st.column_config.NumberColumn("formula ×", format="%.2f",
                                                       help="the flat formula at each run's α and c, geometric mean"),
    "lossless": st.column_config.TextColumn("lossless", help=G["lossless"]),
}
HEADLINE_COLUMNS = {
    "setup": st.column_config.TextColumn("setup", help="mode, kernels, threads, device and batch: never pooled"),
    "category": st.column_config.TextColumn("category"),
    "name": st.column_config.TextColumn("best draft at k · policy", help=G["draft"]),
    "speedup": CELL_COLUMNS["speedup"], "low": CELL_COLUMNS["low"], "high": CELL_COLUMNS["high"],
    "tied": st.column_config.CheckboxColumn("tie", help=G["tie"]),
    "runner_up": st.column_config.TextColumn("runner-up (any draft, k, policy)"),
    "runner_up_speedup": st.column_config.NumberColumn("runner-up ×", format="%.3f"),
    "prompts": CELL_COLUMNS["prompts"], "speedup_min": CELL_COLUMNS["speedup_min"],
    "speedup_max": CELL_COLUMNS["speedup_max"], "alpha": CELL_COLUMNS["alpha"], "alpha_min": CELL_COLUMNS["alpha_min"],
    "alpha_max": CELL_COLUMNS["alpha_max"],
}

RUNS_SHOWN = 1000  # a table of every run would ship 100k rows to the browser on a large database
THEORY_DOTS = 5000  # the theory chart draws at most this many runs, the newest at its k
MANY = 6  # series a chart draws before anyone picks more


def _headline(cells, filters: metrics.Filters) -> None:
    """Per setup, the best draft, k and policy of each category, with its spread and its runner-up: the same cells
    as the table below and the Compare page's leaderboard (`comparable.cells`)."""
    st.subheader("Which draft, which k, which policy")
    top = frames.best_per_category(cells)
    st.dataframe(top, hide_index=True, column_config=HEADLINE_COLUMNS, column_order=list(HEADLINE_COLUMNS),
                 key="headline")
    st.caption("Each setup (mode, kernels, threads, device, batch) is judged on its own. " + frames.rule_caption(cells)
               + " " + frames.left_out_note(common.load(comparable.left_out, filters)))


def _theory_chart(ks: list[int], filters: metrics.Filters, drafts: list[str]) -> None:
    st.subheader("Measured speedup against the theory")
    k = st.selectbox("k for this chart", ks, key="chart_k", bind="query-params", help=words.GLOSSARY["k"])
    runs = common.load(queries.runs, filters, THEORY_DOTS, k)
    curves = common.load(metrics.formula_over_alpha, filters, k)
    # The drafts the chart above draws: a panel each, not one per draft recorded.
    frame = frames.theory_vs_measured(runs[runs["draft"].isin(drafts)], curves[curves["draft"].isin(drafts)], k)
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


def _cells_table(cells) -> None:
    st.subheader("Every cell")
    shown = cells.assign(name=cells["draft"].map(words.draft_name),
                         lossless=[words.lossless(counts) for counts in cells.to_dict("records")])
    order = [c for c in CELL_COLUMNS if c != "target" or shown["target"].nunique() > 1]
    st.dataframe(shown, hide_index=True, column_config=CELL_COLUMNS, column_order=order)
    st.caption(frames.rule_caption(cells) + " τ and c: mean over the runs; \"runs\" below has the raw values.")


def _speedup_by_k(cells, filters: metrics.Filters) -> list[str]:
    """The chart, and the drafts of the series it draws."""
    st.subheader("Speedup against k")
    frame = frames.speedup_by_k(cells, common.load(advisor.k_curve, filters))
    options = sorted(frame.loc[frame["source"] == frames.MEASURED, "series"].unique())
    picked = st.multiselect("series drawn", options, default=frames.default_series(frame, "k", MANY),
                            key="series", help="draft · mode (· policy): those measured at 2 or more k are "
                            "drawn first, the fastest; add any other here")
    if not picked:
        st.info("Pick a series to draw.")
        return []
    st.altair_chart(charts.speedup_by_k(frame[frame["series"].isin(picked)]))
    st.caption("Dots: measured, the bar its 95% interval over prompts. Lines, only over the ks measured: the "
               "advisor's prediction (from the measured acceptance per position and verify cost per width) and the "
               "flat formula (1 − α^(k+1)) / ((1 − α)(1 + k·c)), both for fixed k.")
    labelled = cells.assign(series=frames.series_label(cells))
    return sorted(labelled.loc[labelled["series"].isin(picked), "draft"].unique())


def render() -> None:
    if (start := common.filtered("Overview", queries.comparable_cells)) is None:
        return
    filters, cells = start
    st.metric("speculative runs", f"{common.load(filter_queries.run_total, filters):,}", help="baselines not counted")
    _headline(cells, filters)
    _cells_table(cells)
    drafts = _speedup_by_k(cells, filters)
    _theory_chart(sorted(int(k) for k in cells["k"].unique()), filters, drafts)
    st.subheader("Verify pass time against k")
    st.altair_chart(charts.verify_growth(common.load(queries.verify_growth, filters)))
    st.caption("The explainer assumes one target pass costs the same for 1 and for k+1 tokens. Each point is "
               "the mean verify time of passes k rows wider than the newest token (k drafts for a chain, a tree's "
               "nodes, lookahead's window too), over the baselines' one-token pass.")
    _runs_table(filters, common.load(filter_queries.run_total, filters))


if __name__ == "__main__":  # st.navigation runs each page file as __main__
    with common.one_connection():
        render()
