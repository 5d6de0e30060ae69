"""Chart- and table-ready frames built from the small frames `queries` returns; pure pandas.

The theory sits next to the measurements in one long frame with a `source` column, so one Altair
chart can layer a line (theory) and points (measured) and still facet (docs/design.md, "Charts").
The formula's values come from SQL (`runner.store.metrics`), where it is defined once.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from runner.store import comparable

THEORY, MEASURED, BEST_K = "theory", "measured", "formula's best k"
PREDICTED = "advisor"


def series_label(frame: pd.DataFrame) -> pd.Series:
    """What one line or colour stands for: draft · mode (· its draft-length policy unless fixed), with the target
    when several are shown."""
    label = frame["draft"].astype(str).map(short_draft) + " · " + frame["mode"].astype(str)
    if "k_policy" in frame:
        adaptive = frame["k_policy"].notna() & (frame["k_policy"] != "fixed")
        label = label.where(~adaptive, label + " · " + frame["k_policy"].astype(str))
    for column, unit in (("kernels", ""), ("threads", " threads")):
        # Only where the shown rows differ in it: a label says what tells two lines apart, nothing more.
        if column in frame and frame[column].nunique(dropna=False) > 1:
            label = label + " · " + frame[column].map(lambda v, unit=unit: "?" if pd.isna(v) else
                                                       f"{int(v) if unit else v}{unit}")
    if "batch_size" in frame and frame["batch_size"].nunique() > 1:
        label = label + " · batch " + frame["batch_size"].map(lambda v: "?" if pd.isna(v) else str(int(v)))
    if frame["target"].nunique() > 1:
        label = frame["target"].astype(str) + " / " + label
    return label


def short_draft(draft: str) -> str:
    """A draft's name without its head's folder ('eagle:heads/smollm2-135m' -> 'eagle:smollm2-135m'), for legends
    and headlines; tables keep the full spec."""
    kind, _, spec = draft.partition(":")
    return f"{kind}:{spec.rsplit('/', 1)[-1]}" if "/" in spec else draft


def theory_vs_measured(runs: pd.DataFrame, curves: pd.DataFrame, k: int) -> pd.DataFrame:
    """For one k: each run as a dot at (α, measured speedup), and per series the formula's curve over α
    (`metrics.formula_over_alpha` at the same k and filters)."""
    labelled = runs.assign(series=series_label(runs)) if len(runs) else runs.assign(series=[])
    picked = labelled[(labelled["k"] == k) & labelled["measured_speedup"].notna() & labelled["alpha"].notna()]
    measured = picked.rename(columns={"measured_speedup": "speedup", "theoretical_speedup": "predicted"})
    measured = measured[["series", "alpha", "speedup", "predicted", "c", "run_id", "category", "prompt_id", "tau"]]
    theory = curves.assign(series=series_label(curves))[["series", "alpha", "c", "speedup"]] if len(curves) else None
    return pd.concat([*([theory.assign(source=THEORY)] if theory is not None else []),
                      measured.assign(source=MEASURED)], ignore_index=True)


def speedup_by_k(cells: pd.DataFrame, curves: pd.DataFrame) -> pd.DataFrame:
    """Measured speedup against k per category and series, the formula's curve (`metrics.formula_over_k`: at the
    α pooled over every k and the mean c) up to the largest recorded k or the formula's best k, and one row
    marking that best k."""
    labelled = cells.assign(series=series_label(cells)) if len(cells) else cells.assign(series=[])
    measured = labelled.rename(columns={"measured_speedup": "speedup"})
    parts = [measured[["series", "category", "k", "speedup", "alpha", "tau", "runs"]].assign(source=MEASURED)]
    if len(curves) and len(cells):
        curves = curves.assign(series=series_label(curves))
        recorded = labelled.groupby(["series", "category"])["k"].max().rename("recorded_k")
        curves = curves.join(recorded, on=["series", "category"], how="inner")
        best_k = curves[curves["best"]].set_index(["series", "category"])["k"].rename("best_k")
        curves = curves.join(best_k, on=["series", "category"])
        shown = curves[curves["k"] <= curves[["recorded_k", "best_k"]].max(axis=1)]
        columns = ["series", "category", "k", "speedup", "alpha", "c"]
        parts += [shown[columns].assign(source=THEORY), shown[shown["best"]][columns].assign(source=BEST_K)]
    return pd.concat(parts, ignore_index=True)


def leaderboard(per_category: pd.DataFrame, lossless: pd.DataFrame) -> pd.DataFrame:
    """One row per target × mode × draft: per category α and nodes per round over every k, τ at the best k, the
    best k and its speedup; the lossless rate; ranked by the geometric mean of the best speedups over categories."""
    keys = ["target", "mode", "draft"]
    metrics = {"alpha": "α", "nodes_per_round": "nodes/round", "tau_at_best_k": "τ", "best_k": "best k",
               "best_speedup": "speedup"}
    wide = per_category.pivot(index=keys, columns="category", values=list(metrics))
    categories = sorted(per_category["category"].unique())
    wide = wide[[(metric, category) for category in categories for metric in metrics]]
    wide.columns = [f"{category} {metrics[metric]}" for metric, category in wide.columns]
    # The pivot widened best k to float; it is a count of drafts.
    wide = wide.astype({column: "Int64" for column in wide.columns if column.endswith("best k")})
    overall = per_category.groupby(keys)["overall_speedup"].first()
    # The ranking and the lossless rate first: they must stay in view however many categories follow.
    table = lossless.set_index(keys).join(overall.rename("speedup (geo-mean)"), how="inner").join(wide)
    table = table[["speedup (geo-mean)", "lossless_rate", "runs", *wide.columns]]
    return table.reset_index().sort_values(["target", "mode", "speedup (geo-mean)"], ascending=[True, True, False],
                                           ignore_index=True)


def head_to_head(cells: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    """Per target × mode × category × k × policy: α, nodes per round, τ and measured speedup of draft a next to
    draft b."""
    setup = ("device", "kernels", "threads", "batch_size")
    keys = ["target", "mode", *(c for c in setup if c in cells), "category", "k", "k_policy"]
    metrics = {"alpha": "α", "nodes_per_round": "nodes/round", "tau": "τ", "measured_speedup": "speedup"}
    two = cells[cells["draft"].isin([a, b])].fillna({"kernels": "not recorded", "threads": 0})
    wide = two.pivot(index=keys, columns="draft", values=list(metrics))
    wide = wide.reindex(columns=[(metric, draft) for metric in metrics for draft in (a, b)])
    wide.columns = [f"{metrics[metric]} · {draft}" for metric, draft in wide.columns]
    return wide.reset_index()


def k_curve(curve: pd.DataFrame) -> pd.DataFrame:
    """The advisor's long frame: per series × category × k, the predicted, measured and flat-formula tokens/s."""
    if curve.empty:
        return pd.DataFrame(columns=["series", "category", "k", "tokens_per_s", "source"])
    labelled = curve.assign(series=series_label(curve))
    sources = {"predicted_tokens_per_s": PREDICTED, "measured_tokens_per_s": MEASURED, "formula_tokens_per_s": THEORY}
    long = labelled.melt(id_vars=["series", "category", "k"], value_vars=list(sources), value_name="tokens_per_s")
    return long.dropna(subset=["tokens_per_s"]).assign(source=long["variable"].map(sources)).drop(columns="variable")


def best_leaderboard(best: pd.DataFrame, lossless: pd.DataFrame) -> pd.DataFrame:
    """One row per setup × draft (`comparable.best_cells`): per category the best k and policy, its speedup, α and
    τ; the lossless rate; ranked within each setup by the geometric mean of the best speedups over categories."""
    keys = ["setup", "draft"]
    best = best.assign(setup=comparable.labelled(best), best=[comparable.choice(k, p) for k, p in
                                                              zip(best["k"], best["k_policy"], strict=True)])
    metrics = {"best": "best", "speedup": "speedup", "alpha": "α", "tau": "τ"}
    wide = best.pivot(index=keys, columns="category", values=list(metrics))
    categories = sorted(best["category"].unique())
    wide = wide[[(metric, category) for category in categories for metric in metrics]]
    wide.columns = [f"{category} {metrics[metric]}" for metric, category in wide.columns]
    overall = best.groupby(keys)["speedup"].apply(lambda x: float(np.exp(np.log(x).mean())))
    prompts = best.groupby("setup")["prompts"].agg(lambda x: f"{x.min()}" if x.min() == x.max()
                                                   else f"{x.min()}–{x.max()}").rename("prompts")
    rates = lossless.assign(setup=comparable.labelled(lossless)).set_index(keys)["lossless_rate"]
    table = wide.join(overall.rename("speedup (geo-mean)")).join(rates).join(prompts, on="setup")
    table = table[["speedup (geo-mean)", "lossless_rate", "prompts", *wide.columns]].reset_index()
    return table.sort_values(["setup", "speedup (geo-mean)"], ascending=[True, False], ignore_index=True)


def best_per_category(best: pd.DataFrame) -> pd.DataFrame:
    """Per setup × category the best draft (`comparable.best_cells`), with its k and policy: the Overview's
    headline."""
    if best.empty:
        return best.assign(setup=[], choice=[])
    top = best.sort_values("speedup", ascending=False).drop_duplicates([*comparable.SETUP, "category"])
    top = top.assign(setup=comparable.labelled(top),
                     choice=[comparable.choice(k, p) for k, p in zip(top["k"], top["k_policy"], strict=True)])
    return top.sort_values(["setup", "category"], ignore_index=True)


def advice_table(advice: pd.DataFrame, best: pd.DataFrame) -> pd.DataFrame:
    """The k advisor's rows (`advisor.k_advice`) next to the measured best k and policy of the same setup ×
    category × draft (`comparable.best_cells`, as the leaderboard has it), so both pages give one answer; the
    advisor's hit in words, since an unjudged prediction is not a miss."""
    keys = ["target", "device", "kernels", "threads", "batch_size", "mode", "category", "draft"]
    advice = advice.assign(kernels=advice["kernels"].fillna("not recorded"),
                           threads=advice["threads"].fillna(0).astype(int))
    measured = best[[*keys, "temperature", "top_p", "k", "k_policy", "speedup"]].rename(
        columns={"k": "best_k", "k_policy": "best_policy", "speedup": "best_speedup"})
    table = advice.merge(measured.astype({"threads": int}), on=keys, how="left")
    table = table.fillna({"temperature": 0.0, "top_p": 1.0})
    table["setup"] = comparable.labelled(table)
    table["measured_choice"] = [None if pd.isna(k) else comparable.choice(k, p)
                              for k, p in zip(table["best_k"], table["best_policy"], strict=True)]
    table["hit"] = table["hit"].map(lambda hit: "not judged: no run at its k" if pd.isna(hit)
                                    else "✓ hit" if hit else "✗ miss")
    return table


def left_out_note(left: pd.DataFrame) -> str:
    """The cells `comparable.left_out` names, in one line; empty when none was."""
    if left.empty:
        return ""
    cells = [f"{short_draft(row.draft)} {comparable.choice(row.k, row.k_policy)} on {row.category}"
             for row in left.itertuples()]
    return (f"Left out, since they missed a prompt the other cells of their setup ran: {', '.join(cells[:8])}"
            + (f" and {len(cells) - 8} more" if len(cells) > 8 else "") + ".")
