"""`hybrid:<head>`: prompt lookup's branches and the head's dynamic tree, merged into one tree.

Prompt lookup is right when the text repeats itself (summaries, code edits) and a head when it does not. As
SAM-Decoding chooses between its suffix automaton and EAGLE-2 by the match's length: when the last n tokens occurred
before (n = 3, the longest n-gram prompt lookup tries), the lookup's trie drafts alone, all the nodes, and the head
only reads the target's features the next time it drafts; otherwise one verify pass judges both, the lookup's trie
in up to half the nodes, the head's EAGLE-2 tree in the rest, a head node whose branch the trie holds being the
same node.
"""

from __future__ import annotations

import torch
from torch import Tensor

from runner.engine.drafters import Draft
from runner.engine.eagle_tree import EagleTreeDrafter
from runner.engine.heads import EagleHead
from runner.engine.ngram_tree import NgramTreeDrafter
from runner.engine.sampling import Decoding, host
from runner.engine.trees import ROOT, as_parents


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
    """`NgramTreeDrafter` alone after a full-length match; else its first `nodes` // 2 nodes, then `EagleTreeDrafter`
    filling the tree to `nodes`."""

    wants_top = 0

    def __init__(self, head: EagleHead, decoding: Decoding, generator: torch.Generator, n: int, nodes: int) -> None:
        if nodes < 2:
            raise ValueError(f"a hybrid tree needs at least two nodes (one for each draft), got {nodes}")
        self.lookup = NgramTreeDrafter(n, nodes=nodes)
        self.head = EagleTreeDrafter(head, decoding, generator, nodes=nodes)
        self.nodes = nodes
        self.wants_hidden = self.head.wants_hidden

    @property
    def calls(self) -> int:
        return self.lookup.calls + self.head.calls

    def prefill(self, tokens: Tensor, hidden: Tensor | None, top: Tensor | None) -> None:
        self.lookup.prefill(tokens, hidden, top)
        self.head.prefill(tokens, hidden, top)

    def propose(self, tokens: Tensor, k: int) -> Draft:
        drafts, parents = self.lookup.trie(tokens, k)
        if self.lookup.matched == self.lookup.n:
            return Draft(tokens=torch.tensor(drafts, dtype=tokens.dtype, device=tokens.device), q=None,
                         parents=as_parents(parents))
        looked = drafts[: self.nodes // 2], parents[: self.nodes // 2]  # a parent comes before its children
        self.head.nodes = self.nodes - len(looked[0])
        ids, parents = self.head.tree(tokens, k)
        drafts, parents = merge(looked, (host(ids), parents))
        return Draft(tokens=torch.tensor(drafts, dtype=tokens.dtype, device=tokens.device), q=None,
                     parents=as_parents(parents))

    def accepted(self, n: int, hidden: Tensor | None, top: Tensor | None) -> None:
        self.head.accepted(n, hidden, top)
