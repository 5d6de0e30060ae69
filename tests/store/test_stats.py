"""The explainer's numbers for one run, as the run_stats view gives them, on hand-made rounds with values worked
out by hand; and the formula's best k, as the Theory chart takes it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from runner.records import Generation, Round, RunRecord
from runner.store.metrics import Filters, formula_over_k
from runner.store.runs import in_scratch


@pytest.mark.parametrize(("alpha", "k", "c", "expected"), [
    (0.5, 2, 0.1, 0.875 / 0.6),  # (1 − 0.5³) / (0.5 · 1.2)
    (0.8, 4, 0.05, (1 - 0.32768) / 0.24),  # 0.8⁵ = 0.32768; (1 − 0.8) · (1 + 0.2)
    (0.0, 4, 0.25, 0.5),  # nothing accepted: one token per round at twice the cost
    (1.0, 3, 0.1, 4 / 1.3),  # everything accepted: k + 1 tokens per round
    (0.9, 1, 0.0, 1.9),  # (1 − 0.81) / 0.1 with free drafts
])
def test_the_formula_is_leviathans(alpha, k, c, expected):
    value = in_scratch([], lambda con: con.execute("SELECT formula_speedup(?, ?, ?)", [alpha, k, c]).fetchone()[0])
    assert value == pytest.approx(expected, rel=1e-12)


def rounds(*spec: tuple[int, int, int, int, int, float]) -> tuple[Round, ...]:
    """(k, accepted, rejected, thrown, emitted, draft_s) per round; every verify pass takes 0.1 s."""
    return tuple(Round(k, a, r, t, a == k, e, d, 0.1, (0,) * k, (0,) * (a + 1)) for k, a, r, t, e, d in spec)


def generation(output: tuple[int, ...], rs: tuple[Round, ...], wall_s: float) -> Generation:
    return Generation((1, 2, 3), output, rs, 0.05, wall_s, sum(r.k for r in rs), "max_new_tokens")


def record(run_id: str, gen: Generation, k: int | None) -> RunRecord:
    """A run of `gen` (a baseline when k is None); a draft's baseline is 'base'."""
    draft = "none" if k is None else "ngram"
    return RunRecord(
        run_id=run_id, sweep_id="s", started_at="2025-03-01T12:00:00+00:00", target="t", draft=draft,
        draft_kind="baseline" if k is None else "ngram", category="code", prompt_id="p", prompt_text="x", k=k,
        mode="greedy", temperature=0.0, top_p=1.0, seed=0, max_new_tokens=9, device="cpu", dtype="float32",
        status="ok", error=None, generation=gen, output_text="x", baseline_run_id=None if k is None else "base",
        lossless=None if k is None else True, kernels="skinny", threads=1, provenance={})


# The baseline: the prefill's token, then 8 one-token passes of 0.05 s, 0.9 s in all for 9 tokens.
BASELINE = Generation((1, 2, 3), tuple(range(9)), tuple(
    Round(0, 0, 0, 0, True, 1, 0.0, 0.05, (), (t,)) for t in range(1, 9)), 0.05, 0.9, 0, "max_new_tokens")
# k = 4: all four accepted (5 tokens), one then a rejection (2 tokens), a rejection at once (1 token);
# 5 accepted, 2 rejected, 5 thrown, 12 drafted in 0.06 s; 9 tokens in 0.5 s.
RUN = generation(tuple(range(9)), rounds((4, 4, 0, 0, 5, 0.02), (4, 1, 1, 2, 2, 0.02), (4, 0, 1, 3, 1, 0.02)), 0.5)


def stats(gen: Generation, k: int, baseline: Generation = BASELINE) -> SimpleNamespace:
    """The run's row of run_stats, NULL as None."""
    def row(con):
        cursor = con.execute("SELECT * FROM run_stats WHERE run_id = 'run'")
        return SimpleNamespace(**dict(zip([d[0] for d in cursor.description], cursor.fetchone(), strict=True)))

    return in_scratch([record("base", baseline, None), record("run", gen, k)], row)


def test_a_run_by_hand():
    s = stats(RUN, 4)
    assert (s.n_rounds, s.accepted, s.rejected, s.thrown, s.drafted) == (3, 5, 2, 5, 12)
    assert s.alpha == pytest.approx(5 / 7)
    assert s.tau == pytest.approx(8 / 3)  # 5 + 2 + 1 tokens over 3 rounds
    assert s.thrown_share == pytest.approx(5 / 12)
    assert s.c == pytest.approx((0.06 / 12) / (0.4 / 8))  # 5 ms a draft over 50 ms a one-token pass = 0.1
    assert s.measured_speedup == pytest.approx((0.9 / 9) / (0.5 / 9))  # 1.8
    assert s.theoretical_speedup == pytest.approx((1 - (5 / 7) ** 5) / ((2 / 7) * 1.4))  # 2.0352


def test_a_run_with_nothing_judged_has_no_alpha_c_or_prediction():
    # prompt lookup found nothing: two k = 0 rounds of one token each, after the prefill's token
    s = stats(generation((0, 1, 2), rounds((0, 0, 0, 0, 1, 0.0), (0, 0, 0, 0, 1, 0.0)), 0.2), 4)
    assert (s.n_rounds, s.accepted, s.rejected, s.thrown) == (2, 0, 0, 0)
    assert s.alpha is None and s.c is None and s.theoretical_speedup is None
    assert s.tau == 1.0 and s.measured_speedup == pytest.approx((0.9 / 9) / (0.2 / 3))


def test_a_baseline_without_rounds_gives_no_target_pass_time_so_no_c():
    s = stats(RUN, 4, baseline=generation(tuple(range(9)), (), 0.9))
    assert s.c is None and s.alpha == pytest.approx(5 / 7)


def test_alpha_with_as_many_rejections_as_acceptances_is_one_half():
    assert stats(generation((0, 1, 2), rounds((2, 1, 1, 0, 2, 0.01),), 0.3), 2).alpha == 0.5


@pytest.mark.parametrize(("alpha", "c", "best"), [
    # α 0.8, c 0.05: k = 7 gives 0.83222 / 0.27 = 3.0823, k = 8 0.86578 / 0.28 = 3.0921, k = 9 0.89263 / 0.29 = 3.0780
    (0.8, 0.05, 8),
    (0.0, 0.1, 1),  # 1 / (1 + k·c) only falls
    (0.5, 0.5, 1),  # (1 − 0.25) / (0.5 · 1.5) = 1.0 at k = 1, 0.875 / 1.0 at k = 2
])
def test_the_formulas_best_k_is_its_argmax(alpha, c, best):
    # One round of k = 10: `accepted` drafts then one rejected give α = accepted / (accepted + 1); 10 drafts in
    # c · 0.5 s cost c · 0.05 s each, against the baseline's 0.05 s a pass.
    accepted = round(alpha / (1 - alpha))
    run = generation(tuple(range(9)), rounds((10, accepted, 1, 9 - accepted, accepted + 1, c * 0.5)), 0.5)
    curve = in_scratch([record("base", BASELINE, None), record("run", run, 10)],
                       lambda con: formula_over_k(con, Filters()))
    assert curve.alpha.iloc[0] == pytest.approx(alpha) and curve.c.iloc[0] == pytest.approx(c)
    assert curve[curve.best].k.tolist() == [best]
