"""The explainer's numbers for one run (runner/stats.py), on hand-made rounds with values worked out by hand."""

from __future__ import annotations

import pytest

from runner.records import Generation, Round
from runner.stats import best_k, summarize, theoretical_speedup


@pytest.mark.parametrize(("alpha", "k", "c", "expected"), [
    (0.5, 2, 0.1, 0.875 / 0.6),  # (1 − 0.5³) / (0.5 · 1.2)
    (0.8, 4, 0.05, (1 - 0.32768) / 0.24),  # 0.8⁵ = 0.32768; (1 − 0.8) · (1 + 0.2)
    (0.0, 4, 0.25, 0.5),  # nothing accepted: one token per round at twice the cost
    (1.0, 3, 0.1, 4 / 1.3),  # everything accepted: k + 1 tokens per round
    (0.9, 1, 0.0, 1.9),  # (1 − 0.81) / 0.1 with free drafts
])
def test_theoretical_speedup_is_leviathans_formula(alpha, k, c, expected):
    assert theoretical_speedup(alpha, k, c) == pytest.approx(expected, rel=1e-12)


def test_best_k_is_the_formulas_argmax():
    # α 0.8, c 0.05: k = 7 gives 0.83222 / 0.27 = 3.0823, k = 8 0.86578 / 0.28 = 3.0921, k = 9 0.89263 / 0.29 = 3.0780
    assert best_k(0.8, 0.05) == 8
    assert best_k(0.8, 0.05, k_max=5) == 5  # still rising at 5
    assert best_k(0.0, 0.1) == 1  # 1 / (1 + k·c) only falls
    assert best_k(1.0, 0.0) == 16  # k + 1 tokens for free: as long as allowed
    assert best_k(0.0, 0.0) == 1  # every k gives 1: the first
    assert best_k(0.5, 0.5, k_max=1) == 1


def rounds(*spec: tuple[int, int, int, int, int, float]) -> tuple[Round, ...]:
    """(k, accepted, rejected, thrown, emitted, draft_s) per round; every verify pass takes 0.1 s."""
    return tuple(Round(k, a, r, t, a == k, e, d, 0.1, (0,) * k, (0,) * (a + 1)) for k, a, r, t, e, d in spec)


def generation(output: tuple[int, ...], rs: tuple[Round, ...], wall_s: float) -> Generation:
    return Generation((1, 2, 3), output, rs, 0.05, wall_s, sum(r.k for r in rs), "max_new_tokens")


# The baseline: the prefill's token, then 8 one-token passes of 0.05 s, 0.9 s in all for 9 tokens.
BASELINE = Generation((1, 2, 3), tuple(range(9)), tuple(
    Round(0, 0, 0, 0, True, 1, 0.0, 0.05, (), (t,)) for t in range(1, 9)), 0.05, 0.9, 0, "max_new_tokens")
# k = 4: all four accepted (5 tokens), one then a rejection (2 tokens), a rejection at once (1 token);
# 5 accepted, 2 rejected, 5 thrown, 12 drafted in 0.06 s; 9 tokens in 0.5 s.
RUN = generation(tuple(range(9)), rounds((4, 4, 0, 0, 5, 0.02), (4, 1, 1, 2, 2, 0.02), (4, 0, 1, 3, 1, 0.02)), 0.5)


def test_summary_of_a_run_by_hand():
    s = summarize(RUN, BASELINE, 4, greedy=True)
    assert (s.rounds, s.accepted, s.rejected, s.thrown) == (3, 5, 2, 5)
    assert s.alpha == pytest.approx(5 / 7)
    assert s.tau == pytest.approx(8 / 3)  # 5 + 2 + 1 tokens over 3 rounds
    assert s.c == pytest.approx((0.06 / 12) / (0.4 / 8))  # 5 ms a draft over 50 ms a one-token pass = 0.1
    assert s.measured_speedup == pytest.approx((0.9 / 9) / (0.5 / 9))  # 1.8
    assert s.predicted_speedup == pytest.approx((1 - (5 / 7) ** 5) / ((2 / 7) * 1.4))  # 2.0352
    assert s.lossless is True


def test_lossless_is_judged_only_in_greedy_mode_and_only_on_equal_outputs():
    other = generation((0, 1, 2, 3, 4, 5, 6, 7, 99), RUN.rounds, 0.5)
    assert summarize(other, BASELINE, 4, greedy=True).lossless is False
    assert summarize(RUN, BASELINE, 4, greedy=False).lossless is None


def test_a_run_with_nothing_judged_has_no_alpha_c_or_prediction():
    # prompt lookup found nothing: two k = 0 rounds of one token each, after the prefill's token
    nothing = generation((0, 1, 2), rounds((0, 0, 0, 0, 1, 0.0), (0, 0, 0, 0, 1, 0.0)), 0.2)
    s = summarize(nothing, BASELINE, 4, greedy=True)
    assert (s.rounds, s.accepted, s.rejected, s.thrown, s.alpha, s.c, s.predicted_speedup) == (2, 0, 0, 0, None, None,
                                                                                                 None)
    assert s.tau == 1.0 and s.measured_speedup == pytest.approx((0.9 / 9) / (0.2 / 3))


def test_a_run_ended_by_its_prefill_has_no_rounds_to_summarise():
    done = generation((2,), (), 0.05)
    s = summarize(done, generation((2,), (), 0.1), 4, greedy=True)
    assert (s.rounds, s.alpha, s.tau, s.c, s.predicted_speedup, s.lossless) == (0, None, None, None, None, True)
    assert s.measured_speedup == pytest.approx(2.0)
    # a baseline without rounds gives no target pass time, so no c, even for a run that drafted
    assert summarize(RUN, generation(tuple(range(9)), (), 0.9), 4, greedy=True).c is None


def test_alpha_with_as_many_rejections_as_acceptances_is_one_half():
    tie = generation((0, 1, 2), rounds((2, 1, 1, 0, 2, 0.01),), 0.3)  # 1 accepted, 1 rejected
    assert summarize(tie, BASELINE, 2, greedy=True).alpha == 0.5
