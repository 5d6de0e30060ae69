"""The tree drafters beyond prompt lookup: `eagle-tree` (EAGLE-2's dynamic tree from a head), `recycling` (token
recycling) and `hybrid` (both trees in one). Their trees worked by hand where they are rules, against the head run
as a chain where they are a head's, and greedy output equal to plain decoding on SmolLM2."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runner.engine.drafters.eagle import EagleDrafter
from runner.engine.drafters.eagle_tree import EagleTreeDrafter
from runner.engine.drafters.hybrid import GAIN_SHARE, PROBE, RECENT, HybridDrafter, depth_along, merge
from runner.engine.drafters.ngram_tree import NgramTreeDrafter
from runner.engine.drafters.recycling import RecyclingDrafter, followed_by
from runner.engine.drafters.registry import parse_draft
from runner.engine.pair import Pair
from runner.engine.round.decode import CachedTarget, generate
from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.draft import NoDraft
from runner.engine.round.sampling import Ranked, ranked
from runner.engine.round.trees import as_parents, depths, trie
from runner.engine.weights import head_files
from runner.engine.weights.models import encode_chat

GREEDY = Decoding("greedy", 0.0, 1.0)
HEAD = Path(__file__).resolve().parents[2] / "heads" / "smollm2-135m"


def _ranked(tokens: list[list[int]], probs: list[list[float]]) -> Ranked:
    """Rows whose logits give `tokens` the probabilities `probs`, and the rest of each row's mass to one more token."""
    logits = torch.full((len(tokens), max(map(max, tokens)) + 2), -torch.inf)
    for row, (ids, ps) in enumerate(zip(tokens, probs, strict=True)):
        logits[row, ids] = torch.tensor(ps).log()
        logits[row, -1] = torch.tensor(1 - sum(ps)).log()
    return Ranked(torch.tensor(tokens), logits)


def _rounded(table: dict[int, tuple[list[int], list[float]]]) -> dict[int, tuple[list[int], list[float]]]:
    """The table's probabilities to 6 places (they went through a log and an exp in float32)."""
    return {token: (ids, [round(p, 6) for p in probs]) for token, (ids, probs) in table.items()}


def test_the_ranked_candidates_carry_the_targets_probabilities():
    logits = torch.tensor([[2.0, 0.0, 1.0, -1.0], [0.5, 0.0, 3.0, 0.0]])
    top = ranked(logits, 2)
    assert top.tokens.tolist() == [[0, 2], [2, 0]]
    expected = torch.softmax(logits, dim=-1).gather(1, top.tokens)
    assert torch.allclose(top.probs, expected) and abs(top.probs[0, 0].item() - 0.6439) < 1e-4  # e²/(e²+1+e+e⁻¹)


def test_a_prompt_tokens_row_puts_first_what_followed_it_in_the_prompt():
    assert followed_by(([3, 8, 6], [0.5, 0.25, 0.125]), 8) == ([8, 3, 6], [0.5, 0.5, 0.125])  # raised to the first's
    assert followed_by(([3, 8, 6], [0.5, 0.25, 0.125]), 3) == ([3, 8, 6], [0.5, 0.25, 0.125])  # already first
    assert followed_by(([3, 8, 6], [0.5, 0.25, 0.125]), 2) == ([2, 3, 8], [0.5, 0.5, 0.25])  # the last makes room
    drafter = RecyclingDrafter(nodes=6, width=2)
    # the prompt [1, 4, 1] and the prefill's token 5; the prefill's top-2 at each prompt position
    drafter.prefill(torch.tensor([1, 4, 1, 5]), None,
                    _ranked([[5, 9], [1, 7], [5, 2]], [[0.5, 0.25], [0.5, 0.375], [0.75, 0.125]]))
    # 1 -> 4 first ([4, 5]) is replaced by the later occurrence, which 5 followed; 4 -> 1 was the target's first too
    assert _rounded(drafter.table) == {1: ([5, 2], [0.75, 0.125]), 4: ([1, 7], [0.5, 0.375])}
    assert drafter.propose(torch.tensor([1, 4, 1, 5]), 3).tokens.tolist() == []  # 5 has no row yet


def test_recycling_grows_the_likeliest_paths_and_refills_the_table_from_every_verify_row():
    drafter = RecyclingDrafter(nodes=4, width=2)
    drafter.table = {5: ([7, 8], [0.5, 0.25]), 7: ([9, 3], [0.75, 0.125]), 8: ([4, 6], [0.5, 0.5]),
                     9: ([2, 1], [0.5, 0.25])}
    # cumulative: 7 .5, then 9 (.5 × .75 = .375), 8 .25, 2 (.375 × .5 = .1875); 4 and 6 (.125) and 1, 3 are left
    draft = drafter.propose(torch.tensor([1, 5]), 3)
    assert draft.tokens.tolist() == [7, 9, 8, 2]
    assert draft.parents == (-1, 0, -1, 1)
    # two deep, 2 cannot follow 9: 8's children tie at .125 and the first candidate goes first
    assert drafter.expand(5, 2) == ([7, 9, 8, 4], [-1, 0, -1, 2])
    # the target's top-2 at each verify row (root 5, then each node): every fed token's row is replaced
    drafter.accepted(1, None, _ranked([[7, 3], [9, 1], [2, 6], [4, 0], [1, 2]],
                                      [[0.5, 0.25], [0.75, 0.125], [0.5, 0.5], [0.25, 0.25], [0.5, 0.125]]))
    assert _rounded(drafter.table) == {5: ([7, 3], [0.5, 0.25]), 7: ([9, 1], [0.75, 0.125]), 9: ([2, 6], [0.5, 0.5]),
                             8: ([4, 0], [0.25, 0.25]), 2: ([1, 2], [0.5, 0.125])}


def test_merging_two_trees_shares_the_nodes_of_common_branches():
    lookup = ([3, 4, 6], [-1, 0, -1])  # 3-4, 6
    head = ([3, 6, 5, 4, 9], [-1, -1, 0, 0, 3])  # 3-5, 3-4-9, 6
    # 3, 4 (under 3) and 6 are the lookup's; 5 joins under 3, 9 under the lookup's 4
    assert merge(lookup, head) == ([3, 4, 6, 5, 9], [-1, 0, -1, 0, 1])


@pytest.fixture(scope="module")
def head(smollm2):
    return head_files.load(head_files.check(str(HEAD), smollm2.model.config), smollm2.model.get_input_embeddings(),
                           smollm2.device, smollm2.dtype)


def _ready(drafter, smollm2, text: str, chat: bool = True) -> torch.Tensor:
    """The drafter after a prefill of `text` (as a chat, or as plain text) and its first new token, as the decode
    loop leaves it."""
    prompt = torch.tensor(encode_chat(smollm2, text) if chat else smollm2.tokenizer.encode(text))
    with torch.inference_mode():
        logits, features, top = CachedTarget(smollm2).prefill(prompt, drafter.wants_hidden, drafter.wants_top)
    tokens = torch.cat([prompt, logits.argmax().view(1)])
    drafter.prefill(tokens, features, top)
    return tokens


def test_a_one_wide_eagle_tree_is_the_heads_chain(smollm2, head):
    text = "Explain why the sky is blue in two sentences."
    chain = EagleDrafter(head, GREEDY, torch.Generator())
    tree = EagleTreeDrafter(head, GREEDY, torch.Generator(), nodes=5, width=1)
    with torch.inference_mode():
        expected = chain.propose(_ready(chain, smollm2, text), 5)
        got = tree.propose(_ready(tree, smollm2, text), 5)
    assert got.parents is None and got.tokens.tolist() == expected.tokens.tolist()


def test_each_eagle_tree_node_is_among_the_heads_best_after_its_own_branch(smollm2, head):
    tree = EagleTreeDrafter(head, GREEDY, torch.Generator(), nodes=12, width=3)
    with torch.inference_mode():
        tokens = _ready(tree, smollm2, "List three uses of copper and say why.")
        draft = tree.propose(tokens, 4)
        nodes, parents = draft.tokens.tolist(), draft.parents
        assert len(nodes) == 12 and max(depths(parents)) <= 4
        for j, parent in enumerate(parents):
            branch = []
            while parent != -1:
                branch.insert(0, nodes[parent])
                parent = parents[parent]
            chain = EagleDrafter(head, GREEDY, torch.Generator())  # the head fed this branch alone, as a chain
            chain._catch_up(_ready(chain, smollm2, "List three uses of copper and say why."))
            for i, token in enumerate(branch):
                chain._forward(chain.hidden, torch.tensor([[token]]), chain.settled + i)
            best = chain.draft_ids[chain.next_logits.topk(3).indices].tolist()
            assert nodes[j] in best, (j, branch)
        assert len({(p, t) for p, t in zip(parents, nodes, strict=True)}) == len(nodes)  # siblings differ


@pytest.mark.parametrize("nodes", [1, 2, 3])
def test_a_tree_of_few_nodes_skips_the_levels_and_rows_it_could_never_keep(smollm2, head, nodes):
    text = "Name two planets and one fact about each."
    cut = EagleTreeDrafter(head, GREEDY, torch.Generator(), nodes=nodes)
    whole = EagleTreeDrafter(head, GREEDY, torch.Generator(), nodes=64)  # every level expanded, 4 rows wide
    keep_best = whole._best

    def best(rows, scores, parents):  # ... and then only the `nodes` likeliest of all its candidates kept
        whole.nodes = nodes
        return keep_best(rows, scores, parents)

    whole._best = best
    with torch.inference_mode():
        got = cut.propose(_ready(cut, smollm2, text), 4)
        expected = whole.propose(_ready(whole, smollm2, text), 4)
    assert (got.tokens.tolist(), got.parents) == (expected.tokens.tolist(), expected.parents)
    assert len(got.tokens) == nodes
    assert whole.calls - cut.calls == 4 - nodes  # 3 head passes grow 4 levels; N nodes need only N - 1 of them


@pytest.mark.parametrize("draft", [f"eagle-tree:{HEAD}", f"hybrid:{HEAD}", "recycling", f"eagle-tree:{HEAD}:nodes=5"])
def test_greedy_tree_drafters_equal_plain_greedy_on_smollm2(smollm2, draft):
    spec = parse_draft(draft)
    pair = Pair(smollm2, [spec])
    prompt = encode_chat(smollm2, "Summarise: the river rose, the town moved uphill, and the river fell again.")
    expected = generate(smollm2, NoDraft(), prompt, 0, GREEDY, 32, torch.Generator()).output_tokens
    with torch.inference_mode():  # and transformers' own greedy decoding agrees
        made = smollm2.model.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False)
    assert made[0, len(prompt) :].tolist() == list(expected)
    for k in (2, 4):
        run = pair.run(spec, prompt, k, GREEDY, 32, seed=0)
        assert run.output_tokens == expected, k
        assert all(r.accepted + r.rejected + r.thrown == r.k <= pair.nodes_for(spec, k) and r.depth <= k
                   for r in run.rounds)
    assert any(r.draft_parents is not None for r in run.rounds)  # real trees were drafted


def test_sampled_tree_drafters_keep_the_counts_and_nodes_per_round(smollm2):
    spec = parse_draft(f"hybrid:{HEAD}:nodes=6")
    run = Pair(smollm2, [spec]).run(spec, encode_chat(smollm2, "Name a colour."), 3, Decoding("sample", 0.7, 1.0),
                                    16, seed=1)
    assert len(run.output_tokens) == 16 or run.stop_reason == "eos"
    assert all(r.accepted + r.rejected + r.thrown == r.k <= 6 for r in run.rounds)


def test_tree_drafts_are_parsed_with_their_node_counts():
    specs = [parse_draft(t) for t in ("recycling", "recycling:nodes=8", "ngram-tree:2:nodes=4", "eagle-tree:h",
                                      "hybrid:some/dir:nodes=32")]
    assert [(s.kind, s.arg, s.nodes) for s in specs] == [
        ("recycling", None, None), ("recycling", None, 8), ("ngram-tree", "2", 4), ("eagle-tree", "h", None),
        ("hybrid", "some/dir", 32)]
    with pytest.raises(ValueError, match="nodes must be a whole number from 1 to 63"):
        parse_draft("recycling:nodes=0")
    with pytest.raises(ValueError, match="only a tree"):
        parse_draft("ngram:3:nodes=4")


def test_hybrid_drafts_with_prompt_lookup_alone_after_a_full_match_and_merges_otherwise(smollm2, head):
    text = "Repeat after me: the quick brown fox jumps, a brown fox sleeps, the quick brown"
    hybrid = HybridDrafter(head, GREEDY, torch.Generator(), n=3, nodes=8)
    with torch.inference_mode():
        tokens = _ready(hybrid, smollm2, text, chat=False)  # ... and the target goes on with " fox"
        got = hybrid.propose(tokens, 3)
        # the last 3 tokens occurred before: the trie of what followed each earlier occurrence of them (the most
        # recent first), none of the shorter matches' continuations, and no head pass
        ids = tokens.tolist()
        follows = [ids[i : i + 3] for i in range(len(ids) - 1, 2, -1) if ids[i - 3 : i] == ids[-3:]]
        assert hybrid.lookup.matched == 3 and len(follows) == 1 and hybrid.head.calls == 0
        tokens_, parents = trie(follows)
        assert (got.tokens.tolist(), got.parents) == (tokens_, as_parents(parents))
        whole = NgramTreeDrafter(3, nodes=8)
        whole.prefill(tokens, None, None)
        assert len(tokens_) < len(whole.trie(tokens, 3)[0])  # the shorter matches' branches are left out
        fresh = HybridDrafter(head, GREEDY, torch.Generator(), n=3, nodes=8)
        plain = _ready(fresh, smollm2, "Name one planet.")
        merged = fresh.propose(plain, 3)  # no full match: the head drafts (its catch-up and k - 1 tree passes)
        assert fresh.head.calls == 3 and merged.tokens.numel() <= 8


def test_how_far_a_text_follows_a_tree():
    tokens, parents = [3, 4, 6, 5], [-1, 0, -1, 1]  # 3-4-5, 6
    assert [depth_along(tokens, parents, text) for text in ([3, 4, 5, 9], [3, 4, 9], [6, 6], [7], [])] == [
        3, 2, 1, 0, 0]


def test_hybrid_drops_a_head_that_does_not_pay_and_probes_it_again(smollm2, head):
    hybrid = HybridDrafter(head, GREEDY, torch.Generator(), n=3, nodes=8)
    with torch.inference_mode():
        tokens = _ready(hybrid, smollm2, "Name one planet.")
        hybrid.gain, hybrid.own = GAIN_SHARE, 2.0  # the head added a quarter token to the lookup's 2: too little

        hybrid.propose(tokens, 3)
        assert hybrid.head.calls == 0 and hybrid.skipped == 1
        hybrid.skipped = PROBE - 1  # ... until the PROBE-th round
        hybrid.propose(tokens, 3)
        assert hybrid.head.calls == 3 and hybrid.skipped == 0
    # the round's lookup part was 3-4-5 / 6 and the path took 3 4 9 (the head's 9): a gain of 1 over the lookup's
    # 2 (+ 1, the correction)
    hybrid.judged, hybrid.lookup.seen = (([3, 4, 6, 5], [-1, 0, -1, 1]), 2, 3), [1, 2, 3, 4, 9, 8]
    hybrid._learn()
    assert hybrid.gain == pytest.approx(GAIN_SHARE + RECENT * (1 - GAIN_SHARE)) and hybrid.judged is None
    assert hybrid.own == pytest.approx(2.0 + RECENT * (3 - 2.0))


def test_hybrid_prices_the_head_by_how_much_longer_the_rounds_it_drafts_in_take(smollm2, head):
    hybrid = HybridDrafter(head, GREEDY, torch.Generator(), n=3, nodes=8)
    began = iter([10.0, 10.130, 10.230, 10.330, 10.530])  # when each proposal begins, in seconds
    hybrid.clock = lambda: next(began)
    with torch.inference_mode():
        tokens = _ready(hybrid, smollm2, "Name one planet.")
        hybrid.propose(tokens, 3)  # trusted at first: the head drafts
        assert hybrid.head.calls == 3 and hybrid.price == GAIN_SHARE  # nothing timed yet: the prior
        hybrid.gain, hybrid.own = 0.0, 2.0  # ... and added nothing
        hybrid.propose(tokens, 3)  # the head's round took 130 ms; the lookup drafts alone
        assert hybrid.seconds == pytest.approx({True: 0.130}) and hybrid.price == GAIN_SHARE
        hybrid.propose(tokens, 3)  # the lookup's took 100 ms: the head's rounds cost 30% more
        assert hybrid.seconds == pytest.approx({True: 0.130, False: 0.100}) and hybrid.price == pytest.approx(0.3)
        hybrid.gain, hybrid.own = 0.28, 1.0  # over the prior's 0.25 a token, under the measured 0.3
        hybrid.propose(tokens, 3)  # another 100 ms
        assert hybrid.price == pytest.approx(0.3) and hybrid.head.calls == 3 and hybrid.skipped == 3  # left out
        hybrid.gain = 0.0
        hybrid.propose(tokens, 3)  # 200 ms: the running average moves a quarter of the way
        assert hybrid.seconds[False] == pytest.approx(0.100 + RECENT * 0.100)
    cheap = HybridDrafter(head, GREEDY, torch.Generator(), n=3, nodes=8)
    with torch.inference_mode():
        tokens = _ready(cheap, smollm2, "Name one planet.")
        cheap.seconds, cheap.gain, cheap.own = {True: 0.110, False: 0.100}, 0.2, 1.0  # under the prior, over 10%
        cheap.propose(tokens, 3)
        assert cheap.head.calls == 3
