"""Speculative sampling on the real model: the first token a round emits follows the target's own law.

From one fixed committed text, many rounds are drawn with a fixed seed schedule (each round rolls the
target's cache back to the text, as a round does itself); the emitted tokens are compared by a
chi-square test with the law of plain sampling, computed exactly by an independent forward pass.
A deliberately wrong variant (the correction drawn from p instead of the residual) must fail the same test.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from runner.engine.drafters.registry import parse_draft
from runner.engine.pair import Pair
from runner.engine.round import sampling
from runner.engine.round.clock import Clock
from runner.engine.round.decode import CachedTarget, CommittedText, speculative_round
from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.draft import crop_to
from runner.engine.weights import kernels

DECODING = Decoding("sample", 1.0, 0.95)
# Committed texts where the law of the next token is spread and each draft is right often but not always:
# after "chair." the target says " The" with p ≈ 0.50 (then "\n" ≈ 0.10, a long tail), which prompt lookup
# proposes; after "red" it says "," with p ≈ 0.56, which the first 4 layers propose with q ≈ 0.97.
TEXTS = {"ngram": "The cat sat on the mat. The dog sat on the log. The bird sat on the chair.",
         "layerskip:4": "red green blue, red", "model:tiny": "red green blue, red"}
SAMPLES = 100  # per test; with these texts the wrong variant below scores p ≈ 1e-6
K = 1  # the first emitted token depends on the first draft only; one draft keeps the verify pass short


def law(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Plain sampling's law, written out again: softmax(logits / T), cut to the smallest set reaching top-p."""
    probs = torch.softmax(logits.double() / temperature, -1)
    order = probs.argsort(descending=True)
    before = probs[order].cumsum(0) - probs[order]  # the mass strictly before each token
    kept = order[before < top_p]
    out = torch.zeros_like(probs)
    out[kept] = probs[kept] / probs[kept].sum()
    return out


def p_value(tokens: list[int], expected: torch.Tensor) -> float:
    """Chi-square of the tokens against a law; outcomes expected fewer than 5 times are pooled."""
    counts = torch.bincount(torch.tensor(tokens), minlength=expected.numel()).double()
    want = expected * len(tokens)
    big = want >= 5
    observed = torch.cat([counts[big], counts[~big].sum().view(1)])
    wanted = torch.cat([want[big], want[~big].sum().view(1)])
    return chisquare(observed.numpy(), wanted.numpy() / wanted.sum().item() * observed.sum().item()).pvalue


@pytest.fixture(scope="module")
def laws(smollm2) -> dict[str, tuple[list[int], torch.Tensor]]:
    """Per drafter: the committed text's ids and the exact law of plain sampling's next token after it."""
    out = {}
    for draft, text in TEXTS.items():
        ids = smollm2.tokenizer(text)["input_ids"]
        with torch.inference_mode():
            logits = smollm2.model(input_ids=torch.tensor([ids])).logits[0, -1]
        out[draft] = ids, law(logits, DECODING.temperature, DECODING.top_p)
    return out


def first_tokens(smollm2, pair: Pair, draft: str, prefix: list[int]) -> tuple[list[int], list[tuple[int, int]]]:
    """The first token each of SAMPLES rounds emits after `prefix` (seeds 0, 1, …), and (accepted, k) per round,
    on the pair's kernels as its runs use them (the law it is compared with comes from a stock forward pass)."""
    spec = parse_draft(draft)
    target = CachedTarget(smollm2)
    clock = Clock(smollm2.device)
    firsts, outcomes = [], []
    with torch.inference_mode(), kernels.using(pair.switches):
        target.prefill(torch.tensor(prefix[:-1]))  # the cache holds every committed token but the newest
        for seed in range(SAMPLES):
            generator = torch.Generator().manual_seed(seed)
            drafter = pair.drafter(spec, DECODING, generator)
            text = CommittedText(prefix, len(prefix) + K + 1, smollm2.device)
            drafter.prefill(text.tokens, None, None)
            r = speculative_round(target, drafter, text, K, DECODING, generator, clock, K + 1, frozenset()).read(clock)
            firsts.append(int(text.tokens[len(prefix)]))
            outcomes.append((r.accepted, r.k))
            crop_to(target.cache, len(prefix) - 1)
    return firsts, outcomes


@pytest.fixture(scope="module")
def pair(smollm2, tiny_dir) -> Pair:
    return Pair(smollm2, [parse_draft("layerskip:4"), parse_draft(f"model:{tiny_dir}")])


def spec_text(draft: str, tiny_dir) -> str:
    return draft.replace("tiny", str(tiny_dir))


@pytest.mark.parametrize("draft", list(TEXTS))
def test_the_first_emitted_token_follows_plain_samplings_law(smollm2, tiny_dir, pair, laws, draft):
    prefix, target_law = laws[draft]
    firsts, outcomes = first_tokens(smollm2, pair, spec_text(draft, tiny_dir), prefix)
    assert p_value(firsts, target_law) > 1e-3
    assert all(k == K for _, k in outcomes)  # every round drafted
    accepted = sum(a for a, _ in outcomes)
    # Both ways out of the draft were taken many times, but a random tiny draft is (almost) never right.
    assert SAMPLES - accepted >= SAMPLES // 5 and (accepted >= SAMPLES // 5 or draft == "model:tiny")


@pytest.mark.parametrize("draft", ["ngram", "layerskip:4"])  # a point-mass draft and one with q
def test_a_correction_drawn_from_p_instead_of_the_residual_fails_the_same_test(pair, laws, smollm2, draft,
                                                                               monkeypatch):
    monkeypatch.setattr(sampling, "residual", lambda p, q: p)  # the deliberate mistake
    prefix, target_law = laws[draft]
    firsts, _ = first_tokens(smollm2, pair, draft, prefix)
    assert p_value(firsts, target_law) < 1e-4


def test_the_test_has_power_the_drafts_own_law_is_rejected(pair, laws):
    """Emitting the layer-skip drafts unjudged would be caught: as many draws from the draft's law fail."""
    prefix, target_law = laws["layerskip:4"]
    with torch.inference_mode():
        logits = pair.draft_models["layerskip:4"](input_ids=torch.tensor([prefix])).logits[0, -1]
    q = law(logits, DECODING.temperature, DECODING.top_p)
    drawn = torch.multinomial(q, SAMPLES, replacement=True, generator=torch.Generator().manual_seed(0))
    assert p_value(drawn.tolist(), target_law) < 1e-6
