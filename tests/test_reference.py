"""Lossless against an independent reference: transformers' own `generate` on the real default model.

Comparing speculative output with our plain decoding would let a bug that both share (the prefill, the
verify pass, the cache) pass unseen; transformers' greedy loop shares none of our code.
"""

from __future__ import annotations

import pytest
import torch

from runner.engine import models
from runner.engine.pair import PLAIN, Pair, parse_draft
from runner.engine.sampling import Decoding
from runner.prompts import load_prompts

GREEDY = Decoding("greedy", 0.0, 1.0)
NEW_TOKENS = 32
PROMPT_IDS = ("code-01", "summary-01", "poem-01")  # one per built-in category; code-01 copies from the prompt


@pytest.fixture(scope="module")
def references(smollm2: models.Loaded) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, transformers' greedy continuation) per prompt: one `generate` each, shared by every test."""
    texts = {p.id: p.text for p in load_prompts()}
    out = []
    for prompt_id in PROMPT_IDS:
        ids = models.encode_chat(smollm2, texts[prompt_id])
        with torch.inference_mode():
            made = smollm2.model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)
        out.append((ids, made[0, len(ids):].tolist()))
    return out


def test_the_references_are_full_length_texts(references):
    for _, expected in references:
        assert len(expected) == NEW_TOKENS and len(set(expected)) > NEW_TOKENS // 3


def test_plain_greedy_equals_transformers_generate(smollm2, references):
    pair = Pair(smollm2, [])
    for prompt, expected in references:
        assert list(pair.run(PLAIN, prompt, None, GREEDY, NEW_TOKENS, seed=0).output_tokens) == expected


KS = (1, 2, 4, 8)


def ks_for(draft: str, prompt: int) -> tuple[int, ...]:
    """Prompt lookup is cheap: every k on every prompt. The model drafts take two k per prompt in turn, so each
    verify width is still checked on one prompt at least (1 and 4 on two), at half the cost."""
    return KS if draft == "ngram" else (KS[prompt % 4], KS[(prompt + 2) % 4])


@pytest.mark.parametrize("draft", ["ngram", "layerskip:12", "model:tiny"])
def test_speculative_greedy_equals_transformers_generate(smollm2, tiny_dir, references, draft):
    spec = parse_draft(draft.replace("tiny", str(tiny_dir)))
    pair = Pair(smollm2, [spec])
    accepted = rejected = 0
    assert sorted({k for i in range(len(references)) for k in ks_for(draft, i)}) == list(KS)
    for i, (prompt, expected) in enumerate(references):
        for k in ks_for(draft, i):
            run = pair.run(spec, prompt, k, GREEDY, NEW_TOKENS, seed=0)
            assert list(run.output_tokens) == expected, (draft, k)
            accepted += sum(r.accepted for r in run.rounds)
            rejected += sum(r.rejected for r in run.rounds)
    # Both ways out of a round were taken: kept drafts (but a random tiny draft agrees by chance only) and
    # rejections, each followed by a rollback of both caches.
    assert rejected > 0 and (accepted > 0 or draft == "model:tiny")
