"""Per-position acceptance (`position_stats`) and the k advisor on hand-made rounds, every value worked by hand.

The runs (target t, cpu, skinny kernels, 2 threads, greedy, code), as (k, accepted, verify_s) per round, every
drafted token taking 2 ms and the loop's own time given per run:

- base (plain): 4 rounds of width 0 at 10 ms, no loop time: 4 tokens in 40 ms, 100 tokens/s;
- k1 (layerskip:2, k=1, fixed): (1, 1, 12 ms), (1, 0, 12 ms), loop 2 ms: 3 tokens in 4 + 24 + 2 = 30 ms: 100/s;
- k2 (layerskip:2, k=2, fixed): (2, 2, 14 ms), (2, 1, 14 ms), (1, 1, 12 ms) (the budget cut the last round),
  loop 3 ms: 7 tokens in 10 + 40 + 3 = 53 ms: 132.08/s;
- h (layerskip:2, k=1, heuristic:4): (1, 1, 12 ms), (3, 3, 16 ms), loop 2 ms: 6 tokens in 8 + 28 + 2 = 38 ms: 157.9/s;
- ng (ngram, k=3, fixed): (3, 2), (0, 0) (no match), (3, 3); and a failed run, which counts nowhere;
- tree (ngram-tree, k=3): two rounds of the 4-node tree a-b-c, d (parents -1, 0, 1, -1: depth 3): one accepts d, a
  leaf (the bonus), one accepts a and then refuses b.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from dashboard import queries
from runner.records import Generation, Round, RunRecord
from runner.store import advisor, run_facts
from runner.store.metrics import Filters
from runner.store.runs import write_run

DRAFT_TOKEN_S = 0.002


def rounds(spec: list[tuple[int, int, float]]) -> tuple[Round, ...]:
    return tuple(Round(k, a, int(a < k), k - a - int(a < k), k > 0 and a == k, a + 1, DRAFT_TOKEN_S * k, verify_s,
                       tuple(range(k)), tuple(range(k + 1))) for k, a, verify_s in spec)


TREE = (-1, 0, 1, -1)
TREE_ROUNDS = (Round(4, 1, 0, 3, True, 2, 0.008, 0.016, (5, 6, 7, 8), (8, 9), TREE, (3,)),
               Round(4, 1, 1, 2, False, 2, 0.008, 0.016, (5, 6, 7, 8), (5, 1), TREE, (0,)))


def run(run_id: str, draft: str, k: int | None, policy: str | None, spec: list | tuple[Round, ...],
        loop_s: float, status: str = "ok", category: str = "code",
        baseline: str = "base") -> RunRecord:
    made = spec if spec and isinstance(spec[0], Round) else rounds(spec)
    prefill = 0.1
    wall = prefill + sum(r.draft_s + r.verify_s for r in made) + loop_s
    gen = Generation((1, 2, 3), tuple(range(1 + sum(r.emitted for r in made))), made, prefill, wall,
                     sum(r.k > 0 for r in made), "max_new_tokens")
    kind = "baseline" if draft == "none" else draft.split(":")[0]
    return RunRecord(run_id, "s1", "2026-01-01T12:00:00", "t", draft, kind, category, "p1", "x", k, "greedy", 0.0,
                     1.0, 0, 64, "cpu", "float32", status, None, gen if status == "ok" else None, "x",
                     None if draft == "none" else baseline, None, kernels="skinny", threads=2, k_policy=policy)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("positions") / "runs.duckdb"
    for record in (
        run("base", "none", None, None, [(0, 0, 0.010)] * 4, 0.0),
        run("k1", "layerskip:2", 1, "fixed", [(1, 1, 0.012), (1, 0, 0.012)], 0.002),
        run("k2", "layerskip:2", 2, "fixed", [(2, 2, 0.014), (2, 1, 0.014), (1, 1, 0.012)], 0.003),
        run("h", "layerskip:2", 1, "heuristic:4", [(1, 1, 0.012), (3, 3, 0.016)], 0.002),
        run("ng", "ngram", 3, "fixed", [(3, 2, 0.016), (0, 0, 0.010), (3, 3, 0.016)], 0.0),
        run("bad", "ngram", 3, "fixed", [(3, 3, 0.016)], 0.0, status="error"),
        run("tree", "ngram-tree", 3, "fixed", TREE_ROUNDS, 0.0),
    ):
        write_run(path, record)
    return path


def test_position_stats_by_hand(db):
    with duckdb.connect(str(db), read_only=True) as con:
        got = con.execute("""SELECT draft, k, k_policy, position, proposed, reached, accepted, rejected, rate
            FROM position_stats ORDER BY ALL""").fetchall()
    assert got == [
        # k1: (1, 1) and (1, 0): both drafted and reached position 1, one accepted it
        ("layerskip:2", 1, "fixed", 1, 2, 2, 1, 1, 0.5),
        # h: (1, 1) and (3, 3): position 1 twice, accepted twice; positions 2 and 3 only in the 3-draft round
        ("layerskip:2", 1, "heuristic:4", 1, 2, 2, 2, 0, 1.0),
        ("layerskip:2", 1, "heuristic:4", 2, 1, 1, 1, 0, 1.0),
        ("layerskip:2", 1, "heuristic:4", 3, 1, 1, 1, 0, 1.0),
        # k2: (2, 2), (2, 1), (1, 1): position 1 drafted 3 times, all accepted; position 2 drafted by the two
        # 2-draft rounds, reached by both (each accepted d1), accepted by (2, 2) only
        ("layerskip:2", 2, "fixed", 1, 3, 3, 3, 0, 1.0),
        ("layerskip:2", 2, "fixed", 2, 2, 2, 1, 1, 0.5),
        # ng: (3, 2) and (3, 3) (the round with no match drafted nothing); the failed run is left out.
        # Position 3: reached by both (2 and 3 accepted before it), accepted by (3, 3)
        ("ngram", 3, "fixed", 1, 2, 2, 2, 0, 1.0),
        ("ngram", 3, "fixed", 2, 2, 2, 2, 0, 1.0),
        ("ngram", 3, "fixed", 3, 2, 2, 1, 1, 0.5),
        # tree: levels 1..3 (its depth, not its 4 nodes) proposed twice; level 1 reached and accepted by both; level
        # 2 reached only below a (d is a leaf), and refused there; level 3 never reached
        ("ngram-tree", 3, "fixed", 1, 2, 2, 2, 0, 1.0),
        ("ngram-tree", 3, "fixed", 2, 2, 1, 0, 1, 0.0),
        ("ngram-tree", 3, "fixed", 3, 2, 0, 0, 0, None),
    ]


def formula(alpha: float, k: int, c: float) -> float:
    """Leviathan et al., written out again so the test does not trust the macro under test."""
    return (1 - alpha ** (k + 1)) / ((1 - alpha) * (1 + k * c))


def test_the_advisor_predicts_from_positions_and_the_verify_curve(db):
    with duckdb.connect(str(db), read_only=True) as con:
        curve = advisor.k_curve(con, Filters(draft=("layerskip:2",)))
    # Fixed runs only: s1 = 4 of 5 rounds (k1's 2 + k2's 3) accepted ≥ 1; s2 = 1 of k2's 3 rounds accepted 2;
    # w1 = 5/5, w2 = 2/3 drafted a second token. Verify curve: v(0) = 10 ms (the baseline), v(1) = 12, v(2) = 14
    # (v(3) = 16 from h, beyond the largest fixed k). Drafting 14 ms / 7 tokens = 2 ms; loop 5 ms / 5 rounds = 1 ms.
    k1 = 1.8 / (0.002 + 0.010 + 0.002 + 0.001)  # 1 + s1 tokens; d·w1 + v(0) + w1·(v1 − v0) + l = 15 ms: 120/s
    drafted = 1 + 2 / 3
    k2 = (1 + 0.8 + 1 / 3) / (0.002 * drafted + 0.010 + 0.002 + 2 / 3 * 0.002 + 0.001)  # 2.133 in 17.67 ms
    assert curve["k"].tolist() == [1, 2]
    assert curve["predicted_tokens_per_s"].tolist() == pytest.approx([k1, k2])
    assert curve["measured_tokens_per_s"].tolist() == pytest.approx([3 / 0.030, 7 / 0.053])
    assert curve["error"].tolist() == pytest.approx([k1 / 100 - 1, k2 / (7 / 0.053) - 1])
    assert curve["baseline_tokens_per_s"].tolist() == pytest.approx([100, 100])
    # the flat formula: α = 5 accepted / 7 judged over the fixed runs, c = 2 ms / 10 ms
    assert curve["formula_tokens_per_s"].tolist() == pytest.approx([100 * formula(5 / 7, k, 0.2) for k in (1, 2)])
    assert curve["threads"].tolist() == [2, 2]


def test_the_advice_and_its_recommendation(db):
    with duckdb.connect(str(db), read_only=True) as con:
        advice = advisor.k_advice(con, Filters(draft=("layerskip:2",))).iloc[0]
    # predicted 120.75/s at k=2 over 120/s at k=1; measured 132.1/s at k=2 over 100/s: a hit
    assert (advice.predicted_best_k, advice.predicted_recorded_k, advice.measured_best_k) == (2, 2, 2)
    assert advice.hit
    k1, k2 = 1.8 / 0.015, (1 + 0.8 + 1 / 3) / (0.002 * 5 / 3 + 0.012 + 2 / 3 * 0.002 + 0.001)
    assert advice.advisor_error == pytest.approx((abs(k1 / 100 - 1) + abs(k2 / (7 / 0.053) - 1)) / 2)
    # the heuristic run (157.9/s) beat every fixed k: it is the recommendation
    assert (advice.adaptive_policy, advice.adaptive_k) == ("heuristic:4", 1)
    assert advice.adaptive_best == pytest.approx(6 / 0.038)
    assert (advice.recommended_policy, advice.recommended_k) == ("heuristic:4", 1)


def test_a_prediction_at_a_k_never_recorded_is_not_judged(db):
    with duckdb.connect(str(db), read_only=True) as con:
        advice = advisor.k_advice(con, Filters(draft=("layerskip:2",), k=(2,))).iloc[0]
    # From k2 alone: s1 = 3/3, s2 = 1/3, w1 = 1, w2 = 2/3, drafting 2 ms a token, loop 1 ms a round, v = 10/12/14 ms.
    # k=1: 2 tokens in 2 + 10 + 2 + 1 = 15 ms, 133.3/s; k=2: 7/3 tokens in 10/3 + 10 + 2 + 4/3 + 1 = 17.67 ms, 132.1/s
    assert (advice.predicted_best_k, advice.predicted_recorded_k, advice.measured_best_k) == (1, 2, 2)
    assert advice.measured_best == pytest.approx(7 / 0.053)
    assert pd.isna(advice.measured_at_predicted) and pd.isna(advice.hit)  # no run at k=1: nothing to judge


def test_a_tree_is_predicted_at_the_width_of_its_nodes(db):
    with duckdb.connect(str(db), read_only=True) as con:
        curve = advisor.k_curve(con, Filters(draft=("ngram-tree",)))
    # The tree's two rounds drafted 4 nodes over 3 levels: its verify pass is 4 drafts wide, v(4) = 16 ms (its own
    # rounds; the baseline gives v(0) = 10 ms), not the chain's v(0) + Σ w_i·step_i over 3 levels (14.5 ms on the
    # line from 10 to 16 ms). Levels accepted: s1 = 2/2, s2 = s3 = 0: 2 tokens a round. Drafting 8 ms a round as
    # measured (a tree's cost is not per level), no loop time: 2 / 24 ms = 83.3/s, the run's own 4 tokens in 48 ms.
    # Predicted only at the depth recorded: how many nodes another depth would draft was never measured.
    assert curve["k"].tolist() == [3]
    assert curve["emitted"].tolist() == [2.0]
    assert curve["drafted"].tolist() == [4.0]
    assert curve["predicted_tokens_per_s"].tolist() == pytest.approx([2 / 0.024])
    assert curve["measured_tokens_per_s"].tolist() == pytest.approx([4 / 0.048])


def test_a_tree_is_verified_at_the_curve_over_its_passes_widths(tmp_path):
    # Three rounds of 4, 2 and 3 nodes (a-b-c, d; a, d; a-b, d) verified in 16, 12 and 18 ms, each accepting one
    # level: 2 tokens a round, 6 ms drafting a round on average. The curve over the widths its passes had is
    # (16 + 12 + 18) / 3 = 15.33 ms: 2 / 21.33 ms = 93.75/s, the run's own 6 tokens in 64 ms. The curve at its mean
    # width (3 nodes: the 18 ms pass) would say 2 / 24 ms = 83.3/s: a pass's cost is not linear in its width.
    rounds_ = (TREE_ROUNDS[0],
               Round(2, 1, 0, 1, True, 2, 0.004, 0.012, (5, 8), (8, 9), (-1, -1), (1,)),
               Round(3, 1, 1, 1, False, 2, 0.006, 0.018, (5, 6, 8), (5, 1), (-1, 0, -1), (0,)))
    path = tmp_path / "runs.duckdb"
    write_run(path, run("base", "none", None, None, [(0, 0, 0.010)] * 4, 0.0))
    write_run(path, run("tree", "ngram-tree", 3, "fixed", rounds_, 0.0))
    with duckdb.connect(str(path), read_only=True) as con:
        curve = advisor.k_curve(con, Filters(draft=("ngram-tree",)))
    assert curve["drafted"].tolist() == [3.0]
    assert curve["predicted_tokens_per_s"].tolist() == pytest.approx([2 / (0.006 + 0.046 / 3)])
    assert curve["measured_tokens_per_s"].tolist() == pytest.approx([6 / 0.064])


def test_each_category_reads_its_own_verify_curve(tmp_path):
    # The same rounds on code and on summaries, whose long passages make every pass twice as dear: v(0) = 10 / 20 ms,
    # v(1) = 12 / 24 ms. s1 = 1/2, w1 = 1, 2 ms drafting a token, 1 ms loop a round: code 1.5 / 15 ms = 100/s,
    # summaries 1.5 / 27 ms = 55.6/s (one curve pooled over both, 15 and 18 ms, would say 71.4/s for both).
    path = tmp_path / "runs.duckdb"
    for category, scale in (("code", 1), ("summary", 2)):
        write_run(path, run(f"base-{category}", "none", None, None, [(0, 0, 0.010 * scale)] * 4, 0.0,
                            category=category))
        write_run(path, run(f"k1-{category}", "layerskip:2", 1, "fixed", [(1, 1, 0.012 * scale), (1, 0, 0.012 * scale)],
                            0.002, category=category, baseline=f"base-{category}"))
    with duckdb.connect(str(path), read_only=True) as con:
        curve = advisor.k_curve(con, Filters(draft=("layerskip:2",)))
    assert curve["category"].tolist() == ["code", "summary"]
    assert curve["predicted_tokens_per_s"].tolist() == pytest.approx([1.5 / 0.015, 1.5 / 0.027])


def lookahead_file(path: Path) -> Path:
    """base and k1 as in the module's file, and lookahead at k = 1 whose passes also carry 3 window rows: two rounds of
    one draft (accepted, then refused), 5 rows a pass (width 4) in 20 ms, 2 ms drafting and 1 ms loop a round."""
    write_run(path, run("base", "none", None, None, [(0, 0, 0.010)] * 4, 0.0))
    write_run(path, run("k1", "layerskip:2", 1, "fixed", [(1, 1, 0.012), (1, 0, 0.012)], 0.002))
    window = tuple(replace(r, extra_rows=3) for r in rounds([(1, 1, 0.020), (1, 0, 0.020)]))
    write_run(path, run("la", "lookahead", 1, "fixed", window, 0.002))
    return path


def test_lookahead_is_verified_at_its_passes_rows(tmp_path):
    # Layer skip reads its passes and plain decoding's: v(0) = 10, v(1) = 12 ms: 1.5 / 15 ms = 100/s. lookahead's
    # passes are 4 wide, not its 1 draft (5 rows at 20 ms): 1.5 tokens in 2 + 20 + 1 ms = 65.2/s, as its own 3 in
    # 46 ms. The Overview's verify chart draws the passes by their widths: 0, 1 and 4 (10, 12, 20 ms).
    with duckdb.connect(str(lookahead_file(tmp_path / "runs.duckdb")), read_only=True) as con:
        curve = advisor.k_curve(con, Filters())
        growth = queries.verify_growth(con, Filters())
    assert curve["draft"].tolist() == ["layerskip:2", "lookahead"]
    assert curve["predicted_tokens_per_s"].tolist() == pytest.approx([1.5 / 0.015, 1.5 / 0.023])
    assert curve["measured_tokens_per_s"].tolist() == pytest.approx([3 / 0.030, 3 / 0.046])
    assert growth["k"].tolist() == [0, 1, 4]
    assert growth["relative"].tolist() == pytest.approx([1.0, 1.2, 2.0])


def test_lookahead_recorded_before_pass_rows_is_neither_predicted_nor_read_into_the_curve(tmp_path):
    # Its rounds from before kept no rows (`add_pass_rows` leaves them NULL): whatever its passes carried is unknown.
    path = lookahead_file(tmp_path / "runs.duckdb")
    with duckdb.connect(str(path)) as con:
        for table in ("rounds", "round_counts"):
            con.execute(f"UPDATE {table} SET pass_rows = NULL WHERE run_id = 'la'")
        run_facts.refresh_all(con)
        curve = advisor.k_curve(con, Filters())
        growth = queries.verify_growth(con, Filters())
    assert curve["draft"].tolist() == ["layerskip:2"]
    assert curve["predicted_tokens_per_s"].tolist() == pytest.approx([1.5 / 0.015])
    assert growth["k"].tolist() == [0, 1]
    assert growth["relative"].tolist() == pytest.approx([1.0, 1.2])


def two_drafts_file(path: Path) -> Path:
    """Plain decoding at 10 ms a pass; prompt lookup at k = 1 and k = 2, each run with one round that found no match
    (one token, a one-row pass at 10 ms); layer skip at k = 1, whose 2-row passes take 20 ms where prompt lookup's
    take 12 (2 ms drafting a token; loops: 1 ms, 4 ms and none)."""
    write_run(path, run("base", "none", None, None, [(0, 0, 0.010)] * 4, 0.0))
    write_run(path, run("n1", "ngram", 1, "fixed", [(1, 1, 0.012), (0, 0, 0.010), (1, 0, 0.012)], 0.001))
    write_run(path, run("n2", "ngram", 2, "fixed", [(2, 2, 0.014), (0, 0, 0.010)], 0.004))
    write_run(path, run("ls", "layerskip:2", 1, "fixed", [(1, 1, 0.020), (1, 1, 0.020)], 0.0))
    return path


def test_rounds_that_draft_nothing_are_a_share_of_the_tokens_at_every_k(tmp_path):
    # Prompt lookup's unmatched text takes a round a token whatever k is, so such rounds are a share of the tokens,
    # f = 2 idle rounds / 8 tokens (n1: 3 rounds + 1 accepted, n2: 2 + 2) = 1/4, and the shares by position are the
    # drafting rounds': position 1 drafted by 3 (n1's 2, n2's 1), accepted by 2: s1 = 2/3, w1 = 1; position 2 by n2's
    # one round, accepted: s2 = w2 = 1. At k a drafting round emits E = 1 + Σ s_i tokens, so (1 − f) / E drafting
    # rounds a token against f idle ones: the share that drafts, p = r / (f + r), r = (1 − f) / E.
    # k = 1: E = 5/3, r = 0.45, p = 9/14; emitted 1 + p·2/3 = 10/7; verify v(1) + p·w1·(v(2) − v(1)) over prompt
    # lookup's own passes and plain decoding's (v(1) = 10, v(2) = 12, v(3) = 14 ms; layer skip's 20 ms passes are its
    # own); drafting 2 ms · p; loop 5 ms / 5 rounds = 1 ms.
    # k = 2: E = 8/3, r = 0.28125, p = 9/17; emitted 1 + p·5/3 = 32/17; verify 10 + p·(2 + 2) ms, drafting 2 ms · 2p.
    # (Per round, as shares pooled over all rounds, it was 1 + 2/5 and 1 + 2/5 + 1/2: k = 2's rounds draft less often.)
    with duckdb.connect(str(two_drafts_file(tmp_path / "runs.duckdb")), read_only=True) as con:
        curve = advisor.k_curve(con, Filters(draft=("ngram",)))
    p1, p2 = 9 / 14, 9 / 17
    assert curve["emitted"].tolist() == pytest.approx([10 / 7, 32 / 17])
    assert curve["drafted"].tolist() == pytest.approx([p1, 2 * p2])
    assert curve["predicted_tokens_per_s"].tolist() == pytest.approx([
        (10 / 7) / (0.002 * p1 + 0.010 + p1 * 0.002 + 0.001),
        (32 / 17) / (0.002 * 2 * p2 + 0.010 + p2 * 0.004 + 0.001)])
    assert curve["measured_tokens_per_s"].tolist() == pytest.approx([4 / 0.039, 4 / 0.032])


def test_each_draft_reads_its_own_passes_and_plain_decodings(tmp_path):
    # Layer skip's 2-row passes took 20 ms where prompt lookup's took 12 (a draft's passes can carry more: a head's
    # also hand it the target's features). Layer skip: v(1) = 10 ms (plain decoding), v(2) = 20: 2 tokens in 2 + 20
    # ms = 90.9/s, its own 4 in 44 ms. Pooled with prompt lookup's, v(2) would be 16 ms for both.
    with duckdb.connect(str(two_drafts_file(tmp_path / "runs.duckdb")), read_only=True) as con:
        curve = advisor.k_curve(con, Filters())
    ls = curve[curve["draft"] == "layerskip:2"]
    assert ls["predicted_tokens_per_s"].tolist() == pytest.approx([2 / 0.022])
    assert ls["measured_tokens_per_s"].tolist() == pytest.approx([4 / 0.044])
    ngram = curve[curve["draft"] == "ngram"]
    assert ngram["predicted_tokens_per_s"].iloc[0] == pytest.approx((10 / 7) / (0.002 * 9 / 14 * 2 + 0.010 + 0.001))


def test_a_run_that_never_drafted_counts_its_rounds_as_idle(tmp_path):
    # n1 drafts once and is accepted, then finds nothing; n0 finds nothing twice (no drafting round at all). f = 3 idle
    # rounds / 5 tokens, s1 = 1/1: E = 2, r = (2/5) / 2 = 1/5, p = (1/5) / (3/5 + 1/5) = 1/4: 1.25 tokens a round, the
    # runs' own 5 tokens in 4 rounds (leaving n0 out of f would say f = 1/5 and 1 + 2/3).
    path = tmp_path / "runs.duckdb"
    write_run(path, run("base", "none", None, None, [(0, 0, 0.010)] * 4, 0.0))
    write_run(path, run("n1", "ngram", 1, "fixed", [(1, 1, 0.012), (0, 0, 0.010)], 0.0))
    write_run(path, run("n0", "ngram", 1, "fixed", [(0, 0, 0.010), (0, 0, 0.010)], 0.0))
    with duckdb.connect(str(path), read_only=True) as con:
        curve = advisor.k_curve(con, Filters(draft=("ngram",)))
    assert curve["emitted"].tolist() == pytest.approx([1.25])
