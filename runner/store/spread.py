"""How sure a speedup is: the one rule every page pools a cell's speedup by, its interval, and when two cells tie.

The rule, in one place (`POOLING`, `TIE`):

- a prompt's speedup is the geometric mean of its runs' (its repeats, `sweep --repeats N`; one run without them);
- a cell's speedup is the geometric mean of its prompts' speedups, over the prompts every compared cell of its setup
  × category ran (`comparable`), so n is the number of prompts, not of runs;
- its interval is the 95% Student-t interval of that mean on the log scale: exp(m ± t(0.975, n − 1) · s / √n), m and
  s the mean and the sample standard deviation of the prompts' ln speedups. It says how well the prompts pin the mean
  down; the prompts' own min–max says how much a single prompt can differ. One prompt gives no interval;
- the best cell of a group is **tied** with the runner-up when their intervals overlap (the runner-up's upper end
  reaches the winner's lower end), or when either has no interval (fewer than 2 prompts): the data cannot tell
  them apart.
"""

from __future__ import annotations

import math

import pandas as pd
from scipy import stats

CONFIDENCE = 0.95
POOLING = ("geometric mean over the {n} prompts every compared cell ran (a prompt's repeats pooled first); "
           "interval: 95% t-interval over prompts")
TIE = "tie: the runner-up's 95% interval overlaps the winner's, or either has fewer than 2 prompts"


def interval(mean_ln: float, sd_ln: float | None, n: int) -> tuple[float, float]:
    """The 95% t-interval of a geometric mean from its prompts' ln speedups (mean, sample sd, count); NaN for n < 2."""
    if n < 2 or sd_ln is None or math.isnan(sd_ln):
        return math.nan, math.nan
    half = stats.t.ppf((1 + CONFIDENCE) / 2, n - 1) * sd_ln / math.sqrt(n)
    return math.exp(mean_ln - half), math.exp(mean_ln + half)


def with_intervals(cells: pd.DataFrame) -> pd.DataFrame:
    """`cells` (with `mean_ln`, `sd_ln`, `prompts`) given `low` and `high`, the interval of its speedup."""
    bounds = [interval(m, s, int(n)) for m, s, n in zip(cells["mean_ln"], cells["sd_ln"], cells["prompts"],
                                                         strict=True)]
    return cells.assign(low=[low for low, _ in bounds], high=[high for _, high in bounds])


def tied(winner: pd.Series, runner_up: pd.Series) -> bool:
    """`TIE`: the two cells' intervals overlap, or either has none."""
    if any(math.isnan(x) for x in (winner["low"], runner_up["high"])):
        return True
    return bool(runner_up["high"] >= winner["low"])


def flag_ties(cells: pd.DataFrame, group: list[str], name: str) -> pd.DataFrame:
    """The best cell of each `group` by speedup, with the runner-up (`runner_up`: its `name` column;
    `runner_up_speedup`) and whether they tie (`tied`; False when the group has one cell)."""
    rows = []
    for _, members in cells.groupby(group, sort=False, dropna=False):
        ranked = members.sort_values("speedup", ascending=False)
        best = ranked.iloc[0].copy()
        second = ranked.iloc[1] if len(ranked) > 1 else None
        best["runner_up"] = None if second is None else second[name]
        best["runner_up_speedup"] = math.nan if second is None else second["speedup"]
        best["tied"] = second is not None and tied(best, second)
        rows.append(best)
    return pd.DataFrame(rows).reset_index(drop=True) if rows else cells.assign(runner_up=[], runner_up_speedup=[],
                                                                               tied=[])


def spread_text(row: pd.Series) -> str:
    """'1.84× (95% 1.10–3.07×; prompts 1.42–3.07×, n=3)', or with one prompt '1.84× (1 prompt: no interval)'."""
    head = f"{row['speedup']:.2f}×"
    if int(row["prompts"]) < 2:
        return f"{head} (1 prompt: no interval)"
    return (f"{head} (95% {row['low']:.2f}–{row['high']:.2f}×; prompts {row['speedup_min']:.2f}–"
            f"{row['speedup_max']:.2f}×, n={int(row['prompts'])})")
