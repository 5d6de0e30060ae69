"""Tree drafts: many branches of drafts judged by one target pass.

A tree is its nodes' tokens and parents (`Draft.parents`): node j's parent is an earlier node, or -1 for the root,
the newest committed token. Node ids are topological (a parent comes before its children), so a chain is the tree
whose node j has parent j - 1; a draft of that shape is kept as a chain (parents None) and verified as one.

The verify pass feeds [root, node 0, …, node N-1] with a mask that lets each row see the committed text and its own
ancestors only, at the position of its depth: every branch is then judged as if it had been fed alone. A draft's
extra rows (`Draft.extra`, lookahead decoding's window) follow the nodes under the same mask, as more nodes of the
tree; only the root and the nodes are judged, and the rollback drops the extra rows with every other row not kept.

A custom mask replaces the model's own masking, sliding windows included, so a target with any cache layer other
than a plain full-attention one (Mistral, Gemma-2/3, Phi-3, gpt-oss) is refused with a ValueError: trees are not
built for those models yet, and their chains run as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.draft import Draft, crop_to
from runner.engine.round.sampling import draw, host, probabilities, residual

ROOT = -1  # the parent of a first-level node: the newest committed token, row 0 of the verify pass


def as_parents(parents: Sequence[int]) -> tuple[int, ...] | None:
    """The parents of a draft as `Draft.parents` keeps them: None when they make a chain. ValueError unless every
    parent comes before its child."""
    for j, parent in enumerate(parents):
        if not ROOT <= parent < j:
            raise ValueError(f"node {j} has parent {parent}: a parent must be an earlier node or {ROOT} (the root)")
    return None if all(parent == j - 1 for j, parent in enumerate(parents)) else tuple(parents)


def fed(draft: Draft, root: Tensor) -> Tensor:
    """The verify pass's rows: the root (1,), the draft's nodes, then its extra rows (`Draft.extra`)."""
    return torch.cat([root, draft.tokens] if draft.extra is None else [root, draft.tokens, draft.extra])


def pass_parents(draft: Draft) -> tuple[int, ...] | None:
    """The parents the verify pass's mask and positions are made from: the nodes', then the extra rows' (node ids
    numbered on from the nodes). None when all of it is a chain: the model's own causal mask then serves. ValueError
    unless every parent comes before its child."""
    if draft.extra is None:
        return draft.parents
    nodes = draft.parents if draft.parents is not None else tuple(range(-1, draft.tokens.numel() - 1))
    if len(draft.extra_parents) != draft.extra.numel():
        raise ValueError(f"{draft.extra.numel()} extra rows with {len(draft.extra_parents)} parents")
    return as_parents(nodes + draft.extra_parents)


def trie(branches: Iterable[Sequence[int]], limit: int | None = None) -> tuple[list[int], list[int]]:
    """Branches of tokens from the root merged as a trie: its nodes' tokens and parents, in the order first reached
    (a parent before its children). With `limit`, the trie stops growing at that many nodes."""
    tokens: list[int] = []
    parents: list[int] = []
    child: dict[tuple[int, int], int] = {}  # (parent, token) -> node
    for branch in branches:
        at = ROOT
        for token in branch:
            if (at, token) not in child:
                if len(tokens) == limit:
                    return tokens, parents
                child[at, token] = len(tokens)
                tokens.append(token)
                parents.append(at)
            at = child[at, token]
    return tokens, parents


def depths(parents: Sequence[int]) -> list[int]:
    """Each node's depth: 1 below the root, one more for each level down."""
    out: list[int] = []
    for parent in parents:
        out.append(1 if parent == ROOT else out[parent] + 1)
    return out


def children(tokens: Sequence[int], parents: Sequence[int], distinct: bool = True) -> list[list[int]]:
    """children[row]: the nodes whose parent sits at verify row `row` (0: the root, j + 1: node j), in node order.

    `distinct` (a deterministic draft): ValueError when two siblings carry the same token, since the second could
    never be accepted. Sampled siblings may repeat a token: each was drawn on its own.
    """
    kids: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for j, parent in enumerate(parents):
        if distinct and any(tokens[c] == tokens[j] for c in kids[parent + 1]):
            raise ValueError(f"node {j} repeats the token {tokens[j]} of a sibling")
        kids[parent + 1].append(j)
    return kids


def branch_mask(parents: Sequence[int]) -> Tensor:
    """(N+1, N+1) bool over the verify rows [root, node 0, …]: which of them each row may look at (the root, its own
    ancestors and itself). A chain's is lower-triangular."""
    n = len(parents)
    sees = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    sees[:, 0] = True  # 1. every row sees the root
    for j, parent in enumerate(parents):
        sees[j + 1, j + 1] = True  # 2. itself
        if parent != ROOT:
            sees[j + 1, 1 : j + 1] |= sees[parent + 1, 1 : j + 1]  # 3. its ancestors
    return sees


def attention_mask(parents: Sequence[int], past: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """(1, 1, N+1, past + N+1): 0 where a verify row may look (the `past` cached positions and its `branch_mask`),
    the dtype's minimum elsewhere (finite, so no row can turn into NaN)."""
    sees = torch.cat([torch.ones(len(parents) + 1, past, dtype=torch.bool), branch_mask(parents)], dim=1)
    mask = torch.full(sees.shape, torch.finfo(dtype).min, dtype=dtype)
    return mask.masked_fill(sees, 0.0)[None, None].to(device)


def position_ids(parents: Sequence[int], past: int, device: torch.device) -> Tensor:
    """(1, N+1): the root at position `past` (the committed length - 1), each node `depth` after it."""
    return (past + torch.tensor([0, *depths(parents)], dtype=torch.long, device=device))[None]


def accept_greedy(kids: list[list[int]], tokens: Sequence[int], choices: Sequence[int]) -> list[int]:
    """The accepted path (node ids from the root down): at each row, the child whose token is the target's argmax
    there (`choices`, one per verify row), as deep as it goes."""
    path: list[int] = []
    row = 0
    while (nxt := next((c for c in kids[row] if tokens[c] == choices[row]), None)) is not None:
        path.append(nxt)
        row = nxt + 1
    return path


def accept_sampled(kids: list[list[int]], tokens: Sequence[int], q: Tensor | None, p: Tensor,
                   generator: torch.Generator) -> tuple[list[int], Tensor, Test]:
    """Multi-candidate speculative sampling (SpecInfer; EAGLE's recursive rejection sampling): the accepted path
    and the token drawn after it, (1,) on p's device; the emitted text follows the target's law exactly.

    p: (N+1, V) the target's law at each verify row; q: (N, V) the law each node was drawn from, independently of
    its siblings (drawn without replacement, they would need another rule), or None for a deterministic draft,
    whose q is a point mass on the node's token.

    1. At a row its children are tried in order: child c is accepted with probability min(1, p(x_c) / q_c(x_c)).
    2. On a rejection p becomes norm(max(0, p - q_c)) and the next sibling is tried against that.
    3. Once all are rejected, the correction is drawn from what is left (after a leaf: from p itself, the bonus).
    Each step is one speculative-sampling step of the current law against an independent proposal, so the token
    that leaves a row follows that row's p exactly.

    The test records, per judged node in the order judged (ascending node ids), the law's and q's probability of its
    token and the uniform draw; the nodes follow from the parents and the path (the dashboard's `fates.judged_nodes`).
    """
    path: list[int] = []
    row = 0
    law = p[0]
    tested: list[Tensor] = []  # (3,) per judged node: law(x), q(x), u
    # After a refusal, whether the residual kept any mass (it falls back to p when none is left); read at the end
    # with the test, so recording it costs no host sync of its own.
    left = torch.zeros((), dtype=torch.bool, device=p.device)
    while True:
        for c in kids[row]:
            q_c = _point_mass(tokens[c], p) if q is None else q[c].to(p.dtype)
            u = torch.rand((), generator=generator, device=p.device)
            tested.append(torch.stack([law[tokens[c]], q_c[tokens[c]], u.to(p.dtype)]))
            if bool(u * q_c[tokens[c]] < law[tokens[c]]):
                path.append(c)  # r < p/q, written without dividing by a tiny q
                row = c + 1
                law = p[row]
                left = torch.zeros_like(left)
                break
            left = (law - q_c).clamp_min(0.0).sum() > 0
            law = residual(law, q_c)
        else:
            n = len(tested)
            judged = torch.stack(tested).T.reshape(-1) if tested else p.new_zeros(0)  # the p's, the q's, the u's
            values = host(torch.cat([judged.double(), left.double().view(1)]))
            test = Test(tuple(values[:n]), tuple(values[n : 2 * n]), tuple(values[2 * n : 3 * n]), bool(values[-1]))
            return path, draw(law, generator), test


@dataclass(frozen=True)
class Test:
    """The speculative-sampling test of a round's judged drafts, in draft order (`Round.draft_p` and friends)."""

    p: tuple[float, ...]  # the target's probability of each judged draft (a tree: of the law it was tested against)
    q: tuple[float, ...]  # the draft's
    u: tuple[float, ...]  # the uniform draw; accepted iff u < p / q
    from_residual: bool  # the round's own token was drawn from the residual norm(max(0, p − q)), not from p

    def columns(self) -> dict[str, object]:
        return {"draft_p": self.p, "draft_q": self.q, "draft_u": self.u, "from_residual": self.from_residual}


def _point_mass(token: int, p: Tensor) -> Tensor:
    return torch.nn.functional.one_hot(torch.tensor(token, device=p.device), p.shape[-1]).to(p.dtype)


@dataclass(frozen=True)
class Verdict:
    """What comparing a round's drafts with the target's pass decided (the round's step 3)."""

    drafts: list[int]  # the drafted tokens, on the host
    path: list[int]  # the accepted nodes from the root down; for a chain 0..accepted-1
    token: int  # the target's own token after the path: the correction, or the bonus after a leaf
    kept: Tensor  # (len(path) + 1,) the path's tokens and `token`, on the device
    # greedy: the target's argmax at every verify row; sampling: the path's tokens and `token`
    target_tokens: list[int]
    rejected: int  # 1 when the last accepted node still had children to judge (all failed); 0 at a leaf
    ok: bool  # the target's logits were finite
    test: Test | None = None  # sampling: the test of each judged draft


def verdict(draft: Draft, logits: Tensor, finite: Tensor, decoding: Decoding,
            generator: torch.Generator) -> Verdict:
    """Step 3 for a tree: the path the target accepts from the root down (`accept_greedy`, `accept_sampled`)."""
    if decoding.greedy:
        choices = logits.argmax(-1)  # (N+1,)
        *read, ok = host(torch.cat([draft.tokens, choices, finite]))
        drafts, target_tokens = read[: draft.tokens.numel()], read[draft.tokens.numel() :]
        kids = children(drafts, draft.parents, distinct=draft.q is None)
        path = accept_greedy(kids, drafts, target_tokens)
        token = target_tokens[path[-1] + 1 if path else 0]
    else:
        drafts = host(draft.tokens)
        kids = children(drafts, draft.parents, distinct=draft.q is None)
        path, drawn, test = accept_sampled(kids, drafts, draft.q, probabilities(logits, decoding), generator)
        token, ok = host(torch.cat([drawn, finite]))
    emitted = [drafts[j] for j in path] + [token]
    kept = torch.tensor(emitted, dtype=draft.tokens.dtype, device=draft.tokens.device)
    rejected = int(bool(kids[path[-1] + 1 if path else 0]))
    return Verdict(drafts, path, token, kept, target_tokens if decoding.greedy else emitted, rejected, bool(ok),
                   None if decoding.greedy else test)


def check_cache(cache: DynamicCache) -> None:
    """Refuse a target whose cache has layers a custom mask would get wrong (sliding windows, chunked or linear
    attention): only full-attention layers take a tree."""
    odd = sorted({type(layer).__name__ for layer in cache.layers if type(layer) is not DynamicLayer})
    if odd:
        raise ValueError(f"tree drafts need full-attention layers only; this model has {', '.join(odd)}")


def keep(cache: DynamicCache, past: int, rows: Sequence[int]) -> None:
    """After a verify pass over `past` cached positions + N+1 rows: keep the cached positions and, in this order,
    the fed `rows` (the root and the accepted path), dropping every other row.

    Rows that are the first len(rows) fed ones (always so for a chain) are a plain crop; any other choice gathers the
    kept rows of every layer and writes them, in place, after the cached positions, then crops: the cached positions
    are not copied (a gather of the whole sequence would copy them every round). Only full-attention layers allow
    it (`check_cache`).
    """
    if list(rows) == list(range(len(rows))):
        crop_to(cache, past + len(rows))
        return
    check_cache(cache)
    index, end = torch.tensor([past + r for r in rows], dtype=torch.long), past + len(rows)
    for layer in cache.layers:
        if layer.is_initialized:
            at = index.to(layer.keys.device)
            for stored in (layer.keys, layer.values):  # (B, heads, past + fed rows, head_dim)
                stored[:, :, past:end] = stored.index_select(2, at)  # gathered (a copy) before it is written
    crop_to(cache, end)
