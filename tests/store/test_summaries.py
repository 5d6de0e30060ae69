"""The sweep summary and the SQL examples, row by row, on the hand-built fixture database.

The fixture (tests/helpers/dashboard_fixtures.py) gets one more run here, c2-ng-k4: code-02 with prompt lookup at
k = 4 and every draft rejected (8 rounds of 4 drafts, then 3, 2, 1, 0; 11 rejected, 27 thrown, 38 drafted),
in 1.2 s against its baseline's 2.4 s (2.0×). With it, code × ngram × 4 pools a run of α 9/10 with a run
of α 0: pooled α 9/21, where a mean of the two would say 0.45.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from runner.store.runs import sweep_summary, write_run
from runner.store.sql import EXAMPLES, run_query
from tests.helpers.dashboard_fixtures import build, speculative_record


def formula(alpha: float, k: int, c: float) -> float:
    """Leviathan et al., written out again so the expected values do not come from the code under test."""
    return (k + 1) / (1 + k * c) if alpha == 1 else (1 - alpha ** (k + 1)) / ((1 - alpha) * (1 + k * c))


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = build(tmp_path_factory.mktemp("summaries") / "runs.duckdb")
    write_run(path, speculative_record("c2-ng-k4", "code-02", "ngram", 4, [0] * 12, 1.2, minute=50))
    return path


def values(frame: pd.DataFrame) -> list[list]:
    return frame.astype(object).where(frame.notna(), None).values.tolist()


def example(db: Path, name: str) -> list[list]:
    return values(run_query(db, EXAMPLES[name]).frame)


# Per run (tests/dashboard/test_dashboard_queries.py works each out from the accepted counts per round):
# run: (accepted, rejected, thrown, drafted, rounds, measured speedup, c)
RUNS = {
    "c1-ng-k2": (7, 1, 0, 8, 5, 2.0, 0.05), "c2-ng-k2": (8, 0, 0, 8, 4, 4.0, 0.05),
    "c1-ng-k4": (9, 1, 1, 11, 3, 2.4, 0.05), "c2-ng-k4": (0, 11, 27, 38, 12, 2.0, 0.05),
    "c1-ls-k2": (4, 7, 3, 14, 8, 0.8, 0.4), "c1-ls-k4": (6, 5, 9, 20, 6, 0.6, 0.4),
    "p1-ng-k2": (1, 8, 6, 15, 11, 1.2, 0.05), "p1-ng-k4": (0, 11, 27, 38, 12, 0.75, 0.05),
    "p1-ls-k2": (4, 6, 3, 13, 8, 0.5, 0.4), "p1-ls-k4": (8, 2, 3, 13, 4, 1.0, 0.4),
}
CELL_RUNS = {("code", "layerskip:2", 2): ["c1-ls-k2"], ("code", "layerskip:2", 4): ["c1-ls-k4"],
             ("code", "ngram", 2): ["c1-ng-k2", "c2-ng-k2"], ("code", "ngram", 4): ["c1-ng-k4", "c2-ng-k4"],
             ("poem", "layerskip:2", 2): ["p1-ls-k2"], ("poem", "layerskip:2", 4): ["p1-ls-k4"],
             ("poem", "ngram", 2): ["p1-ng-k2"], ("poem", "ngram", 4): ["p1-ng-k4"]}


def pooled_alpha(runs: list[str]) -> float:
    accepted = sum(RUNS[r][0] for r in runs)
    return accepted / (accepted + sum(RUNS[r][1] for r in runs))


def geomean(xs: list[float]) -> float:
    return math.prod(xs) ** (1 / len(xs))


def test_the_sweep_summary_holds_every_column_by_hand(db):
    summary = sweep_summary(db, "s1")
    assert list(summary.columns) == ["category", "draft", "k", "mode", "k_policy", "runs", "alpha", "tau",
                                     "thrown_share", "measured_speedup", "predicted_speedup", "real_divergences",
                                     "numeric_ties", "unjudged"]
    got = {(r[0], r[1], r[2]): r[3:] for r in values(summary)}
    assert list(got) == list(CELL_RUNS)  # ordered by category, draft, k
    for cell, runs in CELL_RUNS.items():
        k = cell[2]
        alphas = [RUNS[r][0] / (RUNS[r][0] + RUNS[r][1]) for r in runs]
        assert got[cell][:3] == ["greedy", "fixed", len(runs)], cell
        expected = [
            pooled_alpha(runs),
            sum(12 / RUNS[r][4] for r in runs) / len(runs),  # τ per run: 12 tokens over its rounds
            sum(RUNS[r][2] for r in runs) / sum(RUNS[r][3] for r in runs),
            geomean([RUNS[r][5] for r in runs]),
            geomean([formula(a, k, RUNS[r][6]) for a, r in zip(alphas, runs, strict=True)]),
            # the lossy run's mismatch is not classified (no divergence recorded for it): unjudged
            0, 0, int(cell == ("poem", "layerskip:2", 4)),
        ]
        assert got[cell][3:] == pytest.approx(expected, rel=1e-9), cell
    # the pooled cell, worked out: α 9/21 (not the mean 0.45), τ (4 + 1)/2, thrown 28/49, √(2.4·2.0)
    assert got[("code", "ngram", 4)][3:7] == pytest.approx([9 / 21, 2.5, 28 / 49, math.sqrt(4.8)])


def test_thrown_away_drafts_example(db):
    # ngram k=4: thrown 1 + 27 + 27 of 11 + 38 + 38; layerskip k=4: 9 + 3 of 20 + 13; k=2: 3 + 3 of 14 + 13;
    # ngram k=2: 0 + 0 + 6 of 8 + 8 + 15
    assert example(db, "thrown-away drafts") == [
        ["ngram", 4, 55, 87, 0.632], ["layerskip:2", 4, 12, 33, 0.364], ["layerskip:2", 2, 6, 27, 0.222],
        ["ngram", 2, 6, 31, 0.194]]


def test_lossless_failures_example(db):
    assert example(db, "lossless failures") == [
        ["p1-ls-k4", "s1", "poem", "poem-01", "layerskip:2", 4, "float32", "cpu", "poem-01-base"]]


def test_slowest_rounds_example(db):
    rows = example(db, "slowest rounds")
    # A layer-skip round of 4 drafts costs 4 × 20 ms + 70 ms: five in c1-ls-k4, three in p1-ls-k4.
    assert sorted(r[:2] + r[3:4] + r[5:] for r in rows[:8]) == sorted(
        [["c1-ls-k4", "layerskip:2", 4, 80.0, 70.0]] * 5 + [["p1-ls-k4", "layerskip:2", 4, 80.0, 70.0]] * 3)
    assert sorted((r[0], r[2], r[4]) for r in rows[:8]) == [
        ("c1-ls-k4", 0, 2), ("c1-ls-k4", 1, 0), ("c1-ls-k4", 2, 1), ("c1-ls-k4", 3, 0), ("c1-ls-k4", 4, 3),
        ("p1-ls-k4", 0, 3), ("p1-ls-k4", 1, 0), ("p1-ls-k4", 2, 4)]
    # then 12 of the 13 layer-skip rounds of 2 drafts (40 + 60 ms), which tie
    assert len(rows) == 20 and all(r[1:2] + r[3:4] + r[5:] == ["layerskip:2", 2, 40.0, 60.0] for r in rows[8:])


def test_accepted_drafts_per_round_example(db):
    assert example(db, "accepted drafts per round (histogram)") == [
        ["layerskip:2", 0, 0, 3], ["layerskip:2", 1, 0, 1], ["layerskip:2", 1, 1, 1], ["layerskip:2", 2, 0, 6],
        ["layerskip:2", 2, 1, 6], ["layerskip:2", 2, 2, 1], ["layerskip:2", 4, 0, 3], ["layerskip:2", 4, 1, 1],
        ["layerskip:2", 4, 2, 1], ["layerskip:2", 4, 3, 2], ["layerskip:2", 4, 4, 1],
        ["ngram", 0, 0, 6], ["ngram", 1, 0, 3], ["ngram", 2, 0, 8], ["ngram", 2, 1, 2], ["ngram", 2, 2, 7],
        ["ngram", 3, 0, 2], ["ngram", 3, 3, 1], ["ngram", 4, 0, 16], ["ngram", 4, 2, 1], ["ngram", 4, 4, 1]]


def test_alpha_per_cell_example_pools_the_runs(db):
    frame = run_query(db, EXAMPLES["α per category × draft × k"]).frame
    got = {(r.target, r.mode, r.category, r.draft, r.k): (r.alpha, r.runs, r.measured_speedup)
           for r in frame.itertuples()}
    assert got == {("tiny-target", "greedy", *cell): (
        round(pooled_alpha(runs), 3), len(runs), round(geomean([RUNS[r][5] for r in runs]), 2))
        for cell, runs in CELL_RUNS.items()}


def test_best_k_example_takes_the_geometric_mean(db):
    # code × ngram: k=2 √(2.0·4.0) = 2.83 beats k=4 √(2.4·2.0) = 2.19; poem × layerskip: k=4 (1.0) beats k=2 (0.5)
    assert example(db, "best k per category and draft (measured speedup)") == [
        ["tiny-target", "greedy", "code", "ngram", 2, "fixed", 2.83],
        ["tiny-target", "greedy", "code", "layerskip:2", 2, "fixed", 0.8],
        ["tiny-target", "greedy", "poem", "ngram", 2, "fixed", 1.2],
        ["tiny-target", "greedy", "poem", "layerskip:2", 4, "fixed", 1.0]]
