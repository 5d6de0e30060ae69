"""Chart- and table-ready frames built from the small frames `queries` returns; pure pandas.

The theory sits next to the measurements in one long frame with a `source` column, so one Altair
chart can layer a line (theory) and points (measured) and still facet (DESIGN §8).
"""

from __future__ import annotations

import math

import pandas as pd

from runner.stats import best_k, theoretical_speedup

ALPHA_GRID = [i / 50 for i in range(51)]  # α in [0, 1]; fine enough for a smooth curve, few rows
THEORY, MEASURED, BEST_K = "theory", "measured", "formula's best k"


def series_label(frame: pd.DataFrame) -> pd.Series:
    """What one line or colour stands for: draft · mode, with the target when several are shown."""
    label = frame["draft"].astype(str) + " · " + frame["mode"].astype(str)
    if frame["target"].nunique() > 1:
        label = frame["target"].astype(str) + " / " + label
    return label


def theory_vs_measured(runs: pd.DataFrame, k: int) -> pd.DataFrame:
    """For one k: each run as a dot at (α, measured speedup), and per series the formula's curve
    over α in [0, 1] at the series' mean measured c."""
    labelled = runs.assign(series=series_label(runs)) if len(runs) else runs.assign(series=[])
    picked = labelled[(labelled["k"] == k) & labelled["measured_speedup"].notna() & labelled["alpha"].notna()]
    measured = picked.rename(columns={"measured_speedup": "speedup", "theoretical_speedup": "predicted"})
    measured = measured[["series", "alpha", "speedup", "predicted", "c", "run_id", "category", "prompt_id", "tau"]]
    curves = [
        pd.DataFrame({"series": series, "alpha": ALPHA_GRID, "c": c,
                      "speedup": [theoretical_speedup(alpha, k, c) for alpha in ALPHA_GRID]})
        for series, c in picked.groupby("series")["c"].mean().items() if not math.isnan(c)
    ]
    return pd.concat([*(curve.assign(source=THEORY) for curve in curves), measured.assign(source=MEASURED)],
                     ignore_index=True)


def _pooled(group: pd.DataFrame) -> tuple[float, float]:
    """α over every draft judged at any k, and c averaged over runs."""
    judged = group["accepted"].sum() + group["rejected"].sum()
    alpha = group["accepted"].sum() / judged if judged else math.nan
    weighted = group.dropna(subset=["c"])
    c = (weighted["c"] * weighted["runs"]).sum() / weighted["runs"].sum() if len(weighted) else math.nan
    return alpha, c


def speedup_by_k(cells: pd.DataFrame) -> pd.DataFrame:
    """Measured speedup against k per category and series, the formula's curve at the pooled α and c,
    and one row marking the formula's best k."""
    labelled = cells.assign(series=series_label(cells)) if len(cells) else cells.assign(series=[])
    measured = labelled.rename(columns={"measured_speedup": "speedup"})
    parts = [measured[["series", "category", "k", "speedup", "alpha", "tau", "runs"]].assign(source=MEASURED)]
    for (series, category), group in labelled.groupby(["series", "category"]):
        alpha, c = _pooled(group)
        if math.isnan(alpha) or math.isnan(c):
            continue
        best = best_k(alpha, c)
        ks = list(range(1, max(int(group["k"].max()), best) + 1))
        curve = pd.DataFrame({"k": ks, "speedup": [theoretical_speedup(alpha, k, c) for k in ks]})
        parts.append(curve.assign(series=series, category=category, alpha=alpha, c=c, source=THEORY))
        parts.append(curve[curve["k"] == best].assign(series=series, category=category, alpha=alpha, c=c,
                                                      source=BEST_K))
    return pd.concat(parts, ignore_index=True)


def leaderboard(per_category: pd.DataFrame, lossless: pd.DataFrame) -> pd.DataFrame:
    """One row per target × mode × draft: per category α, τ at the best k, the best k and its speedup;
    the lossless rate; ranked by the geometric mean of the best speedups over categories."""
    keys = ["target", "mode", "draft"]
    metrics = {"alpha": "α", "tau_at_best_k": "τ", "best_k": "best k", "best_speedup": "speedup"}
    wide = per_category.pivot(index=keys, columns="category", values=list(metrics))
    categories = sorted(per_category["category"].unique())
    wide = wide[[(metric, category) for category in categories for metric in metrics]]
    wide.columns = [f"{category} {metrics[metric]}" for metric, category in wide.columns]
    # The pivot widened best k to float; it is a count of drafts.
    wide = wide.astype({column: "Int64" for column in wide.columns if column.endswith("best k")})
    overall = per_category.groupby(keys)["best_speedup"].apply(lambda s: math.exp(s.map(math.log).mean()))
    # The ranking and the lossless rate first: they must stay in view however many categories follow.
    table = lossless.set_index(keys).join(overall.rename("speedup (geo-mean)"), how="inner").join(wide)
    table = table[["speedup (geo-mean)", "lossless_rate", "runs", *wide.columns]]
    return table.reset_index().sort_values(["target", "mode", "speedup (geo-mean)"], ascending=[True, True, False],
                                           ignore_index=True)


def head_to_head(cells: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    """Per target × mode × category × k: α, τ and measured speedup of draft a next to draft b."""
    keys = ["target", "mode", "category", "k"]
    metrics = {"alpha": "α", "tau": "τ", "measured_speedup": "speedup"}
    two = cells[cells["draft"].isin([a, b])]
    wide = two.pivot(index=keys, columns="draft", values=list(metrics))
    wide = wide.reindex(columns=[(metric, draft) for metric in metrics for draft in (a, b)])
    wide.columns = [f"{metrics[metric]} · {draft}" for metric, draft in wide.columns]
    return wide.reset_index()
