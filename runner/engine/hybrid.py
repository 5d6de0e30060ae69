"""`hybrid:<head>`: prompt lookup's branches and the head's dynamic tree, merged into one tree.

Prompt lookup is right when the text repeats itself (summaries, code edits) and a head when it does not. As
SAM-Decoding drafts its suffix automaton's continuation whenever the match is long enough and EAGLE-2 otherwise:
when the last n tokens occurred before (n = 3, the longest n-gram prompt lookup tries), the trie of what followed
those n tokens drafts alone, and the head only reads the target's features the next time it drafts; otherwise one
verify pass judges both, the lookup's trie (every shorter match's continuations too) in up to half the nodes, the
head's EAGLE-2 tree in the rest, a head node whose branch the trie holds being the same node.

The head keeps its share only while it pays. After each round it drafted, its gain is how much further the accepted
path went than the lookup's part of the tree would have taken it, and the lookup's own is that part's depth plus
the correction. A head round costs the head's passes and the rows of its nodes: its price is how much longer the
rounds the head drafted in took than those the lookup drafted alone, as a share of the latter (each round timed from
one proposal to the next, so the pass and the loop count too; `GAIN_SHARE` until both kinds were timed). While the
head's gain is under its price times the lookup's own (running averages over recent rounds) the lookup drafts
alone, and the head tries again every `PROBE`-th round.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from runner.engine.drafters import Draft
from runner.engine.eagle_tree import EagleTreeDrafter
from runner.engine.heads import EagleHead
from runner.engine.ngram_tree import NgramTreeDrafter
from runner.engine.sampling import Decoding, Ranked, host
from runner.engine.trees import ROOT, as_parents, trie

GAIN_SHARE = 0.25  # the head's price, as a share of a round, until both kinds of round have been timed
PROBE = 8  # below the floor, the head still drafts every PROBE-th round, so a text that suits it wins it back
RECENT = 0.25  # the weight of the newest round in the running averages


def depth_along(tokens: list[int], parents: list[int], text: list[int]) -> int:
    """How many tokens of `text` follow one branch of the tree (tokens, parents) down from the root."""
    child = {(parent, token): j for j, (token, parent) in enumerate(zip(tokens, parents, strict=True))}
    at, depth = ROOT, 0
    while depth < len(text) and (at, text[depth]) in child:
        at = child[at, text[depth]]
        depth += 1
    return depth


def merge(first: tuple[list[int], list[int]], second: tuple[list[int], list[int]]) -> tuple[list[int], list[int]]:
    """The trie of two trees' branches (tokens, parents): `first`'s nodes, then `second`'s that it lacks."""
    tokens, parents = list(first[0]), list(first[1])
    child = {(parent, token): j for j, (token, parent) in enumerate(zip(tokens, parents, strict=True))}
    where: list[int] = []  # second's node j -> its node in the merge
    for token, parent in zip(*second, strict=True):
        at = ROOT if parent == ROOT else where[parent]
        if (at, token) not in child:
            child[at, token] = len(tokens)
            tokens.append(token)
            parents.append(at)
        where.append(child[at, token])
    return tokens, parents


class HybridDrafter:
    """`NgramTreeDrafter`'s continuations of a full-length match alone, or its whole trie alone while the head does
    not pay; else the trie's first `nodes` // 2 nodes, then `EagleTreeDrafter` filling the tree to `nodes`."""

    wants_top = 0

    def __init__(self, head: EagleHead, decoding: Decoding, generator: torch.Generator, n: int, nodes: int) -> None:
        if nodes < 2:
            raise ValueError(f"a hybrid tree needs at least two nodes (one for each draft), got {nodes}")
        self.lookup = NgramTreeDrafter(n, nodes=nodes)
        self.head = EagleTreeDrafter(head, decoding, generator, nodes=nodes)
        self.nodes = nodes
        self.wants_hidden = self.head.wants_hidden
        self.gain = 1.0  # tokens a round the head added, on average; it starts trusted
        self.own = 1.0  # tokens a round the lookup's part of the head rounds' trees took, on average
        self.skipped = 0  # rounds since the head last drafted
        self.clock = time.perf_counter
        self.seconds: dict[bool, float] = {}  # a round's seconds on average, by whether the head drafted in it
        self.last: tuple[bool, float] | None = None  # whether the head drafted the last round, and when it began
        # the last round the head drafted in: the lookup's part of its tree, where the text then ended, and the
        # accepted path's length once known
        self.judged: tuple[tuple[list[int], list[int]], int, int | None] | None = None

    @property
    def calls(self) -> int:
        return self.lookup.calls + self.head.calls

    def prefill(self, tokens: Tensor, hidden: Tensor | None, top: Ranked | None) -> None:
        self.lookup.prefill(tokens, hidden, top)
        self.head.prefill(tokens, hidden, top)
        self.gain, self.own, self.skipped, self.judged = 1.0, 1.0, 0, None
        self.seconds, self.last = {}, None

    @property
    def price(self) -> float:
        """How much longer a round the head drafted in takes than one the lookup drafted alone, as a share of it."""
        if len(self.seconds) < 2:
            return GAIN_SHARE
        return max(self.seconds[True] / self.seconds[False] - 1, 0.0)

    def propose(self, tokens: Tensor, k: int) -> Draft:
        now = self.clock()
        if self.last is not None:  # the last round ends as this one begins
            head, began = self.last
            mean = self.seconds.get(head, now - began)
            self.seconds[head] = mean + RECENT * (now - began - mean)
        branches = self.lookup.branches(tokens, k)
        self._learn()
        full = self.lookup.matched == self.lookup.n
        drafts, parents = trie(branches[: self.lookup.matches] if full else branches, self.nodes)
        self.last = None if k == 0 else (False, now)  # a round of no drafts is no lookup round
        if full or self.gain < self.price * self.own and self.skipped < PROBE - 1 or k == 0:
            self.skipped += 1
            return Draft(tokens=torch.tensor(drafts, dtype=tokens.dtype, device=tokens.device), q=None,
                         parents=as_parents(parents))
        self.skipped, self.last = 0, (True, now)
        looked = drafts[: self.nodes // 2], parents[: self.nodes // 2]  # a parent comes before its children
        self.judged = looked, tokens.numel(), None
        self.head.nodes = self.nodes - len(looked[0])
        ids, parents = self.head.tree(tokens, k)
        drafts, parents = merge(looked, (host(ids), parents))
        return Draft(tokens=torch.tensor(drafts, dtype=tokens.dtype, device=tokens.device), q=None,
                     parents=as_parents(parents))

    def _learn(self) -> None:
        """Fold the last head round's gain and the lookup's own into the averages, once the text it accepted has
        arrived."""
        if self.judged is None or self.judged[2] is None:
            return
        (looked, start, accepted), self.judged = self.judged, None
        own = depth_along(*looked, self.lookup.seen[start : start + accepted])
        self.gain += RECENT * (accepted - own - self.gain)
        self.own += RECENT * (own + 1 - self.own)

    def accepted(self, n: int, hidden: Tensor | None, top: Ranked | None) -> None:
        self.head.accepted(n, hidden, top)
        if self.judged is not None:
            self.judged = self.judged[0], self.judged[1], n
