"""Training data for a draft head by self-distillation: the target answers the training prompts itself (greedy,
batched), and the hidden states the head reads are kept at every position of prompt and answer.

The answers are the target's own, as EAGLE-3 and HASS regenerate theirs: a head learns what this target says,
not what some dataset's authors wrote. A corpus is cached under the specdash cache directory, keyed by
everything that defines it, so a second training run with other knobs starts at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor
from transformers import DynamicCache

from runner.engine import models
from runner.prompts import Prompt

FEATURE_DTYPE = torch.bfloat16  # half the memory of fp32 for (tokens × 3 layers × H) features; training upcasts
CACHE_VERSION = 2  # bump when the corpus format or the way it is made changes


@dataclass(frozen=True)
class Sample:
    """One prompt and the target's answer, with the target's features at every position."""

    prompt_id: str
    category: str
    tokens: Tensor  # (T,) chat-templated prompt + answer ids
    features: Tensor  # (T-1, L·H) the target's hidden states at the head's layers, all positions but the last
    answer_start: int  # index in `tokens` of the answer's first token

    @property
    def answer_tokens(self) -> int:
        return self.tokens.numel() - self.answer_start


def _left_padded(rows: list[list[int]], pad: int) -> tuple[Tensor, Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def answer_batch(loaded: models.Loaded, prompts: list[Prompt], layers: tuple[int, ...],
                 max_new_tokens: int) -> list[Sample]:
    """Greedy answers to `prompts` in one left-padded batch, with the features of every real position. A row
    leaves the batch (and its cache) as soon as its answer ends, so short answers cost no more than they are."""
    model, eos = loaded.model, loaded.eos_ids
    rows = [models.encode_chat(loaded, p.text) for p in prompts]
    ids, mask = _left_padded(rows, pad=next(iter(eos)))
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    answers: list[list[int]] = [[] for _ in rows]
    pieces: list[list[Tensor]] = [[] for _ in rows]  # per prompt: features of its positions, in order
    live = list(range(len(rows)))  # the prompt each batch row answers
    with torch.inference_mode():
        for step in range(max_new_tokens):
            out = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
                        output_hidden_states=True, logits_to_keep=1)
            features = torch.cat([out.hidden_states[i] for i in layers], dim=-1).to(FEATURE_DTYPE)  # (b, t, L·H)
            chosen = out.logits[:, -1].argmax(-1)  # (b,)
            keep = []
            for b, (row, token) in enumerate(zip(live, chosen.tolist(), strict=True)):
                pieces[row].append(features[b, -len(rows[row]) :] if step == 0 else features[b])  # no padding
                answers[row].append(token)
                if token not in eos and len(answers[row]) < max_new_tokens:
                    keep.append(b)
            if not keep:
                break
            if len(keep) < len(live):
                index = torch.tensor(keep)
                cache.batch_select_indices(index)
                mask, positions, chosen, live = mask[index], positions[index], chosen[index], [live[b] for b in keep]
            ids = chosen[:, None]
            mask = torch.cat([mask, torch.ones(len(live), 1, dtype=mask.dtype)], dim=-1)
            positions = positions[:, -1:] + 1
    samples = []
    for prompt, row, answer, piece in zip(prompts, rows, answers, pieces, strict=True):
        tokens = torch.tensor(row + answer)
        samples.append(Sample(prompt.id, prompt.category, tokens, torch.cat(piece)[: tokens.numel() - 1], len(row)))
    return samples


def distill(loaded: models.Loaded, prompts: list[Prompt], layers: tuple[int, ...], max_tokens: int,
            max_new_tokens: int, batch_size: int, advance: Callable[[int], None]) -> list[Sample]:
    """Answer prompts in batches of similar length until `max_tokens` answer tokens are made; `advance(n)` is
    told each batch's answer tokens."""
    by_length = sorted(prompts, key=lambda p: len(models.encode_chat(loaded, p.text)))
    samples: list[Sample] = []
    made = 0
    for start in range(0, len(by_length), batch_size):
        if made >= max_tokens:
            break
        batch = answer_batch(loaded, by_length[start : start + batch_size], layers, max_new_tokens)
        samples += batch
        made += sum(s.answer_tokens for s in batch)
        advance(sum(s.answer_tokens for s in batch))
    return samples


def corpus(loaded: models.Loaded, prompts: list[Prompt], layers: tuple[int, ...], max_tokens: int,
           max_new_tokens: int, batch_size: int, advance: Callable[[int], None]) -> tuple[list[Sample], bool]:
    """`distill`, or its cached result for exactly these inputs; also says whether it came from the cache."""
    described = json.dumps([CACHE_VERSION, loaded.spec, str(loaded.dtype), list(layers), max_tokens,
                            max_new_tokens, batch_size, [(p.id, p.category, p.text) for p in prompts]])
    path = models.cache_dir() / "distill" / f"{hashlib.sha256(described.encode()).hexdigest()[:20]}.safetensors"
    if path.is_file():
        return load_corpus(path), True
    samples = distill(loaded, prompts, layers, max_tokens, max_new_tokens, batch_size, advance)
    save_corpus(samples, path)
    return samples, False


def save_corpus(samples: list[Sample], path: Path) -> None:
    """One safetensors file (written aside, then renamed in): the samples' tensors, their fields as metadata."""
    tensors = {}
    for i, s in enumerate(samples):
        tensors[f"{i}.tokens"], tensors[f"{i}.features"] = s.tokens, s.features.contiguous()
    meta = json.dumps([(s.prompt_id, s.category, s.answer_start) for s in samples])
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, staging = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    save_file(tensors, staging, metadata={"samples": meta})
    os.replace(staging, path)


def load_corpus(path: Path) -> list[Sample]:
    with safe_open(path, framework="pt") as f:
        meta = json.loads(f.metadata()["samples"])
    tensors = load_file(path)
    return [Sample(pid, category, tensors[f"{i}.tokens"], tensors[f"{i}.features"], start)
            for i, (pid, category, start) in enumerate(meta)]
