"""`medusa:<head>` and `medusa-tree:<head>`: Medusa-1 heads (Cai et al. 2024) over the target's last hidden state.

Each head is a few residual blocks (x + SiLU(W x + b)) and an LM head, its own or the target's. All heads read the
same vector: the target's final normed hidden state (what its own LM head reads) at the position whose logits made
the newest committed token. The target's LM head there made that token; head i guesses the token i + 1 places after
it. So head 0 gives the first draft, head 1 the second, …: one small pass per round, no cache, no feedback.

Both drafts are deterministic functions of the committed text (q None): greedy and sampled rounds judge them as
point masses, which keeps speculative sampling exact.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from runner.engine.round.draft import Draft
from runner.engine.round.sampling import Ranked, host
from runner.engine.round.trees import ROOT, as_parents
from runner.engine.weights import medusa_files
from runner.engine.weights.medusa_heads import FINAL_NORMED, MedusaHeads
from runner.engine.weights.models import Loaded

TOP = 8  # candidates per head a tree chooses among


class MedusaDrafter:
    """A chain: the likeliest token of each of the first k heads (k beyond the heads drafts as many as there are)."""

    wants_hidden = (FINAL_NORMED,)
    wants_top = 0

    def __init__(self, heads: MedusaHeads) -> None:
        self.heads = heads
        self.calls = 0
        self.last: Tensor | None = None  # (H,) the hidden state that made the newest committed token

    def prefill(self, tokens: Tensor, hidden: Tensor | None, top: Ranked | None) -> None:
        self.last = hidden[-1]  # the prompt's last position made the prefill's token

    def accepted(self, n: int, hidden: Tensor | None, top: Ranked | None) -> None:
        self.last = hidden[-1]  # the last kept row (the root, or the last accepted draft) made the round's token

    def logits(self, k: int) -> Tensor:
        """(min(k, heads), V): what the first k heads say after the newest committed token."""
        self.calls += 1
        return self.heads(self.last)[:k]

    def propose(self, tokens: Tensor, k: int) -> Draft:
        if k == 0:
            return Draft(tokens=tokens[:0], q=None)
        return Draft(tokens=self.logits(k).argmax(-1), q=None)


class MedusaTreeDrafter(MedusaDrafter):
    """A sparse tree over the heads' top candidates, the likeliest combinations first.

    A node at depth d is a choice of ranks (r1, …, rd): head j's r_j-th likeliest token at depth j + 1. Its score is
    the product of those probabilities (the heads taken as independent, as Medusa's tree construction takes them).
    The tree is the `nodes` best-scoring nodes up to depth k; no factor exceeds 1, so a node never outscores its
    parent, and the best nodes always hold their ancestors (ties go to the parent, made first). Siblings are
    different ranks of one head: distinct tokens.
    """

    def __init__(self, heads: MedusaHeads, nodes: int, top: int = TOP) -> None:
        super().__init__(heads)
        if nodes < 1 or top < 1:
            raise ValueError(f"a tree needs at least one node and one candidate per head, got {nodes} and {top}")
        self.nodes = nodes
        self.top = top

    def propose(self, tokens: Tensor, k: int) -> Draft:
        if k == 0:
            return Draft(tokens=tokens[:0], q=None)
        logits = self.logits(k)  # (D, V)
        logp, ids = F.log_softmax(logits.float(), -1).topk(min(self.top, self.nodes, logits.shape[-1]))  # (D, w)
        depth, width = logp.shape
        values = host(logp.flatten())  # one host read for the whole tree
        paths, parents = rank_tree([values[d * width : (d + 1) * width] for d in range(depth)], self.nodes)
        index = torch.tensor([[len(p) - 1, p[-1]] for p in paths], dtype=torch.long, device=ids.device)
        return Draft(tokens=ids[index[:, 0], index[:, 1]], q=None, parents=as_parents(parents))


def rank_tree(logp: list[list[float]], nodes: int) -> tuple[list[tuple[int, ...]], list[int]]:
    """The `nodes` likeliest rank paths under per-depth log-probabilities `logp[d][r]` (each row descending), in an
    order where a parent comes first, and each path's parent (an index into the paths, or ROOT)."""
    frontier: list[tuple[tuple[int, ...], float]] = [((), 0.0)]
    candidates: list[tuple[tuple[int, ...], float]] = []
    for row in logp:
        grown = [(path + (r,), score + lp) for path, score in frontier for r, lp in enumerate(row)]
        grown.sort(key=lambda c: -c[1])  # stable: among equal scores the earlier parent's, then the lower rank
        frontier = grown[:nodes]  # a best node's parent is among the best of its own depth
        candidates += frontier
    best = sorted(range(len(candidates)), key=lambda c: (-candidates[c][1], c))[:nodes]
    paths = [candidates[c][0] for c in sorted(best)]  # candidates were made depth by depth: parents first
    at = {path: i for i, path in enumerate(paths)}
    return paths, [at[p[:-1]] if len(p) > 1 else ROOT for p in paths]


def load_heads(target: Loaded, source: str) -> MedusaHeads:
    """Medusa heads (a directory or repo id) on the target's device and dtype, reading the target's LM head where
    they have none of their own; refused (`medusa_files.check`) unless they fit the target."""
    checked = medusa_files.check(source, target.model.config)
    return medusa_files.load(checked, target.model.get_output_embeddings().weight, target.vocab_size, target.device,
                             target.dtype)
