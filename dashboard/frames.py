"""Chart- and table-ready frames built from the small frames `queries` returns; pure pandas.

The theory sits next to the measurements in one long frame with a `source` column, so one Altair
chart can layer a line (theory) and points (measured) and still facet (docs/design.md, "Charts").
The formula's values come from SQL (`runner.store.metrics`), where it is defined once.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dashboard import words
from runner.store import comparable, spread

THEORY, MEASURED, BEST_K = "theory", "measured", "formula's best k"
PREDICTED = "advisor"


def series_label(frame: pd.DataFrame) -> pd.Series:
    """What one line or colour stands for: draft · mode (· its draft-length policy unless fixed), with the target
    when several are shown."""
    label = frame["draft"].astype(str).map(words.draft_name) + " · " + frame["mode"].astype(str)
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


def speedup_by_k(cells: pd.DataFrame, curve: pd.DataFrame) -> pd.DataFrame:
    """Per series × category × k: the measured speedup with its interval (`comparable.cells`), and, for fixed k, the
    advisor's and the flat formula's predictions (`advisor.k_curve`, as speedups over plain decoding's decode
    tokens/s) drawn only over the ks measured for that series and category."""
    labelled = cells.assign(series=series_label(cells)) if len(cells) else cells.assign(series=[])
    columns = ["series", "category", "k", "speedup", "low", "high", "speedup_min", "speedup_max", "alpha", "prompts"]
    parts = [labelled[columns].assign(source=MEASURED)]
    if len(curve) and len(cells):
        lines = curve.assign(k_policy="fixed")
        lines = lines.assign(series=series_label(lines))
        measured = labelled.groupby(["series", "category"])["k"].agg(["min", "max"]).reset_index()
        lines = lines.merge(measured, on=["series", "category"])
        lines = lines[(lines["k"] >= lines["min"]) & (lines["k"] <= lines["max"])]
        for column, source in (("predicted_tokens_per_s", PREDICTED), ("formula_tokens_per_s", THEORY)):
            parts.append(lines.assign(speedup=lines[column] / lines["baseline_tokens_per_s"], source=source)[
                ["series", "category", "k", "speedup", "alpha", "source"]])
    return pd.concat(parts, ignore_index=True)


def default_series(frame: pd.DataFrame, x: str, most: int, by: str = "speedup") -> list[str]:
    """The series a chart draws before anyone picks: those measured at 2 or more values of `x` (in some category,
    where the frame has categories): a line, not a lone dot; the `most` with the highest `by` (the fastest)."""
    measured = frame[frame["source"] == MEASURED] if "source" in frame else frame
    points = measured.groupby(["series", "category"] if "category" in measured else ["series"])[x].nunique()
    lines = points[points >= 2].index.get_level_values("series").unique()
    highest = measured[measured["series"].isin(lines)].groupby("series")[by].max()
    return highest.sort_values(ascending=False).index[:most].tolist()


def head_to_head(cells: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    """Per setup × category × k × policy both drafts ran: each one's speedup with its interval (`comparable.cells`)
    and α, then B over A (`b_over_a`, > 1: B faster) and whether the two tie (`spread.TIE`)."""
    keys = [*comparable.SETUP, "category", "k", "k_policy"]
    metrics = ["speedup", "low", "high", "alpha", "prompts"]
    one = cells[cells["draft"] == a].set_index(keys)[metrics]
    two = cells[cells["draft"] == b].set_index(keys)[metrics]
    both = one.join(two, how="inner", lsuffix="_a", rsuffix="_b").reset_index()
    if both.empty:
        return both.assign(b_over_a=[], tie=[])
    both["b_over_a"] = both["speedup_b"] / both["speedup_a"]
    both["tie"] = [_tie(row) for row in both.to_dict("records")]
    return both


def _tie(row: dict) -> bool:
    """`spread.tied` on a head-to-head row: the faster of A and B against the other."""
    first, second = ("a", "b") if row["speedup_a"] >= row["speedup_b"] else ("b", "a")
    return spread.tied(pd.Series({"low": row[f"low_{first}"]}), pd.Series({"high": row[f"high_{second}"]}))


def head_to_head_chart(cells: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    """The two drafts' measured speedups against k in one frame, `series` naming the draft and its policy."""
    two = cells[cells["draft"].isin([a, b])]
    label = two["draft"].map({a: "A", b: "B"}) + ": " + two["draft"].map(words.draft_name)
    adaptive = two["k_policy"] != "fixed"
    label = label.where(~adaptive, label + " · " + two["k_policy"].astype(str))
    return two.assign(series=label, source=MEASURED)


def k_curve(curve: pd.DataFrame) -> pd.DataFrame:
    """The advisor's long frame: per series × category × k, the predicted, measured and flat-formula tokens/s."""
    if curve.empty:
        return pd.DataFrame(columns=["series", "category", "k", "tokens_per_s", "source"])
    labelled = curve.assign(series=series_label(curve))
    sources = {"predicted_tokens_per_s": PREDICTED, "measured_tokens_per_s": MEASURED, "formula_tokens_per_s": THEORY}
    long = labelled.melt(id_vars=["series", "category", "k"], value_vars=list(sources), value_name="tokens_per_s")
    return long.dropna(subset=["tokens_per_s"]).assign(source=long["variable"].map(sources)).drop(columns="variable")


def best_leaderboard(best: pd.DataFrame, lossless: pd.DataFrame) -> pd.DataFrame:
    """One row per setup × draft (`comparable.best_cells`): per category the best k and policy, its speedup with the
    interval, whether the draft's runner-up (k, policy) ties it, and α; the lossless checks in words (the
    `lossless` column of `lossless`, `words.lossless`); ranked within each setup by the geometric mean of the best
    speedups over categories."""
    keys = ["setup", "draft"]
    best = best.assign(setup=comparable.labelled(best), interval=[_interval(row) for _, row in best.iterrows()],
                       tie=[f"≈ {row.runner_up}" if row.tied else "" for row in best.itertuples()])
    metrics = {"choice": "best", "speedup": "speedup", "interval": "95%", "tie": "tie", "alpha": "α"}
    wide = best.pivot(index=keys, columns="category", values=list(metrics))
    categories = sorted(best["category"].unique())
    wide = wide[[(metric, category) for category in categories for metric in metrics]]
    wide.columns = [f"{category} {metrics[metric]}" for metric, category in wide.columns]
    overall = best.groupby(keys)["speedup"].apply(lambda x: float(np.exp(np.log(x).mean())))
    prompts = best.groupby("setup")["prompts"].agg(lambda x: f"{x.min()}" if x.min() == x.max()
                                                   else f"{x.min()}–{x.max()}").rename("prompts")
    rates = lossless.assign(setup=comparable.labelled(lossless)).set_index(keys)["lossless"]
    table = wide.join(overall.rename("speedup (geo-mean)")).join(rates).join(prompts, on="setup")
    table = table[["speedup (geo-mean)", "lossless", "prompts", *wide.columns]].reset_index()
    table = table.sort_values(["setup", "speedup (geo-mean)"], ascending=[True, False], ignore_index=True)
    return table.assign(draft=table["draft"].map(words.draft_name))


def _interval(row: pd.Series) -> str:
    return "1 prompt" if int(row["prompts"]) < 2 else f"{row['low']:.2f}–{row['high']:.2f}×"


def best_per_category(cells: pd.DataFrame) -> pd.DataFrame:
    """Per setup × category the best cell of every draft, k and policy (`comparable.cells`), its runner-up and
    whether they tie (`spread.TIE`): the Overview's headline."""
    if cells.empty:
        return cells.assign(setup=[], choice=[], name=[], runner_up=[], runner_up_speedup=[], tied=[])
    named = cells.assign(choice=[comparable.choice(k, p) for k, p in zip(cells["k"], cells["k_policy"], strict=True)])
    named = named.assign(name=named["draft"].map(words.draft_name) + " at " + named["choice"])
    top = spread.flag_ties(named, [*comparable.SETUP, "category"], "name")
    top = top.assign(setup=comparable.labelled(top))
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


def rule_caption(cells: pd.DataFrame) -> str:
    """The pooling rule (`spread.POOLING`) and the tie rule, written beside every number they made."""
    n = cells["prompts"] if len(cells) else pd.Series([0])
    count = f"{n.min()}" if n.min() == n.max() else f"{n.min()}–{n.max()}"
    return (f"Each speedup: {spread.POOLING.format(n=count)}. α: pooled over the same runs' drafts, with its "
            f"prompts' min–max. A {spread.TIE}. The SQL page's placeholder query gives these numbers.")


def left_out_note(left: pd.DataFrame) -> str:
    """The cells `comparable.left_out` names, in one line; empty when none was."""
    if left.empty:
        return ""
    cells = [f"{words.draft_name(row.draft)} {comparable.choice(row.k, row.k_policy)} on {row.category}"
             for row in left.itertuples()]
    return (f"Left out, since they missed a prompt the other cells of their setup ran: {', '.join(cells[:8])}"
            + (f" and {len(cells) - 8} more" if len(cells) > 8 else "") + ".")
