"""Speculative sampling reproduces the target's distribution; temperature, top-p and the residual rule."""

from __future__ import annotations

import re

import pytest
import torch

from runner.engine.drafters.model import ModelDrafter
from runner.engine.round.decode import generate
from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.sampling import accept_greedy, accept_sampled, probabilities, residual
from runner.engine.weights.models import Loaded
from tests.helpers.laws import pooled_chisquare, samples_p_value, two_token_law
from tests.helpers.tiny import tiny_llama


@pytest.mark.parametrize(("mode", "temperature", "top_p", "message"), [
    ("beam", 1.0, 1.0, 'unknown mode "beam"; use greedy or sample'),
    ("sample", -0.5, 1.0, "temperature must be >= 0, got -0.5"),
    ("sample", 0.0, 1.0, "temperature 0 means greedy: use --mode greedy"),
    ("sample", 1.0, 0.0, "top-p must be in (0, 1], got 0.0"),
    ("sample", 1.0, 1.01, "top-p must be in (0, 1], got 1.01"),
])
def test_a_decoding_rule_that_means_nothing_is_refused(mode, temperature, top_p, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        Decoding(mode, temperature, top_p)


def test_the_edges_of_the_decoding_rules_are_allowed():
    assert Decoding("greedy", 0.0, 1.0).greedy and not Decoding("sample", 1e-6, 1e-6).greedy


def test_temperature_divides_the_logits():
    logits = torch.tensor([0.5, 0.3, 0.2]).log()
    probs = probabilities(logits, Decoding("sample", 0.5, 1.0))
    torch.testing.assert_close(probs, torch.tensor([0.25, 0.09, 0.04]) / 0.38)


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.tensor([0.05, 0.5, 0.15, 0.3]).log()
    probs = probabilities(logits, Decoding("sample", 1.0, 0.75))
    torch.testing.assert_close(probs, torch.tensor([0.0, 0.625, 0.0, 0.375]))
    # the most likely token alone when it already reaches p
    assert probabilities(logits, Decoding("sample", 1.0, 0.4)).tolist() == [0.0, 1.0, 0.0, 0.0]


def test_rows_of_a_batch_are_each_their_own_distribution():
    # a verify pass gives k + 1 rows at once; each is cut and renormalised alone
    logits = torch.tensor([[0.05, 0.5, 0.15, 0.3], [0.4, 0.3, 0.2, 0.1]]).log()
    batch = probabilities(logits, Decoding("sample", 1.0, 0.75))
    for row, one in zip(batch, logits, strict=True):
        torch.testing.assert_close(row, probabilities(one, Decoding("sample", 1.0, 0.75)))
    torch.testing.assert_close(batch[1], torch.tensor([4 / 9, 3 / 9, 2 / 9, 0.0]))


def test_speculative_sampling_draws_from_its_generator_alone():
    """The seed recorded with a run reproduces it: nothing comes from torch's global random state."""
    def outcomes(global_seed: int) -> list[tuple[int, int]]:
        torch.manual_seed(global_seed)
        gen = torch.Generator().manual_seed(5)
        return [[t.tolist() for t in accept_sampled(torch.tensor([1, 3]), q, P, gen)] for q in (Q, None)
                for _ in range(50)]

    assert outcomes(0) == outcomes(1)


def test_top_p_stops_once_the_kept_mass_reaches_p_exactly():
    # 0.5 + 0.25 is exactly 0.75 (binary fractions): the third token is not needed
    probs = probabilities(torch.tensor([2.0, 1.0, 1.0]).log(), Decoding("sample", 1.0, 0.75))
    torch.testing.assert_close(probs, torch.tensor([2 / 3, 1 / 3, 0.0]))


def test_top_p_of_one_keeps_every_token_however_unlikely():
    # p = (1 − 2.1e-9, 2.1e-9): in float32 the mass before the second token already rounds to 1
    probs = probabilities(torch.tensor([0.0, -20.0]), Decoding("sample", 1.0, 1.0))
    assert probs[1] > 0 and probs[1].item() == pytest.approx(2.06e-9, rel=0.01)


def test_residual_is_the_normalised_positive_part_of_p_minus_q():
    p, q = torch.tensor([0.5, 0.3, 0.2, 0.0]), torch.tensor([0.2, 0.6, 0.1, 0.1])
    torch.testing.assert_close(residual(p, q), torch.tensor([0.75, 0.0, 0.25, 0.0]))
    # a deterministic draft (prompt lookup) is a point mass: the residual is p without it
    torch.testing.assert_close(residual(p, torch.tensor([1.0, 0, 0, 0])), torch.tensor([0.0, 0.6, 0.4, 0.0]))


def test_a_residual_with_nothing_left_falls_back_to_p():
    # p == q: nothing is left of p − q, and a rejection was (almost) impossible; p itself is the answer
    p = torch.tensor([0.5, 0.3, 0.2])
    assert residual(p, p.clone()).tolist() == p.tolist()
    # a point mass (prompt lookup's q) on the only token p allows: nothing is left either
    assert residual(torch.tensor([0.0, 1.0, 0.0]), torch.tensor([0.0, 1.0, 0.0])).tolist() == [0.0, 1.0, 0.0]


def test_greedy_acceptance_counts_leading_matches():
    assert accept_greedy([5, 6, 7], [5, 6, 9, 1]) == 2
    assert accept_greedy([5, 6, 7], [5, 6, 7, 1]) == 3
    assert accept_greedy([], [4]) == 0


P = torch.tensor([[0.5, 0.25, 0.15, 0.1], [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]])
Q = torch.tensor([[0.1, 0.6, 0.2, 0.1], [0.4, 0.3, 0.2, 0.1]])


def _sample_rounds(q: torch.Tensor | None, n: int) -> tuple[list[int], list[int]]:
    """Many one-round draws from hand-built p and q: the first emitted token, and the second when
    the first draft was accepted."""
    gen = torch.Generator().manual_seed(1234)
    first, second = [], []
    for _ in range(n):
        drafts = torch.multinomial(Q, 1, generator=gen).view(-1) if q is not None else torch.tensor([1, 3])
        accepted, token = (int(t) for t in accept_sampled(drafts, q, P, gen)[:2])
        emitted = drafts[:accepted].tolist() + [token]
        first.append(emitted[0])
        if accepted >= 1:
            second.append(emitted[1])
    return first, second


@pytest.mark.parametrize("q", [Q, None], ids=["draft-model", "point-mass-draft"])
def test_speculative_sampling_reproduces_the_targets_distribution(q):
    first, second = _sample_rounds(q, 20_000)
    assert samples_p_value(first, P[0]) > 1e-3
    assert samples_p_value(second, P[1]) > 1e-3
    # The test has power: the draft's own distribution is rejected outright.
    assert samples_p_value(first, Q[0]) < 1e-12


def test_end_to_end_sampling_matches_the_targets_joint_distribution():
    """A tiny target and a different tiny draft, vocabulary 8: the joint law of the two tokens after the
    prefill's (both from one speculative round of k = 2) out of `generate` equals the target's, computed
    exactly by independent full forward passes."""
    vocab, decoding, prompt, n = 8, Decoding("sample", 0.5, 0.9), [1, 2, 3], 2000
    target = Loaded("tiny-target", _shaped(tiny_llama(vocab, seed=3), 3), None, torch.device("cpu"), torch.float32)
    draft = _shaped(tiny_llama(vocab, seed=4), 4)
    counts = torch.zeros(vocab, vocab)
    for seed in range(n):
        gen = torch.Generator().manual_seed(seed)
        out = generate(target, ModelDrafter(draft, decoding, gen, vocab), prompt, 2, decoding, 4, gen).output_tokens
        counts[out[1], out[2]] += 1
    pvalue, outcomes = pooled_chisquare(counts.view(-1), two_token_law(target, prompt, vocab, decoding), n)
    assert pvalue > 1e-3
    assert outcomes >= 20  # the law is spread over many outcomes, so the test means something


def _shaped(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Tied random embeddings make a tiny model repeat its last token with certainty; an untied head of
    this scale gives distributions spread over several tokens, so acceptance and residual both occur."""
    model.generation_config.eos_token_id = 99  # outside the vocabulary: never stops early
    generator = torch.Generator().manual_seed(seed)
    weight = model.lm_head.weight
    model.lm_head.weight = torch.nn.Parameter(torch.randn(weight.shape, generator=generator) * 0.05)
    return model
