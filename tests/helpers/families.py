"""Tiny random models of the families users bring, built from transformers' own config classes and saved as real
Hugging Face directories with one shared word-level tokenizer, so any of them can draft for any other.

Sliding windows are smaller than the tests' contexts, so the window is full long before the first rollback.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, pre_tokenizers, trainers
from tokenizers import models as tok_models
from transformers import (
    Gemma3Config,
    Gemma3ForCausalLM,
    Gemma3ForConditionalGeneration,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    SiglipVisionConfig,
)

WORDS = 300  # the tokenizer's vocabulary: 256 bytes, merges and the end-of-text token (id 0)
EOS = "<|endoftext|>"
TEXT = ("the town council voted to close the old bridge over the river for repairs; a ferry will run every half "
        "hour. def add(a, b): return a + b. write a poem about rain on the roof, a cloud, the wind and the sea.")
WINDOW = 8  # sliding window, well below every test's prompt + output
SHAPE = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 256}


def _gemma3_text(layers: int, vocab: int) -> Gemma3TextConfig:
    # transformers fills in Gemma-3's pattern: five sliding-window layers, then a full-attention one.
    return Gemma3TextConfig(vocab_size=vocab, num_hidden_layers=layers, head_dim=8, query_pre_attn_scalar=8,
                            sliding_window=WINDOW, pad_token_id=0, eos_token_id=0, bos_token_id=0, **SHAPE)


def _multimodal(layers: int, vocab: int) -> Gemma3ForConditionalGeneration:
    vision = SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                image_size=16, patch_size=8)
    config = Gemma3Config(text_config=_gemma3_text(layers, vocab).to_dict(), vision_config=vision.to_dict(),
                          mm_tokens_per_image=4, boi_token_index=WORDS - 4, eoi_token_index=WORDS - 3,
                          image_token_index=WORDS - 2)
    return Gemma3ForConditionalGeneration(config)


@dataclass(frozen=True)
class Family:
    """One model family: how to build a target and a smaller draft of it."""

    name: str
    build: Callable[[int, int], PreTrainedModel]  # (layers, vocab_size) -> a random model
    target_vocab: int = WORDS  # logits the target makes: more than the tokenizer's words where a family pads
    draft_vocab: int = WORDS
    sliding: bool = False  # has sliding-window layers whose window the tests overrun


FAMILIES = (
    Family("llama", lambda n, v: LlamaForCausalLM(LlamaConfig(vocab_size=v, num_hidden_layers=n, **SHAPE))),
    # Qwen2.5: a 7B target pads its head to 152,064 logits, a 0.5B draft to 151,936, over one tokenizer.
    Family("qwen2", lambda n, v: Qwen2ForCausalLM(Qwen2Config(vocab_size=v, num_hidden_layers=n, **SHAPE)),
           target_vocab=WORDS + 32, draft_vocab=WORDS + 8),
    Family("mistral", lambda n, v: MistralForCausalLM(MistralConfig(vocab_size=v, num_hidden_layers=n,
                                                                    sliding_window=WINDOW, **SHAPE)), sliding=True),
    Family("gemma3", lambda n, v: Gemma3ForCausalLM(_gemma3_text(n, v)), sliding=True),
    Family("phi3", lambda n, v: Phi3ForCausalLM(Phi3Config(vocab_size=v, num_hidden_layers=n, sliding_window=WINDOW,
                                                           pad_token_id=0, **SHAPE)), sliding=True),
    Family("gemma3-multimodal", _multimodal, sliding=True),
)
BY_NAME = {f.name: f for f in FAMILIES}


def tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on TEXT (Qwen2's tokenizer class reloads it as it is, unlike a word-level one)."""
    core = Tokenizer(tok_models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    words = TEXT.split()
    core.train_from_iterator([" ".join(words[i:] + words[:i]) for i in range(len(words))], trainers.BpeTrainer(
        vocab_size=WORDS, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token=EOS)


def sharpen(model: PreTrainedModel, seed: int) -> PreTrainedModel:
    """Random init gives near-uniform logits, so every greedy choice would be a near-tie; a larger random head
    spreads them, as a trained model's are."""
    generator = torch.Generator().manual_seed(seed)
    head = model.get_output_embeddings()
    head.weight = torch.nn.Parameter(torch.randn(head.weight.shape, generator=generator) * 0.5)
    return model


def save(family: Family, path: Path, layers: int, vocab: int, seed: int) -> Path:
    """A random model of `family` with the shared tokenizer, saved as a Hugging Face directory."""
    torch.manual_seed(seed)
    model = sharpen(family.build(layers, vocab).eval(), seed)
    model.generation_config.eos_token_id = 0  # EOS
    model.save_pretrained(path)
    tokenizer().save_pretrained(path)
    return path


def prompt_text(words: int, seed: int) -> str:
    """`words` words of TEXT from a seeded start, said twice, so prompt lookup finds matches."""
    all_words = TEXT.split()
    start = int(torch.randint(len(all_words), (1,), generator=torch.Generator().manual_seed(seed)))
    picked = (all_words * 2)[start: start + words // 2]
    return " ".join(picked + picked)
