"""The acceptance-by-context chart: a pure `frame -> alt.Chart` over `spec_bench.context_curve`."""

from __future__ import annotations

import altair as alt
import pandas as pd

from dashboard.charts import colour

METRICS = {"alpha": "α (acceptance rate)", "tau": "τ (tokens per round)"}


def bucket_label(frame: pd.DataFrame) -> pd.Series:
    """A context bucket as the axis names it: `128–255`."""
    return frame["context_from"].astype(int).astype(str) + "–" + (frame["context_to"].astype(int) - 1).astype(str)


def acceptance_by_context(frame: pd.DataFrame, metric: str) -> alt.FacetChart:
    """`metric` (alpha or tau) per context bucket, a line per draft, a panel per category; the point's size is the
    rounds behind it, so a thin bucket shows as one."""
    shown = frame.assign(bucket=bucket_label(frame))
    order = list(dict.fromkeys(shown.sort_values("context_from")["bucket"]))
    scale = alt.Scale(domain=[0, 1]) if metric == "alpha" else alt.Scale(zero=False)
    base = alt.Chart(shown).encode(
        x=alt.X("bucket:O", sort=order, title="tokens in the text when the round starts"),
        y=alt.Y(f"{metric}:Q", title=METRICS[metric], scale=scale),
        color=colour(shown, "draft", title="draft"),
        tooltip=["draft", "category", alt.Tooltip("bucket:O", title="context"), "rounds",
                 alt.Tooltip("alpha:Q", format=".3f", title="α"), alt.Tooltip("tau:Q", format=".2f", title="τ")])
    layered = base.mark_line() + base.mark_circle(opacity=0.9).encode(size=alt.Size("rounds:Q", legend=None))
    return layered.properties(width=240, height=200).facet(facet=alt.Facet("category:N", title=None), columns=3)
