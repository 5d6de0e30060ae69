"""The dashboard's numbers on a hand-built database (tests/helpers/dashboard_fixtures.py): exact values, by hand.

How each expected number comes about is written next to it, from the fixture's accepted counts per
round. Speedups: baselines take 0.1 s/token (code-02's 0.2 s/token), so measured = 0.1 / (wall_s / 12).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from dashboard import charts, fates, filter_queries, frames, queries, tree_layout, words
from runner import records
from runner.store import advisor, comparable, metrics
from runner.store.metrics import Filters
from tests.helpers.dashboard_fixtures import add_trees, build


def formula(alpha: float, k: int, c: float) -> float:
    """Leviathan et al., written out again here so the tests do not trust the code under test."""
    return (k + 1) / (1 + k * c) if alpha == 1 else (1 - alpha ** (k + 1)) / ((1 - alpha) * (1 + k * c))


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("dash") / "runs.duckdb")


@pytest.fixture(scope="module")
def tree_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture with one more run, `c2-tree-k3`: tree drafts (dashboard_fixtures.TREE_ROUNDS)."""
    return add_trees(build(tmp_path_factory.mktemp("trees") / "runs.duckdb"))


def rows(frame: pd.DataFrame, columns: list[str]) -> list[list]:
    return frame[columns].astype(object).where(frame[columns].notna(), None).values.tolist()


# (category, draft, k): runs, accepted, rejected, thrown, drafted, α, thrown share, τ, c, measured, predicted
CELLS = {
    # rounds accepted 1,0,1,0,1,0,1 of k=2 then one k=0 round: 8 rounds for 12 tokens
    ("code", "layerskip:2", 2): (1, 4, 7, 3, 14, 4 / 11, 3 / 14, 12 / 8, 0.4, 1.2 / 1.5, formula(4 / 11, 2, 0.4)),
    # 2,0,1,0,3 of k=4 then k=0: 6 rounds
    ("code", "layerskip:2", 4): (1, 6, 5, 9, 20, 6 / 11, 9 / 20, 12 / 6, 0.4, 1.2 / 2.0, formula(6 / 11, 4, 0.4)),
    # code-01 (7 of 8 judged, τ 12/5, 2.0×) pooled with code-02 (8 of 8, τ 3, 0.2/0.05 = 4.0×)
    ("code", "ngram", 2): (2, 15, 1, 0, 16, 15 / 16, 0.0, (12 / 5 + 3) / 2, 0.05, math.sqrt(2.0 * 4.0),
                           math.sqrt(formula(7 / 8, 2, 0.05) * formula(1.0, 2, 0.05))),
    # 4 of 4, 2 of 4 (1 thrown), 3 of 3 (k shrinks to budget − 1)
    ("code", "ngram", 4): (1, 9, 1, 1, 11, 9 / 10, 1 / 11, 12 / 3, 0.05, 1.2 / 0.5, formula(9 / 10, 4, 0.05)),
    ("poem", "layerskip:2", 2): (1, 4, 6, 3, 13, 4 / 10, 3 / 13, 12 / 8, 0.4, 1.2 / 2.4, formula(0.4, 2, 0.4)),
    # 3 of 4, 0 of 4, 4 of 4, 1 of 1: the lossy run
    ("poem", "layerskip:2", 4): (1, 8, 2, 3, 13, 8 / 10, 3 / 13, 12 / 4, 0.4, 1.2 / 1.2, formula(0.8, 4, 0.4)),
    # two rounds with no draft, then 1 of 2, 0 of 2 …, 0 of 1: 11 rounds, 15 drafts
    ("poem", "ngram", 2): (1, 1, 8, 6, 15, 1 / 9, 6 / 15, 12 / 11, 0.05, 1.2 / 1.0, formula(1 / 9, 2, 0.05)),
    # every draft rejected: 8 rounds of k=4, then k=3, 2, 1, 0
    ("poem", "ngram", 4): (1, 0, 11, 27, 38, 0.0, 27 / 38, 1.0, 0.05, 1.2 / 1.6, formula(0.0, 4, 0.05)),
}


def test_cells_hold_the_hand_computed_numbers(db):
    cells = queries.read(db, metrics.cells, Filters())
    columns = ["runs", "accepted", "rejected", "thrown", "drafted", "alpha", "thrown_share", "tau", "c",
               "measured_speedup", "predicted_speedup"]
    got = {(r.category, r.draft, r.k): tuple(getattr(r, c) for c in columns) for r in cells.itertuples()}
    assert got.keys() == CELLS.keys()
    for cell, expected in CELLS.items():
        assert got[cell] == pytest.approx(expected), cell
    assert set(cells["target"]) == {"tiny-target"} and set(cells["mode"]) == {"greedy"}
    assert cells.set_index(["category", "draft", "k"])["lossless_failures"].to_dict() == {
        cell: int(cell == ("poem", "layerskip:2", 4)) for cell in CELLS}


def test_filters_pick_rows_by_parameters(db):
    cells = queries.read(db, metrics.cells, Filters(category=("poem",), k=(4,)))
    assert rows(cells, ["category", "draft", "k"]) == [["poem", "layerskip:2", 4], ["poem", "ngram", 4]]
    hostile = queries.read(db, metrics.cells, Filters(draft=("ngram' OR 1=1 --",)))
    assert hostile.empty


def test_filter_options_come_from_runs_with_statistics(db):
    # The failed k=8 run has no statistics, so k=8 is no option.
    assert queries.read(db, filter_queries.filter_options) == {
        "target": ["tiny-target"], "draft": ["layerskip:2", "ngram"], "category": ["code", "poem"], "k": [2, 4],
        "mode": ["greedy"], "device": ["cpu"], "sweep_id": ["s1"], "host": [], "concurrent_workers": [1],
        "kernels": ["skinny"], "threads": [2], "k_policy": ["fixed"], "batch_size": [1], "engine": ["specdash"]}


def test_kernels_and_threads_filter_runs_and_split_the_verify_curve(db):
    assert len(queries.read(db, queries.runs, Filters(kernels=("skinny",), threads=(2,)), 100)) == 9
    assert queries.read(db, queries.runs, Filters(threads=(1,)), 100).empty
    assert queries.read(db, metrics.cells, Filters(kernels=("stock",))).empty
    growth = queries.read(db, queries.verify_growth, Filters(threads=(2,)))
    assert set(zip(growth["kernels"], growth["threads"], strict=True)) == {("skinny", 2)}
    assert growth["relative"].tolist() == pytest.approx([1.0, 1.1, 1.2, 1.3, 1.4])


def every_run(db: Path, filters: Filters) -> pd.DataFrame:
    """The plain query `queries.runs` stands for: every selected speculative run of run_stats, newest first."""
    where, params = filters.where(alias="s.")
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(f"""
            SELECT s.run_id, r.started_at, s.target, s.mode, s.category, s.prompt_id, s.draft, s.k, s.k_policy,
                s.kernels, s.threads, s.batch_size, s.alpha, s.tau, s.thrown_share, s.c, s.measured_speedup,
                s.theoretical_speedup, s.lossless
            FROM run_stats s JOIN runs r USING (run_id)
            WHERE s.draft <> 'none' AND {where} ORDER BY r.started_at DESC, s.run_id""", params).df()


@pytest.mark.parametrize("filters", [Filters(), Filters(draft=("ngram",)), Filters(host=("nowhere",))])
def test_the_newest_runs_are_the_head_of_every_run(db, filters):
    every = every_run(db, filters)
    for limit in (1, 5, 100):
        pd.testing.assert_frame_equal(queries.read(db, queries.runs, filters, limit), every.head(limit))
    # at a k: only runs with a measured speedup and an α, as the theory chart draws them
    at_2 = every[(every["k"] == 2) & every["measured_speedup"].notna() & every["alpha"].notna()]
    assert len(at_2) > 2 or filters.host
    pd.testing.assert_frame_equal(queries.read(db, queries.runs, filters, 2, 2), at_2.head(2).reset_index(drop=True))


def test_totals_pool_every_selected_run(db):
    totals = queries.read(db, metrics.cells, Filters(), ()).iloc[0]
    taus = [1.5, 2.0, 12 / 5, 3.0, 4.0, 1.5, 3.0, 12 / 11, 1.0]
    speedups = [0.8, 0.6, 2.0, 4.0, 2.4, 0.5, 1.0, 1.2, 0.75]
    assert (totals["runs"], totals["rounds"], totals["drafted"], totals["thrown"]) == (9, 61, 140, 52)
    assert totals["thrown_share"] == pytest.approx(52 / 140)
    assert totals["alpha"] == pytest.approx(47 / (47 + 41))
    assert totals["tau"] == pytest.approx(sum(taus) / 9)
    assert totals["measured_speedup"] == pytest.approx(math.prod(speedups) ** (1 / 9))


def test_verify_growth_is_relative_to_the_one_token_pass(db):
    growth = queries.read(db, queries.verify_growth, Filters())
    # A pass over k drafts takes 0.05·(1 + 0.1·k) s. Rounds per k: 36 baseline + 8 draftless rounds at k=0.
    assert rows(growth, ["target", "device", "k", "rounds"]) == [
        ["tiny-target", "cpu", 0, 44], ["tiny-target", "cpu", 1, 4], ["tiny-target", "cpu", 2, 29],
        ["tiny-target", "cpu", 3, 2], ["tiny-target", "cpu", 4, 18]]
    assert growth["relative"].tolist() == pytest.approx([1.0, 1.1, 1.2, 1.3, 1.4])
    assert growth["verify_s"].tolist() == pytest.approx([0.05, 0.055, 0.06, 0.065, 0.07])
    # A draft filter keeps the baselines: they have no draft, and they are the reference.
    ngram = queries.read(db, queries.verify_growth, Filters(draft=("ngram",)))
    assert rows(ngram, ["k", "rounds"]) == [[0, 36 + 5], [1, 2], [2, 16], [3, 2], [4, 10]]
    assert ngram["relative"].tolist() == pytest.approx([1.0, 1.1, 1.2, 1.3, 1.4])
    # So does a policy filter: baselines have no policy either.
    fixed = queries.read(db, queries.verify_growth, Filters(k_policy=("fixed",)))
    assert rows(fixed, ["k", "rounds"]) == rows(growth, ["k", "rounds"])


# Nodes per round: Σ k over the rounds that drafted / their count. The last round of a run often has no room left to
# draft (k = 0), and prompt lookup's `None` rounds drafted nothing: neither counts.
NODES = {
    ("code", "layerskip:2", 2): 14 / 7,  # 7 rounds of k=2, then k=0
    ("code", "layerskip:2", 4): 20 / 5,  # 5 rounds of k=4, then k=0
    ("code", "ngram", 2): (8 + 8) / (4 + 4),  # code-01: 4 rounds of k=2 then k=0; code-02: 4 rounds of k=2
    ("code", "ngram", 4): 11 / 3,  # k = 4, 4, 3
    ("poem", "layerskip:2", 2): 13 / 7,  # 6 rounds of k=2, one of k=1, then k=0
    ("poem", "layerskip:2", 4): 13 / 4,  # k = 4, 4, 4, 1
    ("poem", "ngram", 2): 15 / 8,  # two None rounds; 7 rounds of k=2, one of k=1, then k=0
    ("poem", "ngram", 4): 38 / 11,  # 8 rounds of k=4, then k=3, 2, 1 (and 0)
}


def test_cells_carry_nodes_per_round_and_mark_no_chain_as_a_tree(db):
    cells = queries.read(db, queries.comparable_cells, Filters()).set_index(["category", "draft", "k"])
    assert cells["nodes_per_round"].to_dict() == pytest.approx(NODES)
    assert not cells["tree"].any()


def test_a_tree_runs_tau_and_nodes_per_round(db, tree_db):
    # c2-tree-k3 (TREE_ROUNDS): 4, 4, 3 nodes, a draftless round, then a 2-node chain: 13 nodes in 4 rounds that
    # drafted; accepted 2 + 3 + 0 + 2 of 2 + 3 + 1 + 2 judged; 12 tokens in 5 rounds; 0.2 / (0.8 / 12) = 3×.
    cells = queries.read(tree_db, queries.comparable_cells, Filters(draft=("ngram-tree",)))
    assert rows(cells, ["category", "draft", "k", "runs", "tree", "accepted", "rejected", "thrown", "drafted"]) == [
        ["code", "ngram-tree", 3, 1, True, 7, 2, 4, 13]]
    assert cells[["nodes_per_round", "tau", "alpha", "speedup"]].iloc[0].tolist() == pytest.approx(
        [13 / 4, 12 / 5, 7 / 9, 3.0])
    keys = ("target", "mode", "draft", "category")
    per_category = queries.read(tree_db, queries.nodes_per_round, Filters(category=("code",)), keys)
    assert per_category.set_index("draft")["nodes_per_round"].to_dict() == pytest.approx(
        {"layerskip:2": (14 + 20) / (7 + 5), "ngram": (16 + 11) / (8 + 3), "ngram-tree": 13 / 4})
    assert queries.read(tree_db, queries.tree_drafts) == ["ngram-tree"]
    assert queries.read(db, queries.tree_drafts) == []


def test_each_category_s_best_k_and_the_geo_mean_over_them(db):
    per_category = queries.read(db, metrics.draft_categories, Filters()).set_index(["draft", "category"])
    columns = ["alpha", "tau_at_best_k", "best_k", "best_speedup", "overall_speedup"]
    # ngram: code α (15 + 9) / (16 + 10); best k 2 (√8 ≈ 2.83× beats 2.4×) with τ 2.7; poem α 1/20, best k 2 (1.2×)
    ngram = math.sqrt(math.sqrt(8) * 1.2)
    assert per_category.loc[("ngram", "code"), columns].tolist() == pytest.approx(
        [24 / 26, 2.7, 2, math.sqrt(8), ngram])
    assert per_category.loc[("ngram", "poem"), columns].tolist() == pytest.approx([1 / 20, 12 / 11, 2, 1.2, ngram])
    # layerskip: code α 10/22, best k 2 (0.8×); poem α 12/20, best k 4 (1.0× beats 0.5×)
    skip = math.sqrt(0.8 * 1.0)
    assert per_category.loc[("layerskip:2", "code"), columns].tolist() == pytest.approx([10 / 22, 1.5, 2, 0.8, skip])
    assert per_category.loc[("layerskip:2", "poem"), columns].tolist() == pytest.approx([12 / 20, 3.0, 4, 1.0, skip])


def test_head_to_head_puts_two_drafts_side_by_side(db):
    table = frames.head_to_head(queries.read(db, queries.comparable_cells, Filters()), "ngram", "layerskip:2")
    code_k4 = table[(table["category"] == "code") & (table["k"] == 4)].iloc[0]
    # code-01, the code prompt every cell ran: ngram 1.2 / 0.5 s, layerskip 1.2 / 2.0 s; one prompt: no interval,
    # so no telling them apart (`spread.TIE`)
    assert code_k4[["speedup_a", "speedup_b", "b_over_a", "alpha_a", "alpha_b", "prompts_a", "tie"]].tolist() == \
        pytest.approx([2.4, 0.6, 0.25, 9 / 10, 6 / 11, 1, True])
    assert len(table) == 4  # code and poem at k = 2 and 4


def test_speedup_by_k_draws_the_predictions_only_over_the_measured_ks(db):
    frame = frames.speedup_by_k(queries.read(db, queries.comparable_cells, Filters()),
                                queries.read(db, advisor.k_curve, Filters()))
    assert set(frame["source"]) == {frames.MEASURED, frames.PREDICTED, frames.THEORY}
    for source in (frames.PREDICTED, frames.THEORY):
        line = frame[(frame["source"] == source) & (frame["series"] == "prompt lookup (ngram) · greedy")
                     & (frame["category"] == "poem")]
        assert line["k"].tolist() == [2, 3, 4]  # measured at 2 and 4; nothing drawn past them
    measured = frame[frame["source"] == frames.MEASURED]
    # code pools code-01 alone (the prompt every code cell ran): ngram k=4 at 2.4× is the fastest
    assert len(measured) == 8 and measured["speedup"].max() == pytest.approx(2.4)


def test_theory_frame_and_chart_hold_the_curve_and_the_runs(db):
    frame = frames.theory_vs_measured(queries.read(db, queries.runs, Filters(), 100, 2),
                                      queries.read(db, metrics.formula_over_alpha, Filters(), 2), k=2)
    dots = frame[frame["source"] == frames.MEASURED].set_index("run_id")
    picked = dots.loc[["c1-ng-k2", "c2-ng-k2", "p1-ng-k2", "c1-ls-k2", "p1-ls-k2"]]
    assert picked["alpha"].tolist() == pytest.approx([7 / 8, 1.0, 1 / 9, 4 / 11, 0.4])
    assert picked["speedup"].tolist() == pytest.approx([2.0, 4.0, 1.2, 0.8, 0.5])
    spec = charts.speedup_vs_theory(frame, k=2).to_dict()
    marks = [layer["mark"]["type"] for layer in spec["spec"]["layer"]]
    assert marks == ["line", "rule", "circle"]
    filters = [layer.get("transform", [{}])[0].get("filter") for layer in spec["spec"]["layer"]]
    assert filters[0] == {"field": "source", "equal": "theory"} and filters[2] == {"field": "source",
                                                                                   "equal": "measured"}
    data = pd.DataFrame(spec["datasets"][spec["data"]["name"]])
    curve = data[(data["source"] == "theory")].set_index(["series", "alpha"])["speedup"]
    # At c = 0.05, k = 2: α=0 → 1/1.1; α=0.5 → 0.875/(0.5·1.1); α=1 → 3/1.1. At c = 0.4: α=0.5 → 0.875/0.9.
    assert [curve[("prompt lookup (ngram) · greedy", a)] for a in (0.0, 0.5, 1.0)] == \
        pytest.approx([1 / 1.1, 0.875 / 0.55, 3 / 1.1])
    assert curve[("layer skip (layerskip:2) · greedy", 0.5)] == pytest.approx(0.875 / 0.9)
    assert len(data[data["source"] == "measured"]) == 5


def test_token_fates_follow_the_rounds(db):
    rounds = queries.read(db, queries.run_rounds, "p1-ls-k4")
    output = [300, 301, 302, 303, 304, 305, 399, 307, 308, 309, 310, 311]
    tokens = [(t.token_id, t.fate) for t in fates.text_tokens(output, rounds)]
    assert tokens == [(300, "accepted"), (301, "accepted"), (302, "accepted"), (303, "correction"),
                      (304, "correction"), (305, "accepted"), (399, "accepted"), (307, "accepted"),
                      (308, "accepted"), (309, "bonus"), (310, "accepted"), (311, "bonus")]
    assert [(t.token_id, t.fate) for t in fates.drafts(rounds.iloc[1])] == [
        (904, "rejected"), (954, "thrown"), (955, "thrown"), (956, "thrown")]
    ngram = queries.read(db, queries.run_rounds, "p1-ng-k2")
    plain = fates.text_tokens(list(range(int(ngram["emitted"].sum()))), ngram)
    assert [t.fate for t in plain][:4] == ["plain", "accepted", "correction", "correction"]
    # What no round emitted came from the prefill: the first new token.
    with_prefill = fates.text_tokens([7, 300, 301, 302, 303, 304, 305, 399, 307, 308, 309, 310, 311], rounds)
    assert [(t.token_id, t.fate, t.round) for t in with_prefill[:2]] == [(7, "prefill", -1), (300, "accepted", 0)]
    assert len(with_prefill) == 13
    assert records.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert records.first_difference([1, 9, 3], [1, 2, 3]) == 1
    assert records.first_difference([1, 2], [1, 2, 3]) == 2


def test_the_rounds_table_shows_each_pass_with_its_rows():
    # a 2-draft round whose pass also carried 4 window rows (7 rows), and one of a file from before pass_rows
    rounds = pd.DataFrame([{"round": r, "k": 2, "accepted": 1, "rejected": 1, "thrown": 0, "bonus": False,
                            "emitted": 2, "draft_s": 0.002, "verify_s": 0.05, "pass_rows": rows, "draft_tokens": [1, 2],
                            "target_tokens": [1, 3, 4]} for r, rows in ((0, 7), (1, None))])
    html = fates.rounds_html(rounds, str)
    cells = re.findall(r'<td class="num">([^<]*)</td></tr>', html)
    assert cells == ["50.0 ms · 7 rows", "50.0 ms"]


def test_text_html_escapes_and_marks_every_token():
    rounds = pd.DataFrame([{"round": 0, "k": 2, "accepted": 1, "rejected": 1, "thrown": 0, "bonus": False,
                            "emitted": 2, "draft_s": 0.0, "verify_s": 0.05, "draft_tokens": [1, 2],
                            "target_tokens": [1, 3, 4]}])
    pieces = {1: "<b>", 3: "\n"}
    pieces[0] = "hi"
    html = fates.text_html(fates.text_tokens([0, 1, 3], rounds), pieces.__getitem__)
    assert '<span class="tok-prefill" data-fate="prefill" title="prefill · id 0">hi</span>' in html
    assert '<span class="tok-accepted" data-fate="accepted" title="round 0 · accepted draft · id 1">&lt;b&gt;' in html
    assert 'data-fate="correction" title="round 0 · correction · id 3">⏎\n</span>' in html


def test_a_tree_runs_levels_in_position_stats(tree_db):
    # Depths 3, 3, 2, 2 with (accepted, rejected) (2, 1), (3, 0), (0, 1), (2, 0). Level 1: all four reached it,
    # three went on; level 2: three reached it (not the round that stopped at the root), all three accepted;
    # level 3: two rounds of depth 3 reached it, one accepted.
    rates = queries.read(tree_db, advisor.positions, Filters(draft=("ngram-tree",)))
    assert rows(rates, ["position", "proposed", "reached", "accepted"]) == [[1, 4, 4, 3], [2, 4, 3, 3], [3, 2, 2, 1]]
    assert rates["rate"].tolist() == pytest.approx([3 / 4, 1.0, 1 / 2])
    assert charts.position_title({"ngram-tree"}, {"ngram-tree"}) == "depth (level of the tree)"
    assert charts.position_title({"ngram", "ngram-tree"}, {"ngram-tree"}) == "draft position / tree depth"
    assert charts.position_title({"ngram"}, {"ngram-tree"}) == "draft position"


def test_a_tree_runs_tokens_follow_its_accepted_paths(tree_db):
    rounds = queries.read(tree_db, queries.run_rounds, "c2-tree-k3")
    tokens = fates.text_tokens(list(range(200, 212)), rounds)
    assert [(t.token_id, t.fate, t.round) for t in tokens] == [
        (200, "accepted", 0), (201, "accepted", 0), (202, "correction", 0), (203, "accepted", 1),
        (204, "accepted", 1), (205, "accepted", 1), (206, "bonus", 1), (207, "correction", 2), (208, "plain", 3),
        (209, "accepted", 4), (210, "accepted", 4), (211, "bonus", 4)]
    # In node order: 902, the only child of the last accepted node, refused; 950 beside the path, thrown.
    assert [(t.token_id, t.fate) for t in fates.drafts(rounds.iloc[0])] == [
        (200, "accepted"), (201, "accepted"), (902, "rejected"), (950, "thrown")]
    assert [(t.token_id, t.fate) for t in fates.drafts(rounds.iloc[2])] == [
        (907, "rejected"), (208, "thrown"), (209, "thrown")]
    assert fates.roots(tokens) == {1: 202, 2: 206, 3: 207, 4: 208}


def test_a_sampled_tree_round_keeps_its_path_and_its_own_token():
    # Sampling records only the path's tokens and the target's own: here 5 (node 0) accepted, then 42 drawn.
    row = pd.Series({"round": 0, "k": 3, "accepted": 1, "rejected": 1, "thrown": 1, "emitted": 2,
                     "draft_tokens": [5, 6, 7], "draft_parents": [-1, -1, 0], "accepted_path": [0],
                     "target_tokens": [5, 42]})
    assert [(t.token_id, t.fate) for t in fates.emitted(row)] == [(5, "accepted"), (42, "correction")]
    assert fates.target_after(row) == {-1: 5, 0: 42}
    assert [t.fate for t in fates.drafts(row)] == ["accepted", "thrown", "rejected"]


LAYOUT = ["node", "parent", "depth", "lane", "fate", "stop", "wanted_token", "target_token"]


def test_tree_layout_places_nodes_by_depth_with_their_fates(tree_db):
    rounds = queries.read(tree_db, queries.run_rounds, "c2-tree-k3").set_index("round")
    shown = {t: f"w{t}" for t in range(1000)}.__getitem__
    # Round 0, drawn by hand:       root ─ 200 ─ 201 ─ 902      (row 0)
    #                                    └ 950                  (row 1)
    # leaves take rows 0 and 1 depth first, 200 and 201 sit at their one child's row, the root between its two.
    first = tree_layout.layout(rounds.loc[0].to_dict(), shown, root_token=7)
    assert rows(first, LAYOUT) == [
        [-1, None, 0, 0.5, "root", False, None, 200],
        [0, -1, 1, 0.0, "accepted", False, 200, 201],
        [1, 0, 2, 0.0, "accepted", True, 201, 202],
        [2, 1, 3, 0.0, "rejected", False, 202, 803],
        [3, -1, 1, 1.0, "thrown", False, 200, 851]]
    assert first["text"].tolist() == ["w7", "w200", "w201", "w902", "w950"]
    assert rows(first, ["parent_depth", "parent_lane"])[1:] == [[0, 0.5], [1, 0.0], [2, 0.0], [0, 0.5]]
    # Round 1: root ─ 903 (row 0) and root ─ 203 ─ 204 ─ 205 (row 1); the path ends at the leaf 205: no rejection,
    # and 903, which the target passed over for 203, is thrown.
    second = tree_layout.layout(rounds.loc[1].to_dict(), shown)
    assert rows(second, ["node", "depth", "lane", "fate", "stop"]) == [
        [-1, 0, 0.5, "root", False], [0, 1, 0.0, "thrown", False], [1, 1, 1.0, "accepted", False],
        [2, 2, 1.0, "accepted", False], [3, 3, 1.0, "accepted", True]]
    assert second["text"].iloc[0] == "root"  # no root token given
    # Round 2: the path stopped at the root: 907, its only child, refused; 907's children thrown.
    third = tree_layout.layout(rounds.loc[2].to_dict(), shown)
    assert rows(third, ["node", "depth", "lane", "fate", "stop"]) == [
        [-1, 0, 0.5, "root", True], [0, 1, 0.5, "rejected", False], [1, 2, 0.0, "thrown", False],
        [2, 2, 1.0, "thrown", False]]
    with pytest.raises(ValueError, match="chain"):
        tree_layout.layout(rounds.loc[4].to_dict(), shown)


def test_tree_chart_draws_edges_nodes_the_stop_and_labels(tree_db):
    rounds = queries.read(tree_db, queries.run_rounds, "c2-tree-k3").set_index("round")
    spec = charts.tree_round(tree_layout.layout(rounds.loc[0].to_dict(), str)).to_dict()
    assert [layer["mark"]["type"] for layer in spec["layer"]] == ["rule", "circle", "point", "text"]
    assert spec["layer"][1]["encoding"]["x"]["title"] == "depth (level of the tree)"
    assert spec["layer"][2]["transform"] == [{"filter": "datum.stop"}]
    data = pd.DataFrame(spec["datasets"][spec["data"]["name"]])
    assert data.set_index("node")["fate"].to_dict() == {
        -1: "root", 0: "accepted", 1: "accepted", 2: "rejected", 3: "thrown"}


def test_no_chart_colour_is_reused_and_legend_labels_are_not_cut():
    assert charts.palette(3) == list(charts.TABLEAU10[:3])
    assert len(set(charts.palette(10))) == 10 and len(set(charts.palette(16))) == 16  # past ten: all new hues
    series = [f"eagle:heads/smollm2-135m-{i} · greedy" for i in range(16)]
    color = charts.colour(pd.DataFrame({"series": series}), "series").to_dict()
    assert color["scale"]["domain"] == sorted(series)
    assert len(set(color["scale"]["range"])) == 16
    assert color["legend"]["labelLimit"] >= 8 * len(series[0])  # ~7 px a character at the legend's font size


@pytest.mark.parametrize("count", [charts.MANY_SERIES, charts.MANY_SERIES + 1])
def test_many_series_get_a_panel_each_coloured_by_category(count):
    series = [f"draft{i} · greedy" for i in range(count)]
    frame = pd.DataFrame([{"series": s, "category": c, "k": 1, "source": "measured", "tokens_per_s": 1.0}
                          for s in series for c in ("code", "poem")])
    spec = charts.k_advisor(frame).to_dict()
    color = spec["spec"]["layer"][0]["encoding"]["color"]
    if count <= charts.MANY_SERIES:  # a panel per category, a colour per series
        assert spec["facet"]["field"] == "category" and color["scale"]["domain"] == series
    else:
        assert spec["facet"]["field"] == "series" and color["scale"]["domain"] == ["code", "poem"]


def test_per_position_rates_show_how_many_rounds_each_rests_on():
    frame = pd.DataFrame({"series": ["a", "a"], "category": ["code", "code"], "position": [1, 6], "reached": [40, 3],
                          "accepted": [20, 1], "rate": [0.5, 1 / 3]})
    points = charts.position_rates(frame).to_dict()["layer"][1]["encoding"]
    assert points["size"]["field"] == "reached"
    assert points["opacity"]["condition"]["test"] == f"datum.reached >= {charts.FEW_ROUNDS}"
    assert (points["opacity"]["condition"]["value"], points["opacity"]["value"]) == (1.0, 0.25)


def test_the_position_series_drawn_first_are_lines_with_the_most_rounds():
    # s0..s6 judged at positions 1 and 2, s7 at position 1 alone (a lone dot, however many rounds); reached at d1
    # grows with the index.
    frame = pd.DataFrame([{"series": f"s{i}", "position": position, "reached": 10 * (i + 1) // position}
                          for i in range(8) for position in ((1,) if i == 7 else (1, 2))])
    assert frames.default_series(frame, "position", 6, by="reached") == ["s6", "s5", "s4", "s3", "s2", "s1"]


def test_lossless_in_words_gives_the_share_equal_then_each_class_of_mismatch():
    counts = {"checked": 9, "real_divergences": 1, "numeric_ties": 2, "unjudged": 0}
    assert words.lossless(counts) == "67% (1 real divergence, 2 numeric ties)"  # 6 of 9 equal
    assert words.lossless(counts | {"real_divergences": 0, "numeric_ties": 0}) == "100%"
    assert words.lossless(counts | {"numeric_ties": 0, "unjudged": 3}) == "56% (1 real divergence, 3 unjudged)"
    assert words.lossless({"checked": 0, "real_divergences": 0, "numeric_ties": 0, "unjudged": 0}) == \
        "n/a (sampling)"


def test_run_choices_are_the_newest_runs_and_those_asked_for(db):
    every = queries.read(db, queries.run_choices, 100)
    assert len(every) == 13 and every["run_id"].iloc[0] == "c1-ls-k8"  # the failed run was recorded last
    assert every["started_at"].is_monotonic_decreasing
    newest = queries.read(db, queries.run_choices, 2)
    assert newest["run_id"].tolist() == every["run_id"].tolist()[:2]
    # an older run asked for by the URL is offered too, in its place; one that does not exist is not
    asked = queries.read(db, queries.run_choices, 2, ("code-01-base", "nowhere", every["run_id"].iloc[1]))
    assert asked["run_id"].tolist() == [*every["run_id"].tolist()[:2], "code-01-base"]



def test_lossless_by_setup_on_runs_alone_equals_it_on_run_stats(db):
    # It reads the 'ok' runs directly: run_stats holds exactly those runs, with the same columns.
    keys = ", ".join(comparable.SETUP)
    plain = f"""SELECT * REPLACE (coalesce(kernels, 'not recorded') AS kernels, coalesce(threads, 0) AS threads)
        FROM (SELECT {keys}, draft, count(*) AS runs, {", ".join(f"{count} AS {name}"
                                                               for name, count in metrics.LOSSLESS.items())}
            FROM run_stats WHERE draft <> 'none' GROUP BY ALL) ORDER BY ALL"""
    fast = queries.read(db, comparable.lossless_by_setup, Filters())
    assert len(fast) > 0
    pd.testing.assert_frame_equal(fast, queries.read(db, lambda con: con.execute(plain).df()), check_exact=True)
