"""`hybrid:<head>`: prompt lookup's branches and the head's dynamic tree, merged into one tree.

Prompt lookup is right when the text repeats itself (summaries, code edits) and a head when it does not, and one
verify pass can judge both: the lookup's trie takes up to half the nodes, the head's EAGLE-2 tree the rest, and a
head node whose branch the trie already holds is the same node.
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
    child = {(parent, token): j for j, (token, parent) in enumerate(zip(tokens, parents))}
    where: list[int] = []  # second's node j -> its node in the merge
    for token, parent in zip(*second):
        at = ROOT if parent == ROOT else where[parent]
        if (at, token) not in child:
            child[at, token] = len(tokens)
            tokens.append(token)
            parents.append(at)
        where.append(child[at, token])
    return tokens, parents


class HybridDrafter:
    """`NgramTreeDrafter` with at most `nodes` // 2 nodes, then `EagleTreeDrafter` filling the tree to `nodes`."""

    wants_top = 0

    def __init__(self, head: EagleHead, decoding: Decoding, generator: torch.Generator, n: int, nodes: int) -> None:
        if nodes < 2:
            raise ValueError(f"a hybrid tree needs at least two nodes (one for each draft), got {nodes}")
        self.lookup = NgramTreeDrafter(n, nodes=nodes // 2)
        self.head = EagleTreeDrafter(head, decoding, generator, nodes=nodes)
        self.nodes = nodes
        self.wants_hidden = self.head.wants_hidden

    @property
    def calls(self) -> int:
        return self.lookup.calls + self.head.calls

    def prefill(self, tokens: Tensor, hidden: Tensor | None) -> None:
        self.lookup.prefill(tokens, hidden)
        self.head.prefill(tokens, hidden)

    def propose(self, tokens: Tensor, k: int) -> Draft:
        looked = self.lookup.trie(tokens, k)
        self.head.nodes = self.nodes - len(looked[0])
        ids, parents = self.head.tree(tokens, k)
        drafts, parents = merge(looked, (host(ids), parents))
        return Draft(tokens=torch.tensor(drafts, dtype=tokens.dtype, device=tokens.device), q=None,
                     parents=as_parents(parents))

    def accepted(self, n: int, hidden: Tensor | None, top: Tensor | None) -> None:
        self.head.accepted(n, hidden, top)
