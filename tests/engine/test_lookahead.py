"""Lookahead decoding (`lookahead:W,N,G`, runner/engine/drafters/lookahead.py) and the extra rows it rides on: the
window's rows and mask against the reference's rule, the pool and the window worked by hand, extra rows never judged nor
counted, greedy output equal to plain decoding on SmolLM2, batches, and the sampled law by a chi-square test with a
negative control."""

from __future__ import annotations

import pytest
import torch

from runner.engine.drafters.lookahead import LookaheadDrafter, pass_rows, window_rows
from runner.engine.drafters.ngram_tree import NgramTreeDrafter
from runner.engine.drafters.registry import parse_draft
from runner.engine.pair import Pair
from runner.engine.round import trees
from runner.engine.round.decode import generate
from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.draft import Draft, NoDraft
from runner.engine.round.sampling import Ranked
from runner.engine.weights.models import encode_chat
from tests.engine.test_trees_sampling import PROMPT, VOCAB, _no_residual, _target
from tests.helpers.laws import pooled_chisquare, two_token_law

GREEDY = Decoding("greedy", 0.0, 1.0)


def test_lookahead_settings_are_parsed_and_a_pass_past_64_rows_is_refused():
    assert [(s.kind, s.arg, s.nodes) for s in map(parse_draft, ("lookahead", "lookahead:3,4,3"))] == [
        ("lookahead", "7,5,7", 28), ("lookahead", "3,4,3", 9)]
    # the default: a full window of 4 levels x 7 columns (the root its first) and 7 guesses of 4 tokens
    assert pass_rows(7, 5, 7) == 4 * 7 + 7 * 4 == 56
    # while filling, a window of N > W + 1 is widest before it is full: 4 levels of 5 columns, not 7 of 2
    assert pass_rows(2, 8, 1) == 20 + 7
    with pytest.raises(ValueError, match="up to 68 rows .* at most 64"):
        parse_draft("lookahead:8,5,9")
    for bad in ("lookahead:7,5", "lookahead:7,x,7", "lookahead:7,0,7", "lookahead:7,2,7"):
        with pytest.raises(ValueError, match="lookahead:7"):
            parse_draft(bad)
    with pytest.raises(ValueError, match="only a tree"):
        parse_draft("lookahead:nodes=8")


def _reference_sees(levels: list[list[int]]) -> torch.Tensor:
    """The reference's mask over [root, level 0, level 1, …] written from its rule, not from parents: (level l,
    column c) sees the root, level 0's columns 1..c and column c of levels 1..l (column 0 of level 0 is the root)."""
    cells = [(0, 0)] + [(0, c + 1) for c in range(len(levels[0]))]
    cells += [(lv, c) for lv in range(1, len(levels)) for c in range(len(levels[lv]))]
    sees = torch.zeros(len(cells), len(cells), dtype=torch.bool)
    for i, (lv, c) in enumerate(cells):
        for j, (lv2, c2) in enumerate(cells):
            sees[i, j] = (lv2 == 0 and c2 <= c) or (1 <= lv2 <= lv and c2 == c)
    return sees


def test_the_window_is_a_tree_whose_mask_and_positions_are_the_references():
    levels = [[11, 12], [20, 21, 22], [30, 31, 32]]  # W = 3, N = 4
    tokens, parents = window_rows(levels, base=2)  # after two draft nodes: extra row e is node 2 + e
    assert tokens == [11, 12, 20, 21, 22, 30, 31, 32]
    assert parents == [-1, 2, -1, 2, 3, 4, 5, 6]
    own_tokens, own = window_rows(levels, base=0)  # the window alone: its mask over [root, window rows]
    assert own_tokens == tokens
    assert torch.equal(trees.branch_mask(own), _reference_sees(levels))
    # position = root + level + column, as the reference places each row
    assert trees.depths(own) == [1, 2, 1, 2, 3, 2, 3, 4]


def _ids(values: list[int]) -> torch.Tensor:
    return torch.tensor(values)


def _top(values: list[list[int]]) -> Ranked:
    """The target's argmax at each verify row (the logits are not read)."""
    return Ranked(torch.tensor(values), torch.zeros(len(values), 1))


def test_the_pool_takes_the_prompts_ngrams_and_keeps_the_latest_g_per_first_token():
    drafter = LookaheadDrafter(window=3, ngram=4, guesses=2)
    drafter.prefill(_ids([1, 2, 3, 4, 5, 1, 2, 3, 6, 7]), None, None)  # the prompt, then the first new token 7
    assert drafter.pool[1] == [(2, 3, 4), (2, 3, 6)] and drafter.pool[2] == [(3, 4, 5), (3, 6, 7)]
    assert len(drafter.levels) == 1 and len(drafter.levels[0]) == 3 + 4 - 3
    assert set(drafter.levels[0]) <= {1, 2, 3, 4, 5, 6}  # drawn from the prompt
    drafter.add(1, (2, 3, 9))  # a full key drops its oldest
    drafter.add(1, (2, 3, 6))  # one already there moves last
    assert drafter.pool[1] == [(2, 3, 9), (2, 3, 6)]
    drafter.root = 1
    assert drafter.trie(3) == ([2, 3, 9, 6], [-1, 0, 1, 1])
    assert drafter.trie(2) == ([2, 3], [-1, 0])


def test_the_window_fills_then_steps_and_its_columns_become_ngrams():
    drafter = LookaheadDrafter(window=3, ngram=4, guesses=4)
    text = _ids([1, 2, 3, 4, 5, 1, 2, 3, 6, 7])
    drafter.prefill(text, None, None)
    drafter.levels = [[40, 41, 42, 43]]  # W + N - 3 tokens, as drawn
    draft = drafter.propose(text, 3)  # root 7: no n-gram starts with it, so the window alone
    assert draft.tokens.tolist() == [] and draft.extra.tolist() == [40, 41, 42, 43]
    assert trees.pass_parents(draft) is None  # a window of one level is a chain under the root
    drafter.accepted(0, None, _top([[0], [50], [51], [52], [53]]))  # top-1 at the root and the 4 rows
    assert drafter.levels == [[41, 42, 43], [50, 51, 52, 53]]
    draft = drafter.propose(text, 3)
    assert draft.extra.tolist() == [41, 42, 43, 50, 51, 52, 53] and draft.extra_parents == (-1, 0, 1, -1, 0, 1, 2)
    drafter.accepted(0, None, _top([[0]] * 4 + [[60], [61], [62], [63]]))  # only the top level's rows are read
    assert drafter.levels == [[42, 43], [51, 52, 53], [61, 62, 63]]  # full: N - 1 levels, W - 1 then W columns
    text = _ids([*text.tolist(), 8])  # the round committed 8: the next root
    draft = drafter.propose(text, 3)
    assert trees.depths(trees.pass_parents(draft))[-3:] == [2, 3, 4]
    drafter.accepted(0, None, _top([[0]] * 6 + [[70], [71], [72]]))
    assert drafter.pool[8] == [(51, 61, 70)] and drafter.pool[42][-1] == (52, 62, 71)
    assert drafter.pool[43][-1] == (53, 63, 72)
    assert drafter.levels == [[52, 53], [61, 62, 63], [70, 71, 72]]  # one level down, whatever was accepted


class WithRows:
    """A tree drafter whose drafts carry extra rows of arbitrary tokens: they must change nothing."""

    wants_hidden = ()
    wants_top = 0

    def __init__(self) -> None:
        self.inner = NgramTreeDrafter(2, nodes=6)
        self.calls = 0

    def prefill(self, tokens, hidden, top) -> None:
        self.inner.prefill(tokens, hidden, top)

    def propose(self, tokens, k) -> Draft:
        draft = self.inner.propose(tokens, k)
        n = draft.tokens.numel()
        extra = torch.tensor([3, 1, 4, 1, 5], dtype=tokens.dtype)
        return Draft(draft.tokens, None, draft.parents, extra, (-1, n, n + 1, -1 if n == 0 else 0, n))

    def accepted(self, n, hidden, top) -> None:
        self.inner.accepted(n, hidden, top)


def _rounds(run) -> list[tuple]:
    return [(r.k, r.accepted, r.rejected, r.thrown, r.draft_tokens, r.target_tokens, r.draft_parents)
            for r in run.rounds]


def test_extra_rows_are_never_judged_counted_or_kept(tiny):
    prompt = [5, 9, 14, 5, 9, 14, 5, 9, 14, 5]
    plain = generate(tiny, NgramTreeDrafter(2, nodes=6), prompt, 3, GREEDY, 24, torch.Generator())
    extra = generate(tiny, WithRows(), prompt, 3, GREEDY, 24, torch.Generator())  # the cache check runs each round
    assert extra.output_tokens == plain.output_tokens and _rounds(extra) == _rounds(plain)
    assert any(r.accepted for r in extra.rounds)
    # but the pass carried them: the root, the nodes and the 5 extra rows (`rounds.pass_rows`)
    assert [r.pass_rows for r in extra.rounds] == [1 + len(r.draft_tokens) + 5 for r in plain.rounds]
    assert [r.pass_rows for r in plain.rounds] == [1 + len(r.draft_tokens) for r in plain.rounds]


def test_greedy_lookahead_equals_plain_greedy_on_smollm2(smollm2):
    specs = [parse_draft("lookahead"), parse_draft("lookahead:3,4,3")]
    pair = Pair(smollm2, specs)
    accepted = 0
    for text in ("Summarise: the river rose, the town moved uphill, and the river fell again.",
                 "Write a Python function that returns the squares of a list of numbers.",
                 "Repeat three times: red, green, blue."):
        prompt = encode_chat(smollm2, text)
        expected = generate(smollm2, NoDraft(), prompt, 0, GREEDY, 32, torch.Generator()).output_tokens
        for spec in specs:
            run = pair.run(spec, prompt, 4, GREEDY, 32, seed=0)
            assert run.output_tokens == expected, (text, spec.text)
            # only the drafts are counted: k is the trie's nodes, at most G guesses of min(k, N - 1) tokens
            assert all(r.accepted + r.rejected + r.thrown == r.k == len(r.draft_tokens) <= spec.nodes
                       and r.depth <= 4 for r in run.rounds)
            accepted += sum(r.accepted for r in run.rounds)
    assert accepted > 0


def test_a_batch_of_lookahead_sequences_decodes_as_each_alone(tiny):
    spec = parse_draft("lookahead:3,4,3")
    pair = Pair(tiny, [spec], "stock")
    prompts = [[5, 9, 14, 5, 9, 14, 5, 9], [301, 7], [42, 43, 44, 42, 43, 44, 42]]
    alone = [pair.run(spec, p, 3, GREEDY, 20, seed=3) for p in prompts]
    together = pair.run_batch(spec, prompts, 3, GREEDY, 20, seed=3)
    assert [g.output_tokens for g in together] == [a.output_tokens for a in alone]
    assert [_rounds(g) for g in together] == [_rounds(a) for a in alone]
    # each member's rows, its window included, as alone: at most the widest window (3 levels of 3 while filling, the
    # root one of them) and 3 guesses of 3
    rows = [[r.pass_rows for r in g.rounds] for g in together]
    assert rows == [[r.pass_rows for r in a.rounds] for a in alone]
    assert max(max(r) for r in rows) <= pass_rows(3, 4, 3) == 3 * 3 + 3 * 3
    assert all(r.pass_rows > 1 + r.k for g in together for r in g.rounds if r.k)  # a drafting pass carries its window


def _two_token_counts(target, decoding: Decoding, n: int) -> tuple[torch.Tensor, int]:
    """Counts of the two tokens after the prefill's over n seeded runs, each one round of depth 2 (and one more when
    it emitted one token only); how many first rounds drafted a branching tree."""
    counts, branching = torch.zeros(VOCAB, VOCAB), 0
    for seed in range(n):
        run = generate(target, LookaheadDrafter(2, 3, 3), PROMPT, 2, decoding, 3, torch.Generator().manual_seed(seed))
        counts[run.output_tokens[1], run.output_tokens[2]] += 1
        branching += run.rounds[0].draft_parents is not None
    return counts.view(-1), branching


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "no-residual"])
def test_sampled_lookahead_matches_the_targets_two_token_law(monkeypatch, exact):
    target, decoding, n = _target(), Decoding("sample", 1.0, 1.0), 4000  # the control at 2500: p ~ 2e-5
    if not exact:
        monkeypatch.setattr(trees, "residual", _no_residual)
    counts, branching = _two_token_counts(target, decoding, n)
    pvalue, outcomes = pooled_chisquare(counts, two_token_law(target, PROMPT, VOCAB, decoding), n)
    assert branching == n and outcomes >= 20  # the prompt's 3-grams gave every first root several guesses
    assert pvalue > 1e-3 if exact else pvalue < 1e-6
