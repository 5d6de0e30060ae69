"""α in sampling, proven: a sampled round accepts a drafted x ~ q with probability min(1, p(x)/q(x)), so one draft's
acceptance rate is Σ_x q(x)·min(1, p(x)/q(x)) = Σ_x min(p(x), q(x)).

A round that ignored q (testing every draft as if it were a point mass, accept with probability p(x)) would still
emit exactly the target's law, so the law tests (tests/engine/test_sampling.py) stay green; its acceptance rate would be
Σ_x q(x)·p(x) instead, far below. Here the target is a tiny random model whose law p after each first token is
computed by an independent full forward pass, and the draft a scripted one drawing from a fixed, spread q.
"""

from __future__ import annotations

import torch

from runner.engine.round.decode import generate
from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.draft import Draft
from runner.engine.round.sampling import probabilities
from runner.engine.weights.models import Loaded
from tests.helpers.tiny import tiny_llama

VOCAB, PROMPT, RUNS = 8, [1, 2, 3], 600
Q = torch.tensor([0.3, 0.05, 0.2, 0.05, 0.1, 0.1, 0.15, 0.05])  # the draft's law, the same at every position
DECODING = Decoding("sample")


class ScriptedDraft:
    """Drafts one token from Q with its own generator and says so (q = Q): stochastic, not a point mass."""

    calls, wants_hidden, wants_top = 0, (), 0

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def prefill(self, tokens: torch.Tensor, hidden: torch.Tensor | None, top: torch.Tensor | None) -> None:
        pass

    def propose(self, tokens: torch.Tensor, k: int) -> Draft:
        if k == 0:  # the last token of the budget: nothing to draft
            return Draft(tokens[:0], None)
        self.calls += 1
        return Draft(torch.multinomial(Q, k, replacement=True, generator=self.generator), Q.expand(k, VOCAB))

    def accepted(self, n: int, hidden: torch.Tensor | None, top: torch.Tensor | None) -> None:
        pass


def _target() -> Loaded:
    model = tiny_llama(VOCAB, seed=3)
    generator = torch.Generator().manual_seed(3)
    # An untied head of this scale spreads p over several tokens (tests/engine/test_sampling.py, `_shaped`).
    model.lm_head.weight = torch.nn.Parameter(torch.randn(model.lm_head.weight.shape, generator=generator) * 0.05)
    model.generation_config.eos_token_id = 99  # outside the vocabulary: never stops early
    return Loaded("tiny-target", model, None, torch.device("cpu"), torch.float32)


def test_one_drafts_sampled_acceptance_rate_is_the_sum_of_min_p_q():
    target = _target()
    with torch.inference_mode():  # p after the prompt and each possible first token, by full passes, no cache
        p = probabilities(torch.stack([target.model(input_ids=torch.tensor([[*PROMPT, t]])).logits[0, -1]
                                       for t in range(VOCAB)]), DECODING)  # (V first tokens, V)
    accepted, expected, deterministic = 0, 0.0, 0.0
    for seed in range(RUNS):
        gen = torch.Generator().manual_seed(seed)
        # 3 new tokens: the prefill's, then one round of k = 1 (the budget leaves room for one draft and its bonus)
        out = generate(target, ScriptedDraft(torch.Generator().manual_seed(10_000 + seed)), PROMPT, 1, DECODING, 3,
                       gen)
        first, round0 = out.output_tokens[0], out.rounds[0]
        assert round0.k == 1 and round0.accepted + round0.rejected == 1
        accepted += round0.accepted
        expected += float(torch.minimum(p[first], Q).sum())
        deterministic += float((p[first] * Q).sum())
        # The round recorded its test: accepted iff u < p(x) / q(x), with q(x) the draft's own probability
        (px,), (qx,), (u,) = round0.draft_p, round0.draft_q, round0.draft_u
        assert qx == float(Q[round0.draft_tokens[0]]) and abs(px - float(p[first, round0.draft_tokens[0]])) < 1e-5
        assert (u < px / qx) == bool(round0.accepted)
        assert round0.from_residual == bool(round0.rejected)
    rate, expected, deterministic = accepted / RUNS, expected / RUNS, deterministic / RUNS
    assert expected - deterministic > 0.3  # the two hypotheses are far apart ...
    # ... and the round is the right one (measured here: 0.790 against 0.793; ignoring q gives 0.132, near 0.145)
    assert abs(rate - expected) < 4 * (expected * (1 - expected) / RUNS) ** 0.5, (rate, expected, deterministic)
