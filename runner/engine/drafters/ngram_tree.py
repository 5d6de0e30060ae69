"""Prompt lookup as a tree: every distinct continuation of the recent n-gram's earlier occurrences is a branch.

Where `NgramDrafter` copies one occurrence's continuation, `NgramTreeDrafter` merges several into a trie (branches
that start alike share their nodes), so the target can accept whichever one the text actually takes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from runner.engine.drafters.ngram import NgramDrafter
from runner.engine.round.draft import Draft
from runner.engine.round.sampling import host
from runner.engine.round.trees import as_parents, trie


class NgramTreeDrafter(NgramDrafter):
    """The trie of the continuations (each up to k tokens, k being the tree's depth) of the last n tokens' earlier
    occurrences, the most recent first, then of the last n-1 tokens' … down to 1, until it holds `nodes` nodes.

    Occurrences are indexed as `longest` indexes them: the last `CANDIDATES` of each n-gram, so a lookup costs the
    same however long the text. A trie that is a single branch is proposed as a chain.
    """

    def __init__(self, n: int, nodes: int) -> None:
        super().__init__(n, match="longest")
        if nodes < 1:
            raise ValueError(f"a tree needs at least one node, got {nodes}")
        self.nodes = nodes
        self.matched = 0  # how many of the last tokens the latest trie's longest match spans
        self.matches = 0  # how many of the latest branches continue that longest match (they come first)

    def _branches(self, k: int) -> list[list[int]]:
        """The continuations to merge, most recent occurrence of the longest n-gram first; `matched` becomes the
        longest m whose last m tokens occurred before (0: none), and `matches` the number of its occurrences."""
        branches = []
        self.matched = self.matches = 0
        for m in range(self.n, 0, -1):
            for start in reversed(self.follows[m - 1].get(tuple(self.seen[-m:]), ())):
                branches.append(self.seen[start : start + k])
                self.matched = max(self.matched, m)
            self.matches = self.matches or len(branches)
        return branches

    def branches(self, committed: Tensor, k: int) -> list[list[int]]:
        """The continuations after the `committed` tokens, in the order the trie merges them."""
        self._extend(host(committed[len(self.seen) :]))  # the text committed since
        self.calls += 1
        return self._branches(k)

    def trie(self, committed: Tensor, k: int) -> tuple[list[int], list[int]]:
        """The trie after the `committed` tokens: its nodes' tokens and parents, in the order they were added (a parent
        before its children)."""
        return trie(self.branches(committed, k), self.nodes)

    def propose(self, tokens: Tensor, k: int) -> Draft:
        drafts, parents = self.trie(tokens, k)
        ids = torch.tensor(drafts, dtype=tokens.dtype, device=tokens.device)
        return Draft(tokens=ids, q=None, parents=as_parents(parents))
