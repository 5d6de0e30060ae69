"""The drafter protocol: what a drafter proposes for one round (`Draft`), what every drafter answers to (`Drafter`),
plain decoding's empty drafter (`NoDraft`), and the rollable KV cache the model drafters and the round share.

Every drafter fits this one small interface, whatever it is made of: a separate model with its own KV cache, the
target's own first layers, a head over the target's hidden states, or a lookup in the text so far
(runner/engine/drafters/).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel

from runner.engine.round.sampling import Ranked, host


def unsure(logits: Tensor, q: Tensor | None, stop_below: float | None) -> bool:
    """Under the confidence policy (`stop_below` set): the draft just chosen had a top probability (of q when
    sampling: after temperature and top-p) below the threshold. One host read per draft, so only that policy asks."""
    if stop_below is None:
        return False
    top = (torch.softmax(logits.float(), dim=-1) if q is None else q).max()
    return host(top.view(1))[0] < stop_below


@dataclass(frozen=True)
class Draft:
    """What a drafter proposes for one round."""

    tokens: Tensor  # (k,) token ids on the target's device; k may be below what was asked
    # (k, V) the draft's probabilities over the TARGET's V logits when sampling; None for a greedy or
    # deterministic draft
    q: Tensor | None
    # a tree (runner/engine/round/trees.py): each node's parent, an earlier node or -1 for the newest committed token;
    # None for a chain, node i following node i - 1 (`trees.as_parents` turns a chain-shaped tree into None)
    parents: tuple[int, ...] | None = None
    # rows the verify pass carries after the nodes that are not drafts, never judged nor counted (lookahead decoding's
    # window): their tokens (E,) and parents, numbered on from the nodes (extra row e is node N + e; -1 the root)
    extra: Tensor | None = None
    extra_parents: tuple[int, ...] = ()


class Drafter(Protocol):
    """Proposes tokens and learns, after each verify pass, how many the target kept."""

    calls: int  # forward passes (or lookups) so far: the denominator of the draft cost c
    # Indices into the target's hidden states whose rows the drafter gets at the committed positions, side by side
    # (0: embeddings, i: input of layer i, L: the last layer's output before the final norm; hidden_states.py);
    # () asks for nothing and costs nothing.
    wants_hidden: tuple[int, ...]
    # How many of the target's likeliest tokens (and their probabilities) at every verify row the drafter reads
    # (token recycling, lookahead's argmax); 0 asks for none and costs nothing.
    wants_top: int

    def prefill(self, tokens: Tensor, hidden: Tensor | None, top: Ranked | None) -> None:
        """Start a new sequence: the prompt and the prefill's first new token (1-D ids); when asked for, `hidden`
        is (P, L·H) for the P prompt positions, L = len(wants_hidden), and `top` the target's `wants_top` likeliest
        tokens there (P rows)."""

    def propose(self, tokens: Tensor, k: int) -> Draft:
        """Up to k tokens to follow `tokens`, all committed text so far (1-D ids)."""

    def accepted(self, n: int, hidden: Tensor | None, top: Ranked | None) -> None:
        """The target kept the first n drafts (then added its own token); `hidden` is (n+1, L·H) when asked for.
        After a tree, n is the accepted path's length and `hidden` the rows of the root and that path. `top`, when
        asked for, is the target's `wants_top` likeliest tokens at every verify row (T rows: the root, each draft in
        order, then any `Draft.extra` rows), whether kept or not."""


def new_cache(model: PreTrainedModel) -> DynamicCache:
    """A KV cache that can roll back.

    A sliding-window layer (Mistral, Gemma-2/3, Phi-3, gpt-oss) keeps only its last window - 1 positions, so once
    the window is full transformers refuses any crop, even of 0 tokens. Recording the past keeps the positions of
    each forward until the next `crop_to`, which drops the rejected ones and trims the layer back to its window.
    """
    cache = DynamicCache(config=model.config)
    cache.activate_past_recording()
    return cache


def crop_to(cache: DynamicCache, length: int) -> None:
    """Roll a KV cache back to its first `length` positions, without recomputing them."""
    cache.crop(length - cache.get_seq_length())  # transformers 5: a negative count of tokens to drop


class NoDraft:
    """Plain decoding: nothing is proposed, so every round is one target pass making one token."""

    calls = 0
    wants_hidden = ()
    wants_top = 0

    def prefill(self, tokens: Tensor, hidden: Tensor | None, top: Ranked | None) -> None:
        pass

    def propose(self, tokens: Tensor, k: int) -> Draft:
        return Draft(tokens=tokens[:0], q=None)

    def accepted(self, n: int, hidden: Tensor | None, top: Ranked | None) -> None:
        pass
