"""`recycling`: token recycling (Luo et al., 2024). No draft model and no training: the target's own likeliest
next tokens, kept from its earlier verify passes, are expanded into a tree.

After every verify pass, each fed token's row of an adjacency table becomes the target's `width` likeliest tokens
at that row, whether the token was kept or thrown (the candidates a plain round would discard are recycled). A round
expands the table from the newest committed token along a fixed tree of ranks: node (r1, …, rd) is the r_d-th
candidate after node (r1, …, r(d-1)). The fixed tree holds the `nodes` rank paths likeliest under a prior in which
the r-th candidate is kept with chance 2^-(r+1), at most k deep; a node whose token has no row yet is left out,
with its subtree.

The table starts with each generation from the prefill's ranking at every prompt position (the paper keeps it
across requests instead), so a run depends on its own text alone.
"""

from __future__ import annotations

import heapq
from functools import cache

import torch
from torch import Tensor

from runner.engine.drafters import Draft
from runner.engine.sampling import host
from runner.engine.trees import ROOT, as_parents

WIDTH = 8  # candidates kept per token (the paper's adjacency matrix keeps 8)


@cache
def rank_tree(nodes: int, depth: int, width: int) -> tuple[tuple[int, ...], ...]:
    """The fixed tree: the `nodes` rank paths of at most `depth` levels with the smallest sum(r) + levels (the
    prior's -log2), ties to the smaller path (compared rank by rank); a parent always before its children."""
    chosen: list[tuple[int, ...]] = []
    heap = [(1, (0,))]
    while heap and len(chosen) < nodes:
        cost, path = heapq.heappop(heap)
        chosen.append(path)
        if len(path) < depth:
            heapq.heappush(heap, (cost + 1, path + (0,)))  # its first child
        if path[-1] + 1 < width:
            heapq.heappush(heap, (cost + 1, path[:-1] + (path[-1] + 1,)))  # its next sibling
    return tuple(sorted(chosen, key=lambda p: (len(p), p)))


class RecyclingDrafter:
    """Token recycling over an adjacency table of the target's top `width` tokens after each token seen."""

    wants_hidden = ()

    def __init__(self, nodes: int, width: int = WIDTH) -> None:
        if nodes < 1 or width < 1:
            raise ValueError(f"a tree needs at least one node and one candidate per token, got {nodes} and {width}")
        self.nodes = nodes
        self.wants_top = width
        self.calls = 0
        self.table: dict[int, list[int]] = {}  # token -> the target's likeliest tokens after it, best first
        self.fed: list[int] = []  # the last verify pass's tokens: the root, then the drafts

    def prefill(self, tokens: Tensor, hidden: Tensor | None, top: Tensor | None) -> None:
        self.table, self.fed = {}, host(tokens[:-1])  # the prompt, whose every position the prefill ranked
        self.accepted(0, None, top)

    def propose(self, tokens: Tensor, k: int) -> Draft:
        self.calls += 1
        root = host(tokens[-1:])[0]
        drafts, parents = self.expand(root, k) if k > 0 else ([], [])
        self.fed = [root, *drafts]
        ids = torch.tensor(drafts, dtype=tokens.dtype, device=tokens.device)
        return Draft(tokens=ids, q=None, parents=as_parents(parents))

    def expand(self, root: int, k: int) -> tuple[list[int], list[int]]:
        """The tree's tokens and parents, following `rank_tree` from `root` through the table."""
        tokens: list[int] = []
        parents: list[int] = []
        node_of: dict[tuple[int, ...], int] = {}
        for path in rank_tree(self.nodes, k, self.wants_top):
            parent = ROOT if len(path) == 1 else node_of.get(path[:-1])
            if parent is None:
                continue  # its parent was left out
            after = self.table.get(root if parent == ROOT else tokens[parent], ())
            if path[-1] < len(after):
                node_of[path] = len(tokens)
                tokens.append(after[path[-1]])
                parents.append(parent)
        return tokens, parents

    def accepted(self, n: int, hidden: Tensor | None, top: Tensor | None) -> None:
        for token, candidates in zip(self.fed, host(top), strict=True):
            self.table[token] = candidates
