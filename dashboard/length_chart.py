"""SPEED-Bench's "does this draft degrade on long prompts?" chart: a pure `frame -> alt.Chart` over
`speed_bench.by_length`."""

from __future__ import annotations

import altair as alt
import pandas as pd

from dashboard.charts import colour
from runner.store.speed_bench import split_tokens

PANELS = {"tau": "τ (mean acceptance length)", "speedup": "speedup over plain decoding"}


def long_form(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per engine · method × split × panel, the split's nominal length beside it for the axis order."""
    shown = frame.assign(series=frame["engine"] + " · " + frame["method"], tokens=frame["split"].map(split_tokens))
    return shown.melt(id_vars=["series", "bucket", "tokens", "prompt_tokens", "drafts", "alpha"],
                      value_vars=list(PANELS), var_name="panel", value_name="value").assign(
        panel=lambda f: f["panel"].map(PANELS))


def by_input_length(frame: pd.DataFrame) -> alt.FacetChart:
    """τ and speedup per throughput split, a line per engine · method: a line that falls to the right is a draft
    that degrades on long prompts."""
    shown = long_form(frame)
    order = list(dict.fromkeys(shown.sort_values("tokens")["bucket"]))
    base = alt.Chart().encode(
        x=alt.X("bucket:O", sort=order, title="input length (throughput split)"),
        y=alt.Y("value:Q", title=None, scale=alt.Scale(zero=False)),
        color=colour(shown, "series", title="engine · draft"),
        tooltip=["series", alt.Tooltip("bucket:O", title="split"),
                 alt.Tooltip("prompt_tokens:Q", format=".0f", title="mean prompt tokens"), "drafts",
                 alt.Tooltip("value:Q", format=".2f"), alt.Tooltip("alpha:Q", format=".3f", title="α")])
    layered = alt.layer(base.mark_line(), base.mark_circle(size=60), data=shown)
    return layered.properties(width=300, height=220).facet(
        column=alt.Column("panel:N", title=None, sort=list(PANELS.values()))).resolve_scale(y="independent")
