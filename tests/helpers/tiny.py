"""The tiny random Llama that stands in for a real model, and greedy decoding without a cache to check it against."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama(vocab_size: int, seed: int, layers: int = 2) -> LlamaForCausalLM:
    """A seeded random Llama small enough to decode in milliseconds, whose greedy text depends on the prompt.

    The LM head is its own matrix: tied to the embeddings, a random model scores the token it was just fed
    highest and repeats the prompt's last token forever, which hides cache, position and rollback bugs.
    """
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).eval()


def greedy_without_cache(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    """The argmax after the whole text, one full forward pass per token: no cache, nothing shared with decode."""
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]
