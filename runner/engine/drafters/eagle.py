"""`eagle:<dir>`: a draft head that reads the target's hidden states and drafts from its own small KV cache.

Alignment (EAGLE): the head's position i holds the pair (target features of position i, token i+1) and predicts
token i+2. After a verify pass the target has features for every committed position but the newest, so the
head's cache holds committed-1 pairs, and its output at the last one proposes the first draft; each further
draft feeds the head its own output with the draft just proposed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.draft import Draft, unsure
from runner.engine.round.sampling import Ranked, draw, probabilities
from runner.engine.weights import head_files
from runner.engine.weights.heads import EagleHead
from runner.engine.weights.models import Loaded

START_CAPACITY = 256  # cache positions allocated at first; doubled when a longer text needs more


class KVBuffer:
    """The head's keys and values, preallocated so that appending never copies the past; rolling back is a length."""

    def __init__(self) -> None:
        self.k: Tensor | None = None  # (1, KV, capacity, d)
        self.v: Tensor | None = None
        self.length = 0

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add (1, KV, T, d) keys and values; returns everything cached, these included."""
        end = self.length + k.shape[2]
        if self.k is None or end > self.k.shape[2]:
            capacity = max(end, START_CAPACITY, 2 * (0 if self.k is None else self.k.shape[2]))
            grown_k, grown_v = (k.new_zeros(*k.shape[:2], capacity, k.shape[3]) for _ in range(2))
            if self.k is not None:
                grown_k[:, :, : self.length], grown_v[:, :, : self.length] = self.k[:, :, : self.length], \
                    self.v[:, :, : self.length]
            self.k, self.v = grown_k, grown_v
        self.k[:, :, self.length : end], self.v[:, :, self.length : end] = k, v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]


class EagleDrafter:
    """Drafts with an `EagleHead`; sampling draws from q over the target's full vocabulary, zero outside the
    draft vocabulary, so speculative sampling stays exact."""

    wants_top = 0

    def __init__(self, head: EagleHead, decoding: Decoding, generator: torch.Generator,
                 stop_below: float | None = None) -> None:
        self.head = head
        self.stop_below = stop_below  # the confidence policy's threshold: stop after a draft less likely than this
        self.wants_hidden = head.target_layers
        self.decoding = decoding
        self.generator = generator
        self.draft_ids = head.draft_ids  # (Vd,) target id of each draft row
        self.calls = 0
        self.caches = [KVBuffer() for _ in range(head.config.num_layers)]  # one per decoder layer of the head
        self.settled = 0  # pairs in the cache built from the target's own features (the rest are drafts)
        self.features: Tensor | None = None  # (m, n·H) target features the head has not read yet
        self.hidden: Tensor | None = None  # (1, 1, h) what the head feeds itself after its newest position
        self.next_logits: Tensor | None = None  # (Vd,) its scores for the token that follows

    def prefill(self, tokens: Tensor, hidden: Tensor | None, top: Ranked | None) -> None:
        self.settled, self.features = 0, hidden
        self.caches = [KVBuffer() for _ in self.caches]

    def accepted(self, n: int, hidden: Tensor | None, top: Ranked | None) -> None:
        # Read on the next proposal, so that its cost counts as drafting time; a round that drafted without the head
        # (`hybrid`) leaves the features of earlier rounds unread, and these follow them.
        self.features = hidden if self.features is None else torch.cat([self.features, hidden])

    def propose(self, tokens: Tensor, k: int) -> Draft:
        self._catch_up(tokens)
        drafted, qs = [], []
        for i in range(k):
            token, q = self._choose()
            drafted.append(token)
            if q is not None:
                qs.append(q)
            if i + 1 < k and unsure(self.next_logits, q, self.stop_below):
                break
            if i + 1 < k:
                self._forward(self.hidden, token.view(1, 1), self.settled + i)
        if not drafted:
            return Draft(tokens=tokens[:0], q=None)
        return Draft(tokens=torch.cat(drafted), q=torch.stack(qs) if qs else None)

    def _catch_up(self, tokens: Tensor) -> None:
        """Drop the drafts from the cache, then read the target's features of the newly committed positions."""
        features, start = self.features, self.settled
        assert features is not None and start + features.shape[0] == tokens.numel() - 1
        for cache in self.caches:
            cache.length = start
        following = tokens[start + 1 : start + 1 + features.shape[0]]  # token i+1 goes with features of position i
        self._forward(self.head.fuse(features)[None], following[None], start)
        self.settled, self.features = start + features.shape[0], None

    def _forward(self, hidden: Tensor, tokens: Tensor, start: int) -> None:
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)[None]
        out = self.head.step(hidden, tokens, positions, self._attend)  # (1, T, h)
        self.calls += 1
        self.hidden = self.head.feedback(out[:, -1:])
        self.next_logits = self.head.logits(out[0, -1])

    @property
    def cached(self) -> int:
        """Positions in the head's caches (every layer holds the same ones)."""
        return self.caches[0].length

    def _attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        start = self.caches[layer].length
        keys, values = self.caches[layer].append(k, v)
        rows = q.shape[2]
        # Row t sees every cached position up to its own (start + t).
        mask = None if rows == 1 else (
            torch.arange(keys.shape[2], device=q.device)[None] <= start + torch.arange(rows, device=q.device)[:, None])
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)

    def _choose(self) -> tuple[Tensor, Tensor | None]:
        """The next draft (1,) as a target id, and when sampling its q (V,) over the full vocabulary."""
        if self.decoding.greedy:
            return self.draft_ids[self.next_logits.argmax()].view(1), None
        full = self.next_logits.new_full((self.head.config.vocab_size,), float("-inf"))
        full[self.draft_ids] = self.next_logits
        q = probabilities(full, self.decoding)
        return draw(q, self.generator), q


def load_head(target: Loaded, source: str) -> EagleHead:
    """An EAGLE draft head (a directory or repo id) on the target's device and dtype, reading the target's
    embeddings; refused (`head_files.check`) unless it fits the target."""
    checked = head_files.check(source, target.model.config)
    return head_files.load(checked, target.model.get_input_embeddings(), target.device, target.dtype)
