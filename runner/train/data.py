"""Training data for a draft head by self-distillation: the target answers the user turns of the training
conversations itself (greedy, batched, turn by turn with its own earlier answers in the context), and the hidden
states the head reads are kept at every position of context and answer.

The answers are the target's own, as EAGLE-3 and HASS regenerate theirs: a head learns what this target says,
not what some dataset's authors wrote. The answers are cached in chunks as they are made (one per batch of
conversations, under the specdash cache directory, keyed by everything that defines it), so an interrupted
generation resumes at the chunk it was making, and a second training with other knobs starts at once.
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

from runner.engine.round import hidden_states
from runner.engine.weights import models, sources
from runner.train.conversations import Conversation

FEATURE_DTYPE = torch.bfloat16  # half the memory of fp32 for (tokens × 3 layers × H) features; training upcasts
CACHE_VERSION = 3  # bump when the corpus format or the way it is made changes
BLOCK = 512  # conversations sorted by length together: appending to a file leaves earlier blocks' batches alone


@dataclass(frozen=True)
class Sample:
    """One assistant turn the target wrote, after its context, with the target's features at every position."""

    prompt_id: str  # the conversation's id
    category: str
    tokens: Tensor  # (T,) chat-templated context (earlier turns, then the user's) + answer ids
    features: Tensor  # (T-1, L·H) the target's hidden states at the head's layers, all positions but the last
    answer_start: int  # index in `tokens` of the answer's first token
    turn: int = 0  # which user turn of the conversation this answers, 0-based

    @property
    def answer_tokens(self) -> int:
        return self.tokens.numel() - self.answer_start


@dataclass(frozen=True)
class Context:
    """What the target is asked to answer: a conversation up to one of its user turns, as token ids."""

    prompt_id: str
    category: str
    turn: int
    tokens: list[int]


def left_padded(rows: list[list[int]], pad: int) -> tuple[Tensor, Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def answer_batch(loaded: models.Loaded, contexts: list[Context], layers: tuple[int, ...],
                 max_new_tokens: int) -> list[Sample]:
    """Greedy answers to `contexts` in one left-padded batch, with the features of every real position. A row
    leaves the batch (and its cache) as soon as its answer ends, so short answers cost no more than they are."""
    model, eos = loaded.model, loaded.eos_ids
    rows = [c.tokens for c in contexts]
    ids, mask = left_padded(rows, pad=next(iter(eos)))
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    answers: list[list[int]] = [[] for _ in rows]
    pieces: list[list[Tensor]] = [[] for _ in rows]  # per context: features of its positions, in order
    live = list(range(len(rows)))  # the context each batch row answers
    with torch.inference_mode():
        for step in range(max_new_tokens):
            with hidden_states.reading(model, layers) as features_of:
                out = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
                            output_hidden_states=True, logits_to_keep=1)
            features = features_of(out).to(FEATURE_DTYPE)  # (b, t, L·H)
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
    for context, answer, piece in zip(contexts, answers, pieces, strict=True):
        tokens = torch.tensor(context.tokens + answer)
        samples.append(Sample(context.prompt_id, context.category, tokens, torch.cat(piece)[: tokens.numel() - 1],
                              len(context.tokens), context.turn))
    return samples


def answer_conversations(loaded: models.Loaded, conversations: list[Conversation], layers: tuple[int, ...],
                         max_new_tokens: int) -> list[Sample]:
    """The target answers every turn of `conversations`, turn by turn: turn t of all that have one in one batch,
    each after its user turns so far and the target's own answers to them (EOS left out)."""
    messages: list[list[dict[str, str]]] = [[] for _ in conversations]
    samples: list[Sample] = []
    for turn in range(max(len(c.turns) for c in conversations)):
        asked = [i for i, c in enumerate(conversations) if turn < len(c.turns)]
        for i in asked:
            messages[i].append({"role": "user", "content": conversations[i].turns[turn]})
        contexts = [Context(conversations[i].id, conversations[i].category, turn,
                            models.encode_messages(loaded, messages[i])) for i in asked]
        answered = answer_batch(loaded, contexts, layers, max_new_tokens)
        for i, sample in zip(asked, answered, strict=True):
            answer = loaded.tokenizer.decode(sample.tokens[sample.answer_start :], skip_special_tokens=True)
            messages[i].append({"role": "assistant", "content": answer})
        samples += answered
    return samples


def corpus(loaded: models.Loaded, conversations: list[Conversation], layers: tuple[int, ...], max_tokens: int,
           max_new_tokens: int, batch_size: int, advance: Callable[[int], None]) -> tuple[list[Sample], bool]:
    """The target's answers to conversations until `max_tokens` answer tokens are made: in blocks of BLOCK in file
    order, each answered in batches of similar first-turn length. Each batch is read from its cached chunk when one
    exists, else made and cached at once; a file that grows at its end keeps its earlier blocks' chunks. `advance(n)`
    is told each batch's answer tokens; also says whether every batch came from the cache."""
    samples: list[Sample] = []
    made, cached = 0, True
    for block in range(0, len(conversations), BLOCK):
        by_length = sorted(conversations[block : block + BLOCK],
                           key=lambda c: len(models.encode_chat(loaded, c.turns[0])))
        for start in range(0, len(by_length), batch_size):
            if made >= max_tokens:
                return samples, cached
            batch = by_length[start : start + batch_size]
            path = chunk_path(loaded, batch, layers, max_new_tokens)
            if path.is_file():
                answered = load_corpus(path)
            else:
                answered, cached = answer_conversations(loaded, batch, layers, max_new_tokens), False
                save_corpus(answered, path)
            samples += answered
            made += sum(s.answer_tokens for s in answered)
            advance(sum(s.answer_tokens for s in answered))
    return samples, cached


def chunk_path(loaded: models.Loaded, batch: list[Conversation], layers: tuple[int, ...], max_new_tokens: int) -> Path:
    """Where one batch's answers are cached: named by everything that makes them."""
    described = json.dumps([CACHE_VERSION, loaded.spec, str(loaded.dtype), list(layers), max_new_tokens,
                            [(c.id, c.category, c.turns) for c in batch]])
    return sources.cache_dir() / "distill" / f"{hashlib.sha256(described.encode()).hexdigest()[:20]}.safetensors"


def save_corpus(samples: list[Sample], path: Path) -> None:
    """One safetensors file (written aside, then renamed in): the samples' tensors, their fields as metadata."""
    tensors = {}
    for i, s in enumerate(samples):
        tensors[f"{i}.tokens"], tensors[f"{i}.features"] = s.tokens, s.features.contiguous()
    meta = json.dumps([(s.prompt_id, s.category, s.answer_start, s.turn) for s in samples])
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, staging = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    save_file(tensors, staging, metadata={"samples": meta})
    os.replace(staging, path)


def load_corpus(path: Path) -> list[Sample]:
    with safe_open(path, framework="pt") as f:
        meta = json.loads(f.metadata()["samples"])
    tensors = load_file(path)
    return [Sample(pid, category, tensors[f"{i}.tokens"], tensors[f"{i}.features"], start, turn)
            for i, (pid, category, start, turn) in enumerate(meta)]
