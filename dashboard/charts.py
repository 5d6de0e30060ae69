"""Pure `frame -> alt.Chart` functions over the long frames of `frames`.

Every layered chart reads ONE frame and picks its rows with `transform_filter` on `source`: layering
two frames and then faceting fails in Altair (docs/design.md, "Charts").
"""

from __future__ import annotations

import colorsys

import altair as alt
import pandas as pd

from dashboard.frames import MEASURED, PREDICTED, THEORY

FACET_COLUMNS = 3
PANEL = {"width": 240, "height": 200}  # three panels and their axes fit the wide layout's main column
_ALPHA = alt.X("alpha:Q", title="α (acceptance rate)", scale=alt.Scale(domain=[0, 1]))
_SPEEDUP = alt.Y("speedup:Q", title="speedup over plain decoding")
# Streamlit's theme colours categories in shades of one blue, and a scheme of ten repeats its colours from the
# eleventh series on: `_colour` gives each value its own colour.
TABLEAU10 = ("#4c78a8", "#f58518", "#e45756", "#72b7b2", "#54a24b", "#eeca3b", "#b279a2", "#ff9da6", "#9d755d",
             "#bab0ac")
FEW_ROUNDS = 10  # a per-position rate from fewer rounds is drawn faint
LABEL_LIMIT = 420  # px: a legend label is cut past this (Vega's default, 160, cut head paths to one prefix)
MANY_SERIES = 8  # more series than this in one panel are not told apart by colour: a panel per series instead
_K = alt.X("k:Q", title="k (drafts per round)", axis=alt.Axis(tickMinStep=1, format="d"))


def palette(n: int) -> list[str]:
    """n colours, no two alike: tableau10's for up to ten, else n hues evenly spaced around the colour wheel."""
    if n <= len(TABLEAU10):
        return list(TABLEAU10[:n])
    return ["#{:02x}{:02x}{:02x}".format(*(round(255 * v) for v in colorsys.hls_to_rgb(i / n, 0.45, 0.7)))
            for i in range(n)]


def colour(frame: pd.DataFrame, field: str, kind: str = "N", title: str | None = None) -> alt.Color:
    """Colour by `field`, each value of the frame's its own colour, legend labels uncut."""
    values = sorted(frame[field].dropna().unique().tolist()) if field in frame else []
    return alt.Color(f"{field}:{kind}", title=title, legend=alt.Legend(labelLimit=LABEL_LIMIT),
                     scale=alt.Scale(domain=values, range=palette(len(values))))


def panels(frame: pd.DataFrame, series_title: str) -> tuple[str, alt.Color]:
    """The facet field and the colour of a chart of series per category: a panel per category, a colour per series;
    or, past MANY_SERIES series, a panel per series and a colour per category."""
    if frame["series"].nunique() > MANY_SERIES:
        return "series", colour(frame, "category", title="category")
    return "category", colour(frame, "series", title=series_title)


def _is(source: str) -> alt.Predicate:
    return alt.FieldEqualPredicate(field="source", equal=source)


def _rule_at_one(base: alt.Chart, groupby: list[str]) -> alt.Chart:
    """A dashed rule at y = 1, drawn once per facet (one aggregated row, not one per data row)."""
    return (base.transform_aggregate(rows="count()", groupby=groupby)
            .mark_rule(color="#999", strokeDash=[4, 4]).encode(y=alt.datum(1)))


def speedup_vs_theory(frame: pd.DataFrame, k: int) -> alt.FacetChart:
    """The formula's curve (1 − α^(k+1)) / ((1 − α)(1 + k·c)) per series, each run a dot on it."""
    base = alt.Chart(frame)
    curve = base.transform_filter(_is(THEORY)).mark_line(color="#555").encode(
        _ALPHA, _SPEEDUP, tooltip=[alt.Tooltip("alpha:Q", format=".2f", title="α"),
                                   alt.Tooltip("speedup:Q", format=".2f", title="formula"),
                                   alt.Tooltip("c:Q", format=".3f")])
    runs = base.transform_filter(_is(MEASURED)).mark_circle(size=90, opacity=0.85).encode(
        _ALPHA, _SPEEDUP, color=colour(frame, "category", title="category"),
        tooltip=["run_id:N", "category:N", "prompt_id:N",
                 alt.Tooltip("alpha:Q", format=".3f", title="α"),
                 alt.Tooltip("speedup:Q", format=".2f", title="measured speedup"),
                 alt.Tooltip("predicted:Q", format=".2f", title="formula at this run's α, c"),
                 alt.Tooltip("tau:Q", format=".2f", title="τ"), alt.Tooltip("c:Q", format=".3f")])
    layered = alt.layer(curve, _rule_at_one(base, ["series"]), runs).properties(**PANEL)
    return layered.facet(facet=alt.Facet("series:N", title=None), columns=FACET_COLUMNS).properties(
        title=f"measured speedup against the formula's curve, k = {k} (line: theory at the measured c)")


def speedup_by_k(frame: pd.DataFrame) -> alt.FacetChart:
    """Per category, a colour per series: the measured speedup against k (dots, the bar its 95% interval over
    prompts), the advisor's prediction (solid) and the flat formula (dotted), both only over the ks measured."""
    base = alt.Chart(frame)
    series = colour(frame, "series", title="draft · mode (· policy)")
    series = series.legend(orient="bottom", columns=1, labelLimit=LABEL_LIMIT)
    lines = base.transform_filter(alt.FieldOneOfPredicate(field="source", oneOf=[PREDICTED, THEORY])).mark_line(
    ).encode(_K, _SPEEDUP, series, strokeDash=alt.StrokeDash(
        "source:N", title=None, sort=[PREDICTED, THEORY], scale=alt.Scale(domain=[PREDICTED, THEORY],
                                                                           range=[[1, 0], [2, 3]])),
        tooltip=["series:N", "source:N", "k:Q", alt.Tooltip("speedup:Q", format=".2f")])
    measured = base.transform_filter(_is(MEASURED))
    bars = measured.mark_rule(opacity=0.6).encode(_K, alt.Y("low:Q"), alt.Y2("high:Q"), series)
    points = measured.mark_circle(size=70, opacity=1).encode(
        _K, _SPEEDUP, series, tooltip=["series:N", "category:N", "k:Q", "prompts:Q",
                                       alt.Tooltip("speedup:Q", format=".3f", title="measured speedup"),
                                       alt.Tooltip("low:Q", format=".2f", title="95% low"),
                                       alt.Tooltip("high:Q", format=".2f", title="95% high"),
                                       alt.Tooltip("speedup_min:Q", format=".2f", title="slowest prompt"),
                                       alt.Tooltip("speedup_max:Q", format=".2f", title="fastest prompt"),
                                       alt.Tooltip("alpha:Q", format=".3f", title="α")])
    layered = alt.layer(lines, _rule_at_one(base, ["category"]), bars, points).properties(**PANEL)
    return layered.facet(facet=alt.Facet("category:N", title=None), columns=FACET_COLUMNS).properties(
        title="speedup against k per category (dots measured, bars 95% intervals; lines over the measured ks)")


def head_to_head(frame: pd.DataFrame) -> alt.FacetChart:
    """Two drafts overlaid per category: measured speedup against k, A and B in two colours, a policy's cells
    its own line (`frames.head_to_head_chart`), each dot's bar its 95% interval."""
    base = alt.Chart(frame)
    series = colour(frame, "series", title=None).legend(orient="bottom", columns=1, labelLimit=LABEL_LIMIT)
    tooltip = ["series:N", "category:N", "k:Q", "prompts:Q", alt.Tooltip("speedup:Q", format=".3f"),
               alt.Tooltip("low:Q", format=".2f", title="95% low"), alt.Tooltip("high:Q", format=".2f",
                                                                                  title="95% high")]
    line = base.mark_line(point=True).encode(_K, _SPEEDUP, series, tooltip=tooltip)
    bars = base.mark_rule(opacity=0.5).encode(_K, alt.Y("low:Q"), alt.Y2("high:Q"), series)
    return alt.layer(line, bars, _rule_at_one(base, ["category"])).properties(**PANEL).facet(
        facet=alt.Facet("category:N", title=None), columns=FACET_COLUMNS)


def _setup(row: dict) -> str:
    """'target on device · kernels · N threads'; kernels and threads are NULL for runs recorded before them."""
    parts = [f"{row['target']} on {row['device']}"]
    if not pd.isna(row.get("kernels")):
        parts.append(str(row["kernels"]))
    if not pd.isna(row.get("threads")):
        parts.append(f"{int(row['threads'])} threads")
    return " · ".join(parts)


def verify_growth(frame: pd.DataFrame) -> alt.LayerChart:
    """Mean verify-pass time by drafts per pass, relative to a one-token pass; the explainer assumes 1. One line
    per target, device, kernels and threads."""
    base = alt.Chart(frame.assign(setup=[_setup(row) for row in frame.to_dict("records")]))
    y = alt.Y("relative:Q", title="verify pass time / one-token pass", scale=alt.Scale(zero=True))
    measured = base.mark_line(point=True).encode(
        _K.title("rows in the pass beyond the newest token (a chain's k)"), y,
        color=colour(base.data, "setup"),
        tooltip=["setup:N", "k:Q", "rounds:Q", alt.Tooltip("relative:Q", format=".2f", title="× one-token pass"),
                 alt.Tooltip("verify_s:Q", format=".4f", title="mean verify s")])
    return alt.layer(measured, _rule_at_one(base, [])).properties(
        width=420, height=240, title="verify pass time against k (dashed: the explainer's flat assumption)")


def bench_verify(frame: pd.DataFrame) -> alt.FacetChart:
    """The bench's verify curves: one panel per pass shape, a line per kernel path (colour) and thread count
    (dash), time over the one-token pass against the rows of the pass."""
    frame = frame.assign(threads=frame["threads"].map(lambda n: f"{n} thread{'s' if n != 1 else ''}"))
    line = alt.Chart().mark_line(point=True).encode(
        alt.X("rows:Q", title="rows in the pass", scale=alt.Scale(type="log", base=2), axis=alt.Axis(format="d")),
        alt.Y("relative:Q", title="pass time / one-token pass", scale=alt.Scale(zero=True)),
        color=colour(frame, "kernels", title="kernels"),
        strokeDash=alt.StrokeDash("threads:N", title=None),
        tooltip=["shape:N", "kernels:N", "threads:N", "rows:Q", alt.Tooltip("verify_ms:Q", format=".1f", title="ms"),
                 alt.Tooltip("relative:Q", format=".2f", title="× one-token pass")])
    flat = alt.Chart().mark_rule(strokeDash=[4, 4], color="grey").encode(y=alt.datum(1))
    return alt.layer(line, flat, data=frame).properties(width=260, height=220).facet(
        column=alt.Column("shape:N", title=None, sort=["chain", "tree", "batch"]))


_EPOCH = alt.X("epoch:Q", title="epoch (0: untrained)", axis=alt.Axis(tickMinStep=1, format="d"))
_ACCEPTANCE = alt.Y("acceptance:Q", title="acceptance", scale=alt.Scale(domain=[0, 1]))


def training_loss(frame: pd.DataFrame) -> alt.Chart:
    """Loss per epoch, one line per `source` ('training', 'held-out')."""
    return alt.Chart(frame).mark_line(point=True).encode(
        _EPOCH, alt.Y("loss:Q", title="loss", scale=alt.Scale(zero=False)),
        color=colour(frame, "source"),
        tooltip=["source:N", "epoch:Q", alt.Tooltip("loss:Q", format=".3f")],
    ).properties(width=300, height=320, title=alt.TitleParams(
        "loss per epoch", subtitle="cross-entropy, draft step j weighted 0.8^j"))


def training_acceptance(frame: pd.DataFrame) -> alt.Chart:
    """Held-out acceptance per epoch, one line per draft position."""
    return alt.Chart(frame).mark_line(point=True).encode(
        _EPOCH, _ACCEPTANCE, color=colour(frame, "position", "O", "draft position"),
        tooltip=["epoch:Q", "position:Q", "judged:Q", "accepted:Q", alt.Tooltip("acceptance:Q", format=".3f")],
    ).properties(width=300, height=320, title=alt.TitleParams(
        "held-out acceptance per epoch", subtitle="at each draft position, given the earlier drafts were right"))


def training_categories(frame: pd.DataFrame) -> alt.FacetChart:
    """Held-out acceptance per epoch, one line per category, one panel per draft position."""
    return alt.Chart(frame).mark_line(point=True).encode(
        _EPOCH, _ACCEPTANCE, color=colour(frame, "category", title="held-out category"),
        tooltip=["category:N", "epoch:Q", "position:Q", "judged:Q", "accepted:Q",
                 alt.Tooltip("acceptance:Q", format=".3f")],
    ).properties(width=240, height=200).facet(
        column=alt.Column("position:O", title="draft position (given the earlier drafts were right)"))


def position_acceptance(frame: pd.DataFrame, position: str = "draft position") -> alt.Chart:
    """Acceptance by draft position per `series` (a category's runs, or the training's held-out score, dashed);
    `position` titles the axis (`position_title`)."""
    return alt.Chart(frame).mark_line(point=True).encode(
        alt.X("position:Q", title=position, axis=alt.Axis(tickMinStep=1, format="d")), _ACCEPTANCE,
        color=colour(frame, "series"),
        strokeDash=alt.StrokeDash("source:N", title=None),
        tooltip=["series:N", "position:Q", "judged:Q", "accepted:Q", alt.Tooltip("acceptance:Q", format=".3f")],
    ).properties(width=420, height=240, title="acceptance by draft position: recorded runs and held-out prompts")


def position_rates(frame: pd.DataFrame, position_axis: str = "draft position") -> alt.LayerChart:
    """A line per series: the acceptance rate of each draft position (a tree's: each level) among the rounds that
    reached it, pooled over the categories shown; `position_axis` titles the axis (`position_title`)."""
    position = alt.X("position:Q", title=position_axis, axis=alt.Axis(tickMinStep=1, format="d"))
    rate = alt.Y("rate:Q", title="accepted / reached", scale=alt.Scale(domain=[0, 1]))
    series = colour(frame, "series", title="draft · mode")
    tooltip = ["series:N", "position:Q", alt.Tooltip("reached:Q", title="rounds that reached it"), "accepted:Q",
               alt.Tooltip("rate:Q", format=".3f", title="rate")]
    base = alt.Chart(frame).encode(position, rate, series, tooltip=tooltip)
    # A rate from a handful of rounds is noise: its point is small and faint, so it does not read as a finding.
    points = base.mark_circle().encode(
        size=alt.Size("reached:Q", title="rounds that reached it", scale=alt.Scale(type="sqrt", range=[20, 220])),
        opacity=alt.condition(f"datum.reached >= {FEW_ROUNDS}", alt.value(1.0), alt.value(0.25)))
    return alt.layer(base.mark_line(), points).properties(width=520, height=300, title=alt.TitleParams(
        "acceptance per draft position, of the rounds that reached it",
        subtitle=["pooled over the categories selected: accepted / reached, each summed over them",
                  f"reached: the drafts before it were accepted (a tree: the path reached that level); point size "
                  f"is the rounds behind a rate, faint when fewer than {FEW_ROUNDS}"]))


def k_advisor(frame: pd.DataFrame) -> alt.FacetChart:
    """Per category (per series when there are many, `panels`): decode tokens/s against k, the advisor's
    prediction (solid), the flat formula's (dotted) and the measured fixed-k runs (dots)."""
    base = alt.Chart(frame)
    y = alt.Y("tokens_per_s:Q", title="decode tokens/s")
    panel, series = panels(frame, "draft · mode")
    tooltip = ["series:N", "category:N", "k:Q", "source:N", alt.Tooltip("tokens_per_s:Q", format=".1f")]
    lines = base.transform_filter(alt.FieldOneOfPredicate(field="source", oneOf=[PREDICTED, THEORY])).mark_line(
    ).encode(_K, y, series, strokeDash=alt.StrokeDash("source:N", title=None, sort=[PREDICTED, THEORY]),
             tooltip=tooltip)
    points = base.transform_filter(_is(MEASURED)).mark_circle(size=70).encode(_K, y, series, tooltip=tooltip)
    return alt.layer(lines, points).properties(**PANEL).facet(
        facet=alt.Facet(f"{panel}:N", title=None), columns=FACET_COLUMNS).properties(
        title="tokens/s against k: the advisor (measured acceptance per position and verify curve) and measured")


# A tree round's fates in the replay's colours, darker so a small node stands out on white.
_TREE_FATES = alt.Scale(domain=["root", "accepted", "rejected", "thrown"],
                        range=["#7e57c2", "#2e7d32", "#c62828", "#bdbdbd"])


def tree_round(frame: pd.DataFrame) -> alt.LayerChart:
    """One tree round (`tree_layout.layout`): root at the left, a column per depth; edges and nodes coloured by fate,
    the accepted path drawn thick, thrown nodes grey; a ring on the node where the path stopped."""
    base = alt.Chart(frame)
    # The edges' layer spells out the same scales: layers whose x or y scales differ fail to draw in Streamlit.
    depth_scale, lane_scale = alt.Scale(padding=30), alt.Scale(reverse=True, padding=20)
    depth_axis = alt.Axis(tickMinStep=1, format="d")
    x = alt.X("depth:Q", title="depth (level of the tree)", axis=depth_axis, scale=depth_scale)
    y = alt.Y("lane:Q", axis=None, scale=lane_scale)
    fate = alt.Color("fate:N", title="node", scale=_TREE_FATES)
    tooltip = ["node:Q", "depth:Q", alt.Tooltip("text:N", title="token"), "fate:N",
               alt.Tooltip("wanted_text:N", title="target's token here"),
               alt.Tooltip("target_text:N", title="target's token after it"), alt.Tooltip("token:Q", title="id")]
    edges = base.transform_filter("datum.fate != 'root'").mark_rule().encode(
        alt.X("parent_depth:Q", title="depth (level of the tree)", axis=depth_axis, scale=depth_scale),
        alt.Y("parent_lane:Q", axis=None, scale=lane_scale), x2="depth:Q", y2="lane:Q", color=fate,
        strokeWidth=alt.condition("datum.fate == 'accepted'", alt.value(4), alt.value(1.5)))
    nodes = base.mark_circle(size=260, opacity=1).encode(x, y, color=fate, tooltip=tooltip)
    stop = base.transform_filter("datum.stop").mark_point(size=700, shape="circle", filled=False, color="black",
                                                          strokeWidth=2).encode(x, y, tooltip=tooltip)
    labels = base.mark_text(align="left", dx=12, fontSize=12).encode(
        x, y, text="text:N", color=alt.condition("datum.fate == 'thrown'", alt.value("#9e9e9e"), alt.value("black")),
        tooltip=tooltip)
    # Streamlit fits the axis, title and legend inside the height: 150 px for them, then 40 per lane.
    height = 150 + 40 * (int(frame["lane"].max()) + 1)
    return alt.layer(edges, nodes, stop, labels).properties(
        width=560, height=height, title="the round's tree: the accepted path thick, ○ where it stopped")


def position_title(drafts: set[str], trees: set[str]) -> str:
    """The position axis: a tree's positions are its levels, so the axis says which the drafts shown are."""
    if drafts and drafts <= trees:
        return "depth (level of the tree)"
    return "draft position / tree depth" if drafts & trees else "draft position"


def by_batch_size(frame: pd.DataFrame, y: str, title: str) -> alt.FacetChart:
    """Per category, a line per series (draft · k · policy, and plain decoding): `y` against batch size."""
    base = alt.Chart(frame)
    x = alt.X("batch_size:Q", title="batch size (sequences decoded together)",
              scale=alt.Scale(type="log", base=2), axis=alt.Axis(format="d"))
    tips = [alt.Tooltip(f"{name}:{kind}", format=fmt) if fmt else f"{name}:{kind}" for name, kind, fmt in (
        ("series", "N", ""), ("category", "N", ""), ("batch_size", "Q", ""), ("runs", "Q", ""),
        ("prompts", "Q", ""), ("batches", "Q", ""), ("speedup", "Q", ".3f"), ("low", "Q", ".2f"),
        ("high", "Q", ".2f"), ("tokens_per_s_per_seq", "Q", ".1f"), ("tokens_per_s_per_batch", "Q", ".1f"))
        if name in frame]
    series = colour(frame, "series", title="draft · k · policy").legend(orient="bottom", columns=1,
                                                                       labelLimit=LABEL_LIMIT)
    lines = base.mark_line(point=True).encode(x, alt.Y(f"{y}:Q", title=title), series, tooltip=tips)
    layers = [lines, _rule_at_one(base, ["category"])] if y == "speedup" else [lines]
    if "low" in frame:  # a cell's 95% interval over prompts
        layers.append(base.mark_rule(opacity=0.5).encode(x, alt.Y("low:Q"), alt.Y2("high:Q"), series))
    return alt.layer(*layers).properties(**PANEL).facet(facet=alt.Facet("category:N", title=None),
                                                        columns=FACET_COLUMNS)
