"""Benchmark: the `make bench` results recorded in the file (ours against transformers, overhead, the
formula against measurement) and the measured verify curve, per bench."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, common, queries
from runner.store.bench_rows import ABOUT, COLUMNS, GOALS, Goal


def _value(row: pd.Series, name: str) -> str:
    """'median (min–max)', as percentages for shares; a ratio as a factor, '1.20× (1.08–1.32×)'."""
    if pd.isna(row[name]):
        return "—"
    pattern = ".2%" if row["unit"] == "share" and name != "ratio" else ".2f"
    times = "×" if name == "ratio" else ""
    low, high = row[f"{name}_min"], row[f"{name}_max"]
    return f"{row[name]:{pattern}}{times} ({low:{pattern}}–{high:{pattern}}{times})"


def _goal(row: pd.Series) -> str:
    if pd.isna(row["goal_met"]):
        return ""
    return f"{'✓' if row['goal_met'] else '✗'} {row['goal']}"


def table(rows: pd.DataFrame) -> pd.DataFrame:
    """The printed table: one line per row, values as median (min–max), the columns named after what the metric
    compares (`COLUMNS`); α and c only where measured; the threads a row ran at where the bench ran several."""
    ours, theirs = COLUMNS.get(rows["metric"].iloc[0], ("ours", "theirs"))
    per_thread = rows["category"].str.startswith("threads=")  # a verify curve's row at one thread count
    shown = pd.DataFrame({
        "draft": rows["draft"], "k": rows["k"], "policy": rows["k_policy"],
        "category": rows["category"].mask(per_thread, "all"), "threads": rows["threads"],
        ours: rows.apply(_value, axis=1, name="ours"), str(theirs): rows.apply(_value, axis=1, name="theirs"),
        f"{ours} / {theirs}": rows.apply(_value, axis=1, name="ratio"), "α": rows["alpha"], "c": rows["c"],
        "goal": rows.apply(_goal, axis=1), "mismatches": rows["mismatches"],
    })
    drop = [c for c in ("α", "c") if shown[c].isna().all()]
    drop += ["policy"] if (shown["policy"] == "fixed").all() else []  # only where ours drafted under another
    drop += ["threads"] if shown["threads"].nunique() < 2 else []
    drop += [str(theirs), f"{ours} / {theirs}"] if theirs is None else []
    return shown.drop(columns=drop)


VERIFY_METRICS = {"verify_ms": "skinny", "verify_ms_stock": "stock"}  # each kernel path's curve


def verify_frame(rows: pd.DataFrame) -> pd.DataFrame:
    """The verify curves: per pass shape (a bench before trees and batches recorded chains alone, as draft 'none'),
    kernel path and thread count, the pass's time over the same path's one-token pass by the rows it carries."""
    curve = rows[rows["metric"].isin(list(VERIFY_METRICS))]
    return pd.DataFrame({"shape": curve["draft"].replace({"none": "chain"}),
                         "kernels": curve["metric"].map(VERIFY_METRICS), "threads": curve["threads"],
                         "rows": curve["k"] + 1, "verify_ms": curve["ours"], "relative": curve["ratio"]})


def _goal_text(goal: Goal) -> str:
    where = [f"{goal.draft}" if goal.draft else "", f"k in {list(goal.ks)}" if goal.ks else "",
             goal.category or ""]
    return f"{goal.metric} {goal.text}" + "".join(f" ({w})" for w in where if w)


def _header(bench: pd.Series) -> None:
    st.caption(f"bench {bench.name} · {bench['started_at']:%Y-%m-%d %H:%M} UTC · {bench['target']} on "
               f"{bench['device']} ({bench['device_name']}, {bench['dtype']}, {bench['threads']} threads, "
               f"our engine on {bench['kernels']} kernels) · "
               f"{bench['prompts']} prompts × {bench['repeats']} repeats × {bench['max_new_tokens']} tokens · "
               f"load average {bench['load_before']:.1f} before, {bench['load_after']:.1f} after · torch "
               f"{bench['torch_version']}, transformers {bench['transformers_version']}")
    st.code(bench["command"], language="bash")
    st.metric("goals met", f"{bench['goals_met']} of {bench['goals']}",
              help="on the medians: " + "; ".join(_goal_text(goal) for goal in GOALS))


def render() -> None:
    st.title("Benchmark")
    if not common.require_data(common.db_path(), need_runs=False):
        return
    benches = common.load(queries.benches)
    if benches.empty:
        st.info("No benchmark is recorded in this file. `make bench` (or `python bench/bench.py --db PATH`) "
                "records one here.")
        return
    bench_id = st.selectbox("bench", benches["bench_id"].tolist(), key="bench", bind="query-params")
    bench = benches.set_index("bench_id").loc[bench_id]  # bench.name is the id
    _header(bench)
    rows = common.load(queries.bench_rows, bench_id)
    st.subheader("Verify pass time against the rows it carries")
    st.altair_chart(charts.bench_verify(verify_frame(rows)))
    st.caption("One target pass at a fixed context over the same path's one-token pass: a chain of k+1 tokens, a "
               "tree of that many rows under its mask, or a batch of sequences of 5 tokens each; stock F.linear "
               "against the skinny kernels, at one thread and at the bench's. The explainer assumes it is flat "
               "(the dashed line), and so does the formula's prediction in (d).")
    for metric, about in ABOUT.items():
        picked = rows[rows["metric"] == metric]
        if not picked.empty:
            title, _, detail = about.partition(":")
            unit = picked["unit"].iloc[0]
            st.markdown(f"**{title}**" + ("" if unit in title else f" [{unit}]"))
            st.caption(detail.strip())
            st.dataframe(table(picked), hide_index=True)


if __name__ == "__main__":  # st.navigation runs each page file as __main__
    render()
