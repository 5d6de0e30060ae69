"""Drafters: what proposes the k tokens the target then checks.

Every drafter fits one small interface (`Drafter`), whatever it is made of: a separate model with its
own KV cache, the target's own first layers, or a lookup in the text so far.
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor, nn
from transformers import DynamicCache, PreTrainedModel

from runner.engine.sampling import Decoding, Ranked, draw, host, probabilities

NGRAM_MATCHES = ("earliest", "latest", "longest")  # which earlier occurrence prompt lookup copies from
DEFAULT_MATCH = "latest"  # no match rule ranked first everywhere (bench/results/notes.md)


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
    # a tree (runner/engine/trees.py): each node's parent, an earlier node or -1 for the newest committed token;
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


class ModelDrafter:
    """A causal LM drafting one token per call, its KV cache kept in step with the committed text.

    It drafts among the target's `vocab` ids (`Loaded.vocab_size`): families pad their heads to different sizes
    over one tokenizer (Qwen2.5: 152,064 logits for 7B and up, 151,936 below), so a wider draft head is cut to
    those ids, and a narrower q would be 0 on the ids it lacks (it never proposes them, which keeps speculative
    sampling exact).
    """

    wants_hidden = ()
    wants_top = 0

    def __init__(self, model: PreTrainedModel, decoding: Decoding, generator: torch.Generator, vocab: int,
                 stop_below: float | None = None) -> None:
        self.model = model
        self.stop_below = stop_below  # the confidence policy's threshold: stop after a draft less likely than this
        self.decoding = decoding
        self.generator = generator
        self.vocab = vocab
        self.calls = 0
        self.cache = new_cache(model)
        self.committed = 0  # committed tokens when the last proposal was made

    def _next_logits(self, ids: Tensor) -> Tensor:
        out = self.model(input_ids=ids[None], cache=self.cache, use_cache=True, logits_to_keep=1)
        self.calls += 1
        return out.logits[0, -1, : self.vocab]  # (V,) at most the target's V

    def _q(self, logits: Tensor) -> Tensor:
        q = probabilities(logits, self.decoding)
        return torch.nn.functional.pad(q, (0, self.vocab - q.numel()))  # (V,) in the target's vocabulary

    def prefill(self, tokens: Tensor, hidden: Tensor | None, top: Ranked | None) -> None:
        self.cache = new_cache(self.model)
        # All but the newest token: the first proposal feeds it, like every later correction or bonus.
        if tokens.numel() > 1:
            self.model(input_ids=tokens[None, :-1], cache=self.cache, use_cache=True, logits_to_keep=1)
            crop_to(self.cache, tokens.numel() - 1)  # trims sliding-window layers back to their window

    def propose(self, tokens: Tensor, k: int) -> Draft:
        self.committed = tokens.numel()
        if k == 0:
            return Draft(tokens=tokens[:0], q=None)
        feed = tokens[self.cache.get_seq_length() :]  # the text the cache has not seen: 1 or 2 tokens
        drafted, qs = [], []
        for i in range(k):
            logits = self._next_logits(feed)
            if self.decoding.greedy:
                feed, q = logits.argmax().view(1), None
            else:
                q = self._q(logits)
                feed = draw(q, self.generator)
                qs.append(q)
            drafted.append(feed)
            if i < k - 1 and unsure(logits, q, self.stop_below):
                break
        return Draft(tokens=torch.cat(drafted), q=torch.stack(qs) if qs else None)

    def accepted(self, n: int, hidden: Tensor | None, top: Ranked | None) -> None:
        # The cache holds the committed text + d1..d(k-1); keep only what the target kept.
        crop_to(self.cache, min(self.cache.get_seq_length(), self.committed + n))


class NgramDrafter:
    """Prompt lookup: find an earlier occurrence of the last n tokens (then n-1, … 1) in prompt + output and
    propose what followed it. Which occurrence (`match`):

    - `earliest`: the first (transformers' prompt lookup);
    - `latest`: the most recent;
    - `longest`: of the last `CANDIDATES` occurrences, the one whose preceding text agrees furthest back with the
      text before the current n-gram (up to `LOOKBACK` tokens; a tie goes to the latest): the longest match.

    An index per n-gram size keeps each lookup O(1) in the length of the text.
    """

    wants_hidden = ()
    wants_top = 0
    CANDIDATES = 16  # occurrences `longest` compares: bounded, so a lookup costs the same however long the text
    LOOKBACK = 64  # tokens of agreement `longest` counts before calling two occurrences equal

    def __init__(self, n: int, match: str = DEFAULT_MATCH) -> None:
        if match not in NGRAM_MATCHES:
            raise ValueError(f'unknown prompt-lookup match "{match}"; use one of {", ".join(NGRAM_MATCHES)}')
        self.n = n
        self.match = match
        self.calls = 0
        self.seen: list[int] = []
        # follows[m-1]: each m-gram seen -> where the continuation of its chosen occurrence starts in `seen`
        # (`longest`: of its last CANDIDATES occurrences, oldest first)
        self.follows: list[dict[tuple[int, ...], int | deque[int]]] = []

    def _index(self, index: dict, gram: tuple[int, ...], start: int) -> None:
        if self.match == "latest":
            index[gram] = start
        elif self.match == "earliest":
            index.setdefault(gram, start)
        else:
            index.setdefault(gram, deque(maxlen=self.CANDIDATES)).append(start)

    def _extend(self, new: list[int]) -> None:
        for token in new:
            j = len(self.seen)
            for m in range(1, self.n + 1):
                if j >= m:
                    self._index(self.follows[m - 1], tuple(self.seen[j - m : j]), j)
            self.seen.append(token)

    def _agreement(self, start: int, m: int) -> int:
        """How many tokens before the occurrence ending at `start` equal those before the current m-gram."""
        seen, end, n = self.seen, len(self.seen) - m, 0
        while n < self.LOOKBACK and start - m - n > 0 and seen[start - m - n - 1] == seen[end - n - 1]:
            n += 1
        return n

    def _start(self, m: int) -> int | None:
        """Where the continuation of the chosen occurrence of the last m tokens starts, if they occurred before."""
        found = self.follows[m - 1].get(tuple(self.seen[-m:]))
        if found is None or self.match != "longest":
            return found
        return max(reversed(found), key=lambda start: self._agreement(start, m))  # max keeps the first: the latest

    def prefill(self, tokens: Tensor, hidden: Tensor | None, top: Ranked | None) -> None:
        self.seen, self.follows = [], [{} for _ in range(self.n)]
        self._extend(host(tokens))

    def propose(self, tokens: Tensor, k: int) -> Draft:
        self._extend(host(tokens[len(self.seen) :]))  # the text committed since: a round's second host sync
        self.calls += 1
        for m in range(self.n, 0, -1):
            start = self._start(m)
            if start is not None and k > 0:
                # `seen` mirrors `tokens`: slicing the device copy needs no host-to-device transfer.
                return Draft(tokens=tokens[start : start + k], q=None)
        return Draft(tokens=tokens[:0], q=None)

    def accepted(self, n: int, hidden: Tensor | None, top: Ranked | None) -> None:
        pass  # the committed text arrives with the next proposal


def _shallow(module: nn.Module) -> nn.Module:
    """A copy that shares every parameter but owns its list of submodules."""
    clone = copy.copy(module)
    clone._modules = dict(module._modules)  # copy.copy would share this dict with the original
    return clone


def _replaced(module: nn.Module, path: list[str], new: nn.Module, configs: dict[int, object]) -> nn.Module:
    """Shallow copies of the modules on `path` with the last one replaced by `new`, each holding the copied
    config where it held the original (`configs`: id of the original -> its copy)."""
    if not path:
        return new
    clone = _shallow(module)
    clone._modules[path[0]] = _replaced(module._modules[path[0]], path[1:], new, configs)
    if id(getattr(clone, "config", None)) in configs:
        clone.config = configs[id(clone.config)]
    return clone


def layer_skip(model: PreTrainedModel, layers: int) -> PreTrainedModel:
    """The target's first `layers` decoder layers plus its final norm and LM head, sharing the weights.

    The decoder may sit deep inside a multimodal wrapper (Gemma-3 4B+, Mistral-3, Llama-4 load as
    `*ForConditionalGeneration`, the text decoder at `model.language_model`): the copy replaces it where it is,
    and shortens the decoder's own config, not the wrapper's.
    """
    decoder = model.get_decoder()
    total = len(getattr(decoder, "layers", ()))
    if total == 0:
        raise ValueError(f"layerskip needs a decoder with .layers; {type(model).__name__} has none")
    if not 1 <= layers < total:
        raise ValueError(f"layerskip:L needs 1 <= L < {total} (the target's layer count), got {layers}")
    config = copy.deepcopy(model.config)
    text = config.get_text_config(decoder=True)  # the config itself for a plain causal LM
    text.num_hidden_layers = layers
    if getattr(text, "layer_types", None):
        text.layer_types = text.layer_types[:layers]
    short_decoder = _shallow(decoder)
    short_decoder.layers = nn.ModuleList(decoder.layers[:layers])
    path = next(name for name, module in model.named_modules() if module is decoder).split(".")
    configs = {id(model.config): config, id(model.config.get_text_config(decoder=True)): text}
    draft = _replaced(model, path, short_decoder, configs)
    short_decoder.config = text
    draft.config = config
    draft.generation_config = copy.deepcopy(model.generation_config)  # its own, not the target's object
    return draft
