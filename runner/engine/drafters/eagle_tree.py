"""`eagle-tree:<head>`: EAGLE-2's dynamic draft tree, grown by the same head that drafts `eagle:<head>`'s chains.

Each level expands the frontier (the `width` most likely nodes so far, by cumulative draft probability) into each
node's `width` most likely children, in one head pass over the frontier; after k levels the `nodes` most likely of
all candidates form the tree. A child is never likelier than its parent, so the best `nodes` always hold their
ancestors (ties go to the earlier candidate: the parent).

The tree is a deterministic function of the committed text, so the round verifies it as a deterministic draft
(q None): exact under sampling too, with each node accepted with the target's own probability of it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from runner.engine.drafters.eagle import EagleDrafter
from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.draft import Draft
from runner.engine.round.sampling import host
from runner.engine.round.trees import ROOT, as_parents
from runner.engine.weights.heads import EagleHead

WIDTH = 4  # children per expanded node, and nodes expanded per level (EAGLE-2's top-k; it uses 10 on GPUs)


class EagleTreeDrafter(EagleDrafter):
    """Drafts a tree of at most `nodes` nodes, `k` levels deep, with k - 1 head passes of `width` rows each; with
    fewer nodes than levels or than `width`, min(k, nodes) - 1 passes of min(width, nodes) rows: N nodes reach at most
    N levels deep, and the N likeliest candidates hold the N likeliest of each level (a child is never likelier than
    its parent), so what the cut leaves out could never be chosen."""

    def __init__(self, head: EagleHead, decoding: Decoding, generator: torch.Generator,
                 nodes: int, width: int = WIDTH) -> None:
        super().__init__(head, decoding, generator)
        if nodes < 1 or width < 1:
            raise ValueError(f"a tree needs at least one node and one child per node, got {nodes} and {width}")
        self.nodes = nodes
        self.width = width

    def propose(self, tokens: Tensor, k: int) -> Draft:
        ids, parents = self.tree(tokens, k)
        return Draft(tokens=ids, q=None, parents=as_parents(parents))

    def tree(self, tokens: Tensor, k: int) -> tuple[Tensor, list[int]]:
        """The tree after the committed `tokens`: its tokens, as target ids on the device, and its parents."""
        self._catch_up(tokens)
        if k == 0:
            return tokens[:0], []
        width = min(self.width, self.nodes, self.head.config.draft_vocab_size)
        score, row = F.log_softmax(self.next_logits.float(), -1).topk(width)  # level 1: the root's children
        drafted, scores, parents = [row], [score], [torch.full_like(row, ROOT)]  # per level: draft rows, scores
        frontier = torch.arange(width, device=row.device)  # candidate ids of the nodes to expand
        hidden = self.hidden.expand(1, width, -1)  # (1, F, h) fed back from the output that chose each node
        ancestry: dict[int, list[int]] = {}  # candidate id -> the cache rows of it and its fed ancestors
        count = width
        for level in range(1, min(k, self.nodes)):
            ids = host(frontier)
            parent_of = host(torch.cat(parents)[frontier])
            rows = [self.cached + i for i in range(len(ids))]
            for node, parent, at in zip(ids, parent_of, rows, strict=True):
                ancestry[node] = (ancestry[parent] if parent != ROOT else []) + [at]
            out = self._forward_tree(hidden, self.draft_ids[torch.cat(drafted)[frontier]][None], ancestry, ids, level)
            logp = F.log_softmax(self.head.logits(out[0]).float(), -1)  # (F, Vd)
            child_score, child_row = logp.topk(width, dim=-1)  # (F, width)
            child_score = child_score + torch.cat(scores)[frontier][:, None]
            drafted.append(child_row.flatten())
            scores.append(child_score.flatten())
            parents.append(frontier.repeat_interleave(width))
            best = child_score.flatten().topk(min(width, child_score.numel())).indices
            frontier = count + best
            hidden = self.head.feedback(out[:, best // width])
            count += child_score.numel()
        return self._best(torch.cat(drafted), torch.cat(scores), torch.cat(parents))

    def _best(self, rows: Tensor, scores: Tensor, parents: Tensor) -> tuple[Tensor, list[int]]:
        """The `nodes` likeliest candidates, renumbered so that a parent comes before its children."""
        values = host(scores)
        parent_of = host(parents)
        order = sorted(range(len(values)), key=lambda c: (-values[c], c))[: self.nodes]
        chosen = sorted(order)  # candidates were made level by level: a parent's id is below its children's
        renumber = {c: i for i, c in enumerate(chosen)}
        new_parents = [ROOT if parent_of[c] == ROOT else renumber[parent_of[c]] for c in chosen]
        index = torch.tensor(chosen, dtype=torch.long, device=rows.device)
        return self.draft_ids[rows[index]], new_parents

    def _forward_tree(self, hidden: Tensor, tokens: Tensor, ancestry: dict[int, list[int]], ids: list[int],
                      level: int) -> Tensor:
        """One head pass over the frontier at depth `level`: each row sees the settled pairs, its ancestors' rows and
        itself, at the position its depth gives."""
        start = self.cached
        sees = torch.zeros(len(ids), start + len(ids), dtype=torch.bool, device=tokens.device)
        sees[:, : self.settled] = True
        for i, node in enumerate(ids):
            sees[i, ancestry[node]] = True

        def attend(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            keys, values = self.caches[layer].append(k, v)
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=sees, enable_gqa=True)

        positions = torch.full((1, len(ids)), self.settled + level - 1, device=tokens.device)
        out = self.head.step(hidden, tokens, positions, attend)
        self.calls += 1
        return out
