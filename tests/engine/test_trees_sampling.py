"""Speculative sampling over a tree keeps the target's law exactly: on hand-built p and q, and end to end with
`ngram-tree` and `recycling` on a tiny target whose two-token law is computed by full forward passes. Each test has
a negative control: without the residual update between siblings the same test fails."""

from __future__ import annotations

import pytest
import torch

from runner.engine.drafters.ngram_tree import NgramTreeDrafter
from runner.engine.drafters.recycling import RecyclingDrafter
from runner.engine.round import trees
from runner.engine.round.decode import generate
from runner.engine.round.decoding_rule import Decoding
from runner.engine.weights.models import Loaded
from tests.helpers.laws import pooled_chisquare, samples_p_value, two_token_law
from tests.helpers.tiny import tiny_llama

# The target's law at the rows [root, n0, n1, n2, n3, n4] of the tree root → n0, n1; n0 → n2, n3; n1 → n4.
P = torch.tensor([[0.5, 0.25, 0.15, 0.1], [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25],
                  [0.4, 0.3, 0.2, 0.1], [0.7, 0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.7]])
PARENTS = (-1, -1, 0, 0, 1)
Q_ROOT, Q_NEXT = torch.tensor([0.1, 0.6, 0.2, 0.1]), torch.tensor([0.4, 0.3, 0.2, 0.1])


def _no_residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The bug the negative controls plant: a rejected sibling leaves p as it was."""
    return p


def _rounds(sampled: bool, n: int) -> tuple[list[int], list[int]]:
    """n rounds over the tree: the first emitted token, and the second when n0 was accepted first."""
    gen = torch.Generator().manual_seed(99)
    first, after_n0 = [], []
    for _ in range(n):
        if sampled:  # each node drawn independently from its q row: siblings may repeat a token
            q = torch.stack([Q_ROOT, Q_ROOT, Q_NEXT, Q_NEXT, Q_NEXT])
            tokens = torch.multinomial(q, 1, generator=gen).view(-1).tolist()
        else:  # deterministic: distinct siblings, a point mass each
            q, tokens = None, [1, 3, 2, 0, 0]
        kids = trees.children(tokens, PARENTS, distinct=not sampled)
        path, token, _ = trees.accept_sampled(kids, tokens, q, P, gen)
        emitted = [tokens[j] for j in path] + [int(token)]
        first.append(emitted[0])
        if path[:1] == [0]:
            after_n0.append(emitted[1])
    return first, after_n0


@pytest.mark.parametrize("sampled", [False, True], ids=["point-mass-drafts", "sampled-drafts"])
def test_sampling_over_siblings_emits_the_targets_law(sampled):
    first, after_n0 = _rounds(sampled, 6000)
    assert samples_p_value(first, P[0]) > 1e-3
    assert len(after_n0) > 500 and samples_p_value(after_n0, P[1]) > 1e-3  # n0's row: the law after n0's token


@pytest.mark.parametrize("sampled", [False, True], ids=["point-mass-drafts", "sampled-drafts"])
def test_without_the_residual_between_siblings_the_same_test_fails(monkeypatch, sampled):
    monkeypatch.setattr(trees, "residual", _no_residual)
    first, _ = _rounds(sampled, 6000)
    assert samples_p_value(first, P[0]) < 1e-6


VOCAB = 8
SCALE = 0.15  # the head's weights: how peaked each row's law is
# Every token is followed by three different ones somewhere, so after any first token the lookup's tree branches.
PROMPT = [1, 2, 3, 4, 5, 6, 7, 0, 1, 3, 5, 7, 2, 4, 6, 0, 2, 5, 0, 3, 6, 1, 4, 7, 1]


def _target() -> Loaded:
    """A vocabulary of 8 with an untied head small enough that every row's law is spread over several tokens."""
    model = tiny_llama(VOCAB, seed=11)
    model.generation_config.eos_token_id = 99  # outside the vocabulary: never stops early
    weight = model.lm_head.weight
    model.lm_head.weight = torch.nn.Parameter(torch.randn(weight.shape, generator=torch.Generator().manual_seed(12))
                                              * SCALE)
    return Loaded("tiny-tree-target", model, None, torch.device("cpu"), torch.float32)


DRAFTERS = {  # each drafts a real tree in the first round after any first token
    "ngram-tree": lambda: NgramTreeDrafter(1, nodes=16),
    "recycling": lambda: RecyclingDrafter(nodes=6, width=3),  # the prefill ranked every token: all have a row
}


def _two_token_counts(target: Loaded, decoding: Decoding, n: int, drafter: str) -> tuple[torch.Tensor, int]:
    """Counts of the two tokens after the prefill's, each run one tree round of depth 2 (and one more round when
    that round emitted one token only); how many rounds drafted a branching tree."""
    counts, branching = torch.zeros(VOCAB, VOCAB), 0
    for seed in range(n):
        gen = torch.Generator().manual_seed(seed)
        run = generate(target, DRAFTERS[drafter](), PROMPT, 2, decoding, 3, gen)
        counts[run.output_tokens[1], run.output_tokens[2]] += 1
        branching += run.rounds[0].draft_parents is not None
    return counts.view(-1), branching


@pytest.mark.parametrize("drafter", list(DRAFTERS))
@pytest.mark.parametrize("exact", [True, False], ids=["exact", "no-residual"])
def test_tree_sampling_matches_the_targets_two_token_law(monkeypatch, exact, drafter):
    target, decoding, n = _target(), Decoding("sample", 1.0, 1.0), 2500
    if not exact:
        monkeypatch.setattr(trees, "residual", _no_residual)
    counts, branching = _two_token_counts(target, decoding, n, drafter)
    pvalue, outcomes = pooled_chisquare(counts, two_token_law(target, PROMPT, VOCAB, decoding), n)
    assert branching == n and outcomes >= 20  # every first round was a real tree; the law is spread
    assert pvalue > 1e-3 if exact else pvalue < 1e-6
