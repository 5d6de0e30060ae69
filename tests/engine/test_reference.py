"""Lossless against an independent reference: transformers' own `generate` on the real default model.

Comparing speculative output with our plain decoding would let a bug that both share (the prefill, the
verify pass, the cache) pass unseen; transformers' greedy loop shares none of our code. Our side runs on the
skinny kernels (the default on a CPU); outside our engine the linears run stock, so the reference does.
"""

from __future__ import annotations

import pytest
import torch

from runner.engine.drafters.registry import parse_draft
from runner.engine.drafters.spec import PLAIN
from runner.engine.pair import Pair
from runner.engine.round.decoding_rule import Decoding
from runner.engine.weights import kernels, models
from runner.prompts import load_prompts

GREEDY = Decoding("greedy", 0.0, 1.0)
NEW_TOKENS = 32
BUILT_IN = ("code-01", "summary-01", "poem-01")  # one per built-in category; code-01 copies from the prompt
UNSEEN = (  # prompts outside the built-in suite and the other tests
    "Explain in two sentences why the sky looks blue at noon and red at sunset.",
    "Write a Python function that returns the n-th Fibonacci number without recursion.",
    "Summarize: The library will close for renovation from May to July. Books can be returned at the town "
    "hall, and the reading club will meet in the school gym on Thursdays until the library reopens.",
    "List three uses of a paperclip other than holding paper together.",
)
PROMPTS = len(BUILT_IN) + len(UNSEEN)
KS = (1, 2, 4, 8)
# How many prompts each draft checks every k on. The prompts are taken in turn, each draft starting at another, so
# every verify width meets several kinds of text without every draft decoding every prompt at every k: prompt
# lookup is cheap (every k on two prompts); layer skip at two depths makes every k meet two prompts as a kind.
PROMPTS_PER_K = {"ngram": 2, "layerskip:24": 1, "layerskip:12": 1, "model:tiny": 1}


def cases(draft: str) -> list[tuple[int, int]]:
    """(prompt index, k) pairs for one draft: every k on PROMPTS_PER_K[draft] different prompts."""
    start, per_k = 2 * list(PROMPTS_PER_K).index(draft), PROMPTS_PER_K[draft]
    return [((start + per_k * i + j) % PROMPTS, k) for i, k in enumerate(KS) for j in range(per_k)]


def test_every_draft_checks_every_k_and_every_prompt_is_decoded():
    for draft, per_k in PROMPTS_PER_K.items():
        pairs = cases(draft)
        assert all(len({i for i, k2 in pairs if k2 == k}) == per_k for k in KS) and len(pairs) == per_k * len(KS)
    assert {i for draft in PROMPTS_PER_K for i, _ in cases(draft)} == set(range(PROMPTS))
    layer_skip = cases("layerskip:24") + cases("layerskip:12")
    assert all(len({i for i, k2 in layer_skip if k2 == k}) == 2 for k in KS)


@pytest.fixture(scope="module")
def references(smollm2: models.Loaded) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, transformers' greedy continuation) per prompt: one `generate` each, shared by every test."""
    texts = {p.id: p.text for p in load_prompts()}
    out = []
    for text in [texts[i] for i in BUILT_IN] + list(UNSEEN):
        ids = models.encode_chat(smollm2, text)
        prompt = torch.tensor([ids])
        with torch.inference_mode():
            made = smollm2.model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS,
                                          do_sample=False)
        out.append((ids, made[0, len(ids):].tolist()))
    return out


def test_the_references_are_full_length_texts(references):
    for _, expected in references:
        assert len(expected) == NEW_TOKENS and len(set(expected)) > NEW_TOKENS // 3


def test_plain_greedy_on_our_kernels_equals_transformers_generate(smollm2, references):
    pair = Pair(smollm2, [])
    assert pair.kernels == kernels.SKINNY and pair.switches
    for prompt, expected in references:
        assert list(pair.run(PLAIN, prompt, None, GREEDY, NEW_TOKENS, seed=0).output_tokens) == expected


@pytest.mark.parametrize("draft", list(PROMPTS_PER_K))
def test_speculative_greedy_equals_transformers_generate(smollm2, tiny_dir, references, draft):
    spec = parse_draft(draft.replace("tiny", str(tiny_dir)))
    pair = Pair(smollm2, [spec])
    assert pair.kernels == kernels.SKINNY and pair.switches
    accepted = rejected = 0
    for i, k in cases(draft):
        prompt, expected = references[i]
        run = pair.run(spec, prompt, k, GREEDY, NEW_TOKENS, seed=0)
        assert list(run.output_tokens) == expected, (draft, i, k)
        accepted += sum(r.accepted for r in run.rounds)
        rejected += sum(r.rejected for r in run.rounds)
    # Both ways out of a round were taken: kept drafts (but a random tiny draft agrees by chance only) and
    # rejections, each followed by a rollback of both caches.
    assert rejected > 0 and (accepted > 0 or draft == "model:tiny")
