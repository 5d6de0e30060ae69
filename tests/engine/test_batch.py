"""Batched decoding (runner/engine/round/batch.py): every sequence of a batch decodes as it would alone, round for
round, whatever its mates do (their drafts' lengths, trees, an early end); holes are compacted away; the shared pass's
time is every member's verify time."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runner.engine.drafters.registry import parse_draft
from runner.engine.drafters.spec import PLAIN
from runner.engine.pair import Pair
from runner.engine.round import batch as batched
from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.draft import Draft

GREEDY = Decoding("greedy", 0.0, 1.0)
SAMPLE = Decoding("sample", 0.8, 1.0)
HEAD = Path(__file__).resolve().parents[2] / "heads" / "smollm2-135m"
# Prompts of different lengths, so the batch is padded; the first repeats itself, so prompt lookup finds drafts.
PROMPTS = [[5, 9, 14, 5, 9, 14, 5, 9], [301, 7], [42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52], [8, 8, 1000, 8]]


@pytest.fixture(scope="module")
def pair(tiny) -> Pair:
    return Pair(tiny, [parse_draft("ngram:2"), parse_draft("layerskip:2"), parse_draft("ngram-tree:2")], "stock")


def alone(pair: Pair, draft: str, prompts: list[list[int]], k: int | None, decoding: Decoding = GREEDY, n: int = 24):
    spec = PLAIN if draft == "none" else parse_draft(draft)
    return [pair.run(spec, p, k, decoding, n, seed=3) for p in prompts]


def together(pair: Pair, draft: str, prompts: list[list[int]], k: int | None, decoding: Decoding = GREEDY,
             n: int = 24):
    return pair.run_batch(PLAIN if draft == "none" else parse_draft(draft), prompts, k, decoding, n, seed=3)


def fates(generation) -> list[tuple[int, int, int]]:
    return [(r.k, r.accepted, r.emitted) for r in generation.rounds]


@pytest.mark.parametrize("size", [1, 2, 4, 8])
@pytest.mark.parametrize(("draft", "k"), [("none", None), ("ngram:2", 3), ("layerskip:2", 2), ("ngram-tree:2", 3)])
def test_every_sequence_of_a_batch_decodes_as_it_would_alone(pair, draft, k, size):
    prompts = (PROMPTS * 2)[:size]
    expected = alone(pair, draft, prompts, k)
    got = together(pair, draft, prompts, k)
    assert [g.output_tokens for g in got] == [e.output_tokens for e in expected]
    assert [fates(g) for g in got] == [fates(e) for e in expected]  # the same rounds: drafts, acceptances
    for g in got:  # a round's pass held the sequences not yet done: those with a round of that number
        assert [r.batch_seqs for r in g.rounds] == [sum(len(o.rounds) > j for o in got) for j in range(len(g.rounds))]


def test_a_sequence_that_ends_leaves_the_batch_and_the_others_go_on(pair, tiny, monkeypatch):
    expected = alone(pair, "ngram:2", PROMPTS, 3)
    ender = expected[1].output_tokens[5]  # the 6th token of the second sequence becomes its end-of-sequence token
    monkeypatch.setattr(tiny.model.generation_config, "eos_token_id", ender)
    expected = alone(pair, "ngram:2", PROMPTS, 3)
    got = together(pair, "ngram:2", PROMPTS, 3)
    assert [g.output_tokens for g in got] == [e.output_tokens for e in expected]
    assert got[1].stop_reason == "eos" and got[1].output_tokens[-1] == ender
    ended_after = len(got[1].rounds)
    others = [g for i, g in enumerate(got) if g.stop_reason != "eos"]
    assert others, "some sequence must run on after the one that ended"
    for g in others:  # every round up to the end had all four sequences in the pass, then one fewer
        assert {r.batch_seqs for r in g.rounds[:ended_after]} == {4}
        assert max(r.batch_seqs for r in g.rounds[ended_after:]) <= 3
    assert got[1].wall_s < max(g.wall_s for g in got)


class Wrong:
    """Drafts k copies of a token the target never writes next here, so nearly every draft is rejected."""

    calls, wants_hidden, wants_top = 0, (), 0

    def prefill(self, tokens, hidden, top) -> None:
        pass

    def propose(self, tokens: torch.Tensor, k: int) -> Draft:
        return Draft(tokens=torch.full((k,), 7, dtype=torch.long), q=None)

    def accepted(self, n, hidden, top) -> None:
        pass


def test_rejected_drafts_leave_holes_that_compaction_gathers(tiny, monkeypatch):
    widths = []
    compact = batched.BatchCache.compact

    def watched(self):
        before = self.valid.shape[1]
        compact(self)
        widths.append((before, self.valid.shape[1]))
    monkeypatch.setattr(batched.BatchCache, "compact", watched)
    prompts = PROMPTS[:3]
    plain = Pair(tiny, [], "stock").run_batch(PLAIN, prompts, None, GREEDY, 30, seed=0)
    generators = [torch.Generator().manual_seed(0) for _ in prompts]
    got = batched.generate_batch(tiny, [Wrong() for _ in prompts], prompts, 6, GREEDY, 30, generators)
    assert [g.output_tokens for g in got] == [p.output_tokens for p in plain]
    shrunk = [(before, after) for before, after in widths if after < before]
    assert shrunk, "seven new columns a round, about one kept: the cache must have been compacted"
    for before, after in shrunk:
        assert after * 2 < before


def test_a_sampled_batch_draws_each_sequence_from_its_own_generator(pair):
    expected = alone(pair, "ngram:2", PROMPTS, 3, SAMPLE)
    got = together(pair, "ngram:2", PROMPTS, 3, SAMPLE)
    assert [g.output_tokens for g in got] == [e.output_tokens for e in expected]
    assert [r.draft_u for r in got[2].rounds] == [r.draft_u for r in expected[2].rounds]


def test_the_shared_pass_is_every_members_verify_time_and_the_head_stays_lossless(smollm2):
    pair = Pair(smollm2, [parse_draft(f"eagle:{HEAD}")])
    prompts = [list(smollm2.tokenizer(t)["input_ids"]) for t in
               ("The capital of France is", "def add(a, b):\n    return", "One, two, three, four,")]
    spec = parse_draft(f"eagle:{HEAD}")
    expected = [pair.run(spec, p, 3, GREEDY, 16, seed=0) for p in prompts]
    got = pair.run_batch(spec, prompts, 3, GREEDY, 16, seed=0)
    assert [g.output_tokens for g in got] == [e.output_tokens for e in expected]
    assert len({g.rounds[0].verify_s for g in got}) == 1  # one pass, one time
    assert len({g.rounds[0].draft_s for g in got}) == 3  # each drafted on its own
