"""Greedy decoding on the skinny kernels is lossless on the real SmolLM2: plain decoding equals transformers'
own `generate(do_sample=False)` on stock F.linear, and speculative decoding equals plain decoding."""

from __future__ import annotations

import pytest
import torch

from runner.engine import kernels
from runner.engine.pair import PLAIN, Pair, models, parse_draft
from runner.engine.sampling import Decoding

GREEDY = Decoding("greedy", 0.0, 1.0)
NEW_TOKENS = 32
# Prompts outside the built-in suite and the other tests.
UNSEEN = (
    "Explain in two sentences why the sky looks blue at noon and red at sunset.",
    "Write a Python function that returns the n-th Fibonacci number without recursion.",
    "Summarize: The library will close for renovation from May to July. Books can be returned at the town "
    "hall, and the reading club will meet in the school gym on Thursdays until the library reopens.",
    "List three uses of a paperclip other than holding paper together.",
)


def transformers_greedy(target: models.Loaded, ids: list[int]) -> tuple[int, ...]:
    """transformers' own greedy decoding; outside our engine the linears run stock."""
    prompt = torch.tensor([ids])
    out = target.model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                max_new_tokens=NEW_TOKENS)
    return tuple(out[0, len(ids):].tolist())


KS = (1, 2, 4, 8)
# Prompt lookup is cheap: every k on every prompt. Layer skip takes two k per prompt in turn, so each verify width
# is still checked on two prompts, at half the cost.
DRAFT_KS = {i: {"ngram": KS, "layerskip:24": (KS[i % 4], KS[(i + 2) % 4])} for i in range(len(UNSEEN))}


def test_every_k_is_checked_on_two_prompts():
    for draft in ("ngram", "layerskip:24"):
        counts = [sum(k in DRAFT_KS[i][draft] for i in DRAFT_KS) for k in KS]
        assert min(counts) >= 2


@pytest.mark.parametrize("index", range(len(UNSEEN)))
def test_plain_greedy_on_our_kernels_equals_transformers_generate_and_speculative_equals_plain(smollm2, index):
    pair = Pair(smollm2, [parse_draft("ngram"), parse_draft("layerskip:24")], kernels.SKINNY)
    assert pair.kernels == kernels.SKINNY and pair.switches
    ids = models.encode_chat(pair.target, UNSEEN[index])
    ours = pair.run(PLAIN, ids, None, GREEDY, NEW_TOKENS, seed=0).output_tokens
    assert ours == transformers_greedy(pair.target, ids)
    for draft, ks in DRAFT_KS[index].items():
        for k in ks:
            spec = pair.run(parse_draft(draft), ids, k, GREEDY, NEW_TOKENS, seed=0).output_tokens
            assert spec == ours, (draft, k)
