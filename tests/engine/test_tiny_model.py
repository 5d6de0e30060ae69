"""The tiny random model that stands in for a real one: its greedy text must depend on the prompt."""

from __future__ import annotations

import torch

from runner.engine.round.decode import generate
from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.draft import NoDraft
from tests.helpers.tiny import greedy_without_cache

PROMPTS = ([1, 2, 3, 4, 5], [100, 200, 300], list(range(100, 140)) * 2, [7, 7, 7])


def test_the_tiny_models_greedy_text_depends_on_the_prompt(tiny):
    texts = [greedy_without_cache(tiny.model, p, 16) for p in PROMPTS]
    assert len({tuple(t) for t in texts}) == len(PROMPTS)  # every prompt its own continuation
    for prompt, text in zip(PROMPTS, texts, strict=True):
        assert text != [prompt[-1]] * 16  # not the last prompt token repeated
        assert len(set(text)) >= 4  # and not stuck on one or two tokens
        assert text[0] != prompt[-1]


def test_plain_decoding_of_the_tiny_model_equals_decoding_without_a_cache(tiny):
    """Cache, positions and the prefill of `generate` against the slow path, on a model where they matter."""
    for prompt in PROMPTS:
        out = generate(tiny, NoDraft(), prompt, None, Decoding("greedy", 0.0, 1.0), 16, torch.Generator())
        assert list(out.output_tokens) == greedy_without_cache(tiny.model, prompt, 16)
