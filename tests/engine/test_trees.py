"""Tree drafts: the mask and positions of a hand-drawn tree, acceptance from the root down, the caches kept after a
tree round, one tree pass against its branches fed one by one, and greedy output against plain decoding."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, MistralConfig, MistralForCausalLM

from runner.engine.drafters.ngram_tree import NgramTreeDrafter
from runner.engine.drafters.registry import parse_draft
from runner.engine.drafters.spec import PLAIN
from runner.engine.pair import Pair
from runner.engine.round import trees
from runner.engine.round.clock import Clock
from runner.engine.round.decode import CachedTarget, CommittedText, generate, speculative_round
from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.draft import Draft, new_cache
from runner.engine.round.policies import parse_policy
from tests.helpers.tiny import greedy_without_cache

GREEDY = Decoding("greedy", 0.0, 1.0)
PROMPT = [5, 900, 31, 4471, 12, 808, 77, 3090, 31, 12]
# root → a, b; a → c, d; b → e, as node ids a=0, b=1, c=2, d=3, e=4
PARENTS = (-1, -1, 0, 0, 1)
TOKENS = [10, 11, 12, 13, 14]


def test_the_mask_lets_each_row_see_the_committed_text_its_ancestors_and_itself():
    mask = trees.attention_mask(PARENTS, past=2, dtype=torch.float32, device=torch.device("cpu"))
    low = torch.finfo(torch.float32).min
    sees = [  # columns: two cached positions, the root, a, b, c, d, e
        [1, 1, 1, 0, 0, 0, 0, 0],  # the root
        [1, 1, 1, 1, 0, 0, 0, 0],  # a
        [1, 1, 1, 0, 1, 0, 0, 0],  # b
        [1, 1, 1, 1, 0, 1, 0, 0],  # c: a and itself
        [1, 1, 1, 1, 0, 0, 1, 0],  # d: a and itself
        [1, 1, 1, 0, 1, 0, 0, 1],  # e: b and itself
    ]
    expected = torch.tensor([[0.0 if s else low for s in row] for row in sees])[None, None]
    assert mask.shape == (1, 1, 6, 8) and mask.dtype == torch.float32
    assert torch.equal(mask, expected)
    assert trees.position_ids(PARENTS, past=2, device=torch.device("cpu")).tolist() == [[2, 3, 3, 4, 4, 4]]
    assert trees.depths(PARENTS) == [1, 1, 2, 2, 2]


def test_a_chain_shaped_tree_is_a_chain_and_parents_must_come_first():
    assert trees.as_parents([-1, 0, 1]) is None and trees.as_parents([]) is None
    assert trees.as_parents(list(PARENTS)) == PARENTS
    with pytest.raises(ValueError, match="node 1 has parent 1"):
        trees.as_parents([-1, 1])
    with pytest.raises(ValueError, match="node 2 repeats the token 10 of a sibling"):
        trees.children([10, 11, 10], [-1, 0, -1])


@pytest.mark.parametrize(("choices", "path", "rejected", "thrown", "token"), [
    # the target's argmax at the rows [root, a, b, c, d, e]
    ([11, 0, 14, 0, 0, 7], [1, 4], 0, 3, 7),  # b then e, a leaf: the bonus is e's row's choice; a, c, d thrown
    ([10, 99, 0, 0, 0, 0], [0], 1, 3, 99),  # a, then neither c nor d: a rejection, corrected to 99; b, d, e thrown
    ([50, 0, 0, 0, 0, 0], [], 1, 4, 50),  # no first-level node agrees: one rejection, the other four thrown
    ([10, 13, 0, 0, 8, 0], [0, 3], 0, 3, 8),  # a then d, a leaf
])
def test_greedy_acceptance_follows_the_targets_choice_from_the_root_down(choices, path, rejected, thrown, token):
    kids = trees.children(TOKENS, PARENTS)
    assert kids == [[0, 1], [2, 3], [4], [], [], []]
    assert trees.accept_greedy(kids, TOKENS, choices) == path
    draft = Draft(torch.tensor(TOKENS), None, PARENTS)
    logits = torch.nn.functional.one_hot(torch.tensor(choices), 100).float()  # (6, 100): argmax = choices
    verdict = trees.verdict(draft, logits, torch.tensor([True]), GREEDY, None)
    assert (verdict.path, verdict.rejected, verdict.token) == (path, rejected, token)
    assert verdict.kept.tolist() == [TOKENS[j] for j in path] + [token] and verdict.target_tokens == choices
    assert len(TOKENS) - len(path) - rejected == thrown  # the round's count: nodes neither accepted nor rejected


class ScriptedTree:
    """Proposes, each round, a tree built from the target's greedy text `g`: the right token hides behind a
    wrong sibling, so the accepted path is never the first rows and the cache must be gathered, not cropped."""

    calls = 0
    wants_hidden = ()
    wants_top = 0

    def __init__(self, g: list[int], vocab: int) -> None:
        self.g, self.vocab, self.told = g, vocab, []

    def prefill(self, tokens: torch.Tensor, hidden: torch.Tensor | None, top: torch.Tensor | None) -> None:
        self.start = tokens.numel()

    def propose(self, tokens: torch.Tensor, k: int) -> Draft:
        at = tokens.numel() - self.start + 1  # g[at] is the target's next token
        right = self.g[at : at + 2]
        wrong = [(t + 1) % self.vocab for t in right]
        # root → wrong0, right0; right0 → wrong1, right1; wrong0 → right1
        nodes, parents = [wrong[0], right[0], wrong[1], right[1], right[1]], [-1, -1, 1, 1, 0]
        return Draft(torch.tensor(nodes[:k + 3]), None, trees.as_parents(parents[:k + 3]))

    def accepted(self, n: int, hidden: torch.Tensor | None, top: torch.Tensor | None) -> None:
        self.told.append(n)


def test_after_tree_rounds_the_cache_equals_a_fresh_prefill_of_the_committed_text(tiny):
    g = greedy_without_cache(tiny.model, PROMPT, 20)
    drafter = ScriptedTree(g, tiny.vocab_size)
    target, text = CachedTarget(tiny), CommittedText(PROMPT, len(PROMPT) + 20, tiny.device)
    with torch.inference_mode():
        first = target.prefill(text.tokens)[0].argmax().view(1)
        text.append(first.tolist(), first)
        drafter.prefill(text.tokens, None, None)
        for _ in range(4):
            clock = Clock(tiny.device)
            r = speculative_round(target, drafter, text, 2, GREEDY, None, clock, 20, frozenset()).read(clock)
            # right0 (node 1), then right1 (node 3): a leaf, so the bonus; wrong0 and its child, and wrong1, thrown
            assert (r.draft_parents, r.accepted_path) == ((-1, -1, 1, 1, 0), (1, 3))
            assert (r.k, r.accepted, r.rejected, r.thrown, r.bonus, r.emitted) == (5, 2, 0, 3, True, 3)
            fresh = CachedTarget(tiny)
            fresh.prefill(text.tokens[:-1])
            assert target.length == fresh.length == text.length - 1
            for mine, theirs in zip(target.cache.layers, fresh.cache.layers, strict=True):
                torch.testing.assert_close(mine.keys, theirs.keys, atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(mine.values, theirs.values, atol=1e-5, rtol=1e-5)
    assert text.ids[len(PROMPT):] == g[:13] and drafter.told == [2] * 4


def _tree_against_chains(loaded, prompt: list[int], tokens: list[int], parents: tuple[int, ...], atol: float):
    """One tree pass after `prompt`, against every root-to-node branch fed alone after a fresh prefill."""
    with torch.inference_mode():
        tree = CachedTarget(loaded)
        tree.prefill(torch.tensor(prompt[:-1]))
        logits, _ = tree.verify(torch.tensor([prompt[-1], *tokens]), (), parents)  # (N+1, V)
        for leaf in range(len(tokens)):
            branch = [leaf]
            while parents[branch[0]] != trees.ROOT:
                branch.insert(0, parents[branch[0]])
            chain = CachedTarget(loaded)
            chain.prefill(torch.tensor(prompt[:-1]))
            alone, _ = chain.verify(torch.tensor([prompt[-1], *(tokens[j] for j in branch)]))
            rows = [0, *(j + 1 for j in branch)]
            torch.testing.assert_close(logits[rows], alone, atol=atol, rtol=0)
            assert torch.equal(logits[rows].argmax(-1), alone.argmax(-1))


def test_keeping_a_path_writes_its_rows_after_the_cached_positions_in_place():
    """3 cached positions and 5 fed rows (the root, then 4 drafts); the path root → node 1 → node 3 stays: the
    cached positions untouched, the path's rows after them in its order, in the same storage."""
    cache = DynamicCache()
    keys = torch.arange(2 * 8 * 2, dtype=torch.float32).view(1, 2, 8, 2)
    cache.update(keys, -keys, 0)
    storage = cache.layers[0].keys.data_ptr()
    trees.keep(cache, 3, [0, 2, 4])
    kept = [0, 1, 2, 3, 5, 7]
    layer = cache.layers[0]
    assert torch.equal(layer.keys, keys[:, :, kept]) and torch.equal(layer.values, -keys[:, :, kept])
    assert layer.keys.data_ptr() == storage and cache.get_seq_length() == 6


def test_one_tree_pass_equals_its_branches_fed_one_by_one_on_the_tiny_model(tiny):
    _tree_against_chains(tiny, PROMPT, TOKENS, PARENTS, atol=1e-4)


def test_one_tree_pass_equals_its_branches_fed_one_by_one_on_smollm2(smollm2):
    prompt = smollm2.tokenizer.encode("The lighthouse keeper counted the ships that passed each night, and")
    _tree_against_chains(smollm2, prompt, [260, 1345, 314, 2234, 28, 357, 253], (-1, -1, 0, 0, 1, 4, 4), atol=1e-4)


def test_ngram_tree_merges_the_continuations_of_every_earlier_match_as_a_trie():
    drafter = NgramTreeDrafter(2, nodes=16)
    text = torch.tensor([7, 1, 2, 3, 4, 9, 1, 2, 3, 5, 8, 1, 2, 6, 2, 0, 1, 2])
    drafter.prefill(text[:4], None, None)
    draft = drafter.propose(text, 2)
    # (1, 2) was followed by 6 2 (latest), 3 5, then 3 4; then the 1-gram (2,): by 0 1, 6 2, 3 5, 3 4
    assert draft.tokens.tolist() == [6, 2, 3, 5, 4, 0, 1]
    assert draft.parents == (-1, 0, -1, 2, 2, -1, 5)
    assert draft.q is None and drafter.calls == 1 and drafter.matched == 2
    capped = NgramTreeDrafter(2, nodes=4)
    capped.prefill(text, None, None)
    assert capped.propose(text, 2).tokens.tolist() == [6, 2, 3, 5]
    # one match only: a chain, as `ngram` would propose it
    alone = NgramTreeDrafter(2, nodes=16)
    alone.prefill(torch.tensor([4, 1, 2, 3, 1]), None, None)
    chain = alone.propose(torch.tensor([4, 1, 2, 3, 1]), 3)
    assert (chain.tokens.tolist(), chain.parents) == ([2, 3, 1], None)
    assert alone.matched == 1  # (3, 1) never occurred before; (1,) did
    assert alone.propose(torch.tensor([4, 1, 2, 3, 1]), 0).tokens.tolist() == []


def test_ngram_tree_is_parsed_and_refused_by_the_confidence_policy(tiny):
    assert [(s.kind, s.arg) for s in map(parse_draft, ["ngram-tree", "ngram-tree:2"])] == [
        ("ngram-tree", "3"), ("ngram-tree", "2")]
    with pytest.raises(ValueError, match='unknown draft "ngram-tree:0"'):
        parse_draft("ngram-tree:0")
    with pytest.raises(ValueError, match="needs a draft with probabilities"):
        Pair(tiny, []).drafter(parse_draft("ngram-tree"), GREEDY, None, parse_policy("confidence:0.5"))


LOSSLESS_PROMPTS = ("A recipe for lentil soup: rinse the lentils, chop the onion, then rinse the lentils again and",
                    "def area(r):\n    return 3.14 * r * r\n\ndef volume(r, h):\n    return area(r) * h\n\ndef")


@pytest.mark.parametrize("model", ["tiny", "smollm2"])
def test_greedy_ngram_tree_equals_plain_greedy_and_transformers_generate(request, model):
    loaded = request.getfixturevalue(model)
    spec = parse_draft("ngram-tree")
    pair = Pair(loaded, [spec])
    trees_seen = 0
    for text in LOSSLESS_PROMPTS:
        prompt = loaded.tokenizer.encode(text)
        with torch.inference_mode():
            made = loaded.model.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False)
        expected = made[0, len(prompt):].tolist()
        assert list(pair.run(PLAIN, prompt, None, GREEDY, 32, seed=0).output_tokens) == expected
        for k in (2, 4):
            run = pair.run(spec, prompt, k, GREEDY, 32, seed=0)
            assert list(run.output_tokens) == expected, (model, text, k)
            assert all(r.accepted + r.rejected + r.thrown == r.k for r in run.rounds)
            trees_seen += sum(r.draft_parents is not None for r in run.rounds)
    assert trees_seen > 0  # the prompts repeat themselves, so some rounds drafted real trees


def test_a_sliding_window_target_refuses_trees():
    model = MistralForCausalLM(MistralConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=1, sliding_window=4))
    with pytest.raises(ValueError, match="tree drafts need full-attention layers only; this model has "
                                         "DynamicSlidingWindowLayer"):
        trees.check_cache(new_cache(model))


def test_generate_with_ngram_tree_counts_one_lookup_a_round(tiny):
    prompt = list(range(100, 120)) * 3
    run = generate(tiny, NgramTreeDrafter(3, nodes=16), prompt, 4, GREEDY, 24, torch.Generator())
    assert list(run.output_tokens) == greedy_without_cache(tiny.model, prompt, 24)
    assert run.draft_calls == len(run.rounds)
