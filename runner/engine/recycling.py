"""`recycling`: token recycling (Luo et al., 2024). No draft model and no training: the target's own likeliest
next tokens, kept from its earlier verify passes, are expanded into a tree.

After every verify pass, each fed token's row of an adjacency table becomes the target's `width` likeliest tokens
at that row and their probabilities, whether the token was kept or thrown (the candidates a plain round would
discard are recycled). A round grows the tree from the newest committed token as EAGLE-2 grows its head's: best
first by cumulative probability (a node's is its parent's times its own in the row it came from), at most k deep,
until it holds `nodes` nodes; a token with no row yet has no children. The paper expands a fixed tree of ranks
instead; at the same number of nodes the recycled probabilities choose branches that go deeper
(bench/results/notes.md).

The table starts with each generation from the prefill's ranking at every prompt position (the paper keeps it
across requests instead), so a run depends on its own text alone. A prompt token's row puts first the token that
followed it in the prompt, at least as likely as the target's first candidate there: the text says what followed
where the target only guessed, and answers quote their prompts (a summary its source, code its names).
"""

from __future__ import annotations

import heapq
import itertools

import torch
from torch import Tensor

from runner.engine.drafters import Draft
from runner.engine.sampling import Ranked, host
from runner.engine.trees import ROOT, as_parents

WIDTH = 8  # candidates kept per token (the paper's adjacency matrix keeps 8)

Row = tuple[list[int], list[float]]  # the likeliest tokens after a token, best first, and their probabilities


def rows(top: Ranked) -> list[Row]:
    """Each verify row's candidates and probabilities, read from the device at once."""
    width = top.tokens.shape[-1]
    both = host(torch.cat([top.tokens.double(), top.probs.double()], dim=-1))
    return [([int(t) for t in row[:width]], row[width:]) for row in both]


def followed_by(row: Row, after: int) -> Row:
    """`row` with `after` first, as likely as the row's first candidate or as the target made it, whichever is more;
    the last candidate makes room when `after` was not among them."""
    tokens, probs = row
    if after in tokens:
        j = tokens.index(after)
        return [after, *tokens[:j], *tokens[j + 1 :]], [max(probs[j], probs[0]), *probs[:j], *probs[j + 1 :]]
    return [after, *tokens[:-1]], [probs[0], *probs[:-1]]


class RecyclingDrafter:
    """Token recycling over an adjacency table of the target's top `width` tokens after each token seen."""

    wants_hidden = ()

    def __init__(self, nodes: int, width: int = WIDTH) -> None:
        if nodes < 1 or width < 1:
            raise ValueError(f"a tree needs at least one node and one candidate per token, got {nodes} and {width}")
        self.nodes = nodes
        self.wants_top = width
        self.calls = 0
        self.table: dict[int, Row] = {}  # token -> the target's likeliest tokens after it
        self.fed: list[int] = []  # the last verify pass's tokens: the root, then the drafts

    def prefill(self, tokens: Tensor, hidden: Tensor | None, top: Ranked | None) -> None:
        text = host(tokens)  # the prompt, whose every position the prefill ranked, and the first new token
        self.table, self.fed = {}, []
        for token, after, row in zip(text[:-1], text[1:], rows(top), strict=True):
            self.table[token] = followed_by(row, after)  # a later occurrence replaces an earlier one

    def propose(self, tokens: Tensor, k: int) -> Draft:
        self.calls += 1
        root = host(tokens[-1:])[0]
        drafts, parents = self.expand(root, k) if k > 0 else ([], [])
        self.fed = [root, *drafts]
        ids = torch.tensor(drafts, dtype=tokens.dtype, device=tokens.device)
        return Draft(tokens=ids, q=None, parents=as_parents(parents))

    def expand(self, root: int, k: int) -> tuple[list[int], list[int]]:
        """The tree's tokens and parents: the `nodes` likeliest of the table's paths from `root`, at most k deep
        (a parent always before its children, since a child is never likelier; ties to the earlier candidate)."""
        tokens: list[int] = []
        parents: list[int] = []
        frontier: list[tuple[float, int, int, int, int]] = []  # (-probability, order, parent, depth, token)
        order = itertools.count()

        def children(parent: int, depth: int, chance: float) -> None:
            after, probs = self.table.get(root if parent == ROOT else tokens[parent], ((), ()))
            for token, p in zip(after, probs, strict=True):
                heapq.heappush(frontier, (-chance * p, next(order), parent, depth, token))

        children(ROOT, 1, 1.0)
        while frontier and len(tokens) < self.nodes:
            chance, _, parent, depth, token = heapq.heappop(frontier)
            tokens.append(token)
            parents.append(parent)
            if depth < k:
                children(len(tokens) - 1, depth + 1, -chance)
        return tokens, parents

    def accepted(self, n: int, hidden: Tensor | None, top: Ranked | None) -> None:
        for token, row in zip(self.fed, rows(top), strict=True):
            self.table[token] = row
