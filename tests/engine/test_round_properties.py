"""Property tests of the round: for random proposals against a real (tiny) target, the explainer's invariants.

Hypothesis draws, round by round, how many drafts to propose and which of them copy the target's own
next token (the rest are random tokens); the expected outcome of every round is worked out from the
target's greedy text, computed without a cache.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner.engine.round.clock import Clock
from runner.engine.round.decode import CachedTarget, CommittedText, generate, speculative_round
from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.draft import Draft
from runner.engine.round.sampling import accept_sampled
from runner.engine.weights.models import Loaded
from tests.helpers.tiny import tiny_llama

VOCAB, EOS, PROMPT = 24, 5, [3, 1, 4, 1, 5, 9, 2, 6]
GREEDY = Decoding("greedy", 0.0, 1.0)
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def target() -> Loaded:
    model = tiny_llama(VOCAB, seed=11)
    model.generation_config.eos_token_id = EOS
    return Loaded("tiny", model, None, torch.device("cpu"), torch.float32)


def greedy_truth(model: torch.nn.Module, n: int) -> list[int]:
    """The target's greedy text after PROMPT, one full forward pass per token, up to and with its EOS."""
    ids = list(PROMPT)
    with torch.inference_mode():
        while len(ids) - len(PROMPT) < n and (len(ids) == len(PROMPT) or ids[-1] != EOS):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(PROMPT):]


class Scripted:
    """Proposes, round by round, the truth where the script says copy and its own token where it does not."""

    calls = 0
    wants_hidden = ()
    wants_top = 0

    def __init__(self, truth: list[int], script: list[list[int | None]]) -> None:
        self.truth, self.script = truth, iter(script)
        self.told: list[int] = []

    def prefill(self, tokens: torch.Tensor, hidden: torch.Tensor | None, top: torch.Tensor | None) -> None:
        self.start = tokens.numel() - 1  # where the output begins

    def propose(self, tokens: torch.Tensor, k: int) -> Draft:
        at = tokens.numel() - self.start
        plan = next(self.script, [])[:k]
        copy = [self.truth[at + i] if at + i < len(self.truth) else 0 for i in range(len(plan))]
        drafts = [copied if c is None else c for copied, c in zip(copy, plan, strict=True)]
        return Draft(tokens=torch.tensor(drafts, dtype=torch.long), q=None)

    def accepted(self, n: int, hidden: torch.Tensor | None, top: torch.Tensor | None) -> None:
        self.told.append(n)


# a round's plan: None copies the target's next token, an int proposes that token
plans = st.lists(st.lists(st.one_of(st.none(), st.integers(0, VOCAB - 1)), max_size=6), max_size=12)


@SETTINGS
@given(script=plans, k=st.integers(1, 6), max_new=st.integers(1, 16))
def test_greedy_rounds_keep_the_explainers_invariants(target, script, k, max_new):
    truth = greedy_truth(target.model, max_new)
    drafter = Scripted(truth, script)
    run = generate(target, drafter, PROMPT, k, GREEDY, max_new, torch.Generator())
    assert list(run.output_tokens) == truth  # the committed text is the target's own choices
    at = 1  # the prefill made truth[0]
    for i, r in enumerate(run.rounds):
        # as many drafts as the script had, but never more than k, nor past the budget (k drafts give k + 1)
        assert r.accepted + r.rejected + r.thrown == r.k == min(len(script[i]) if i < len(script) else 0, k,
                                                                 max_new - at - 1)
        expected = 0
        while expected < r.k and r.draft_tokens[expected] == truth[at + expected]:
            expected += 1
        assert r.accepted == expected and r.rejected == int(expected < r.k) and r.bonus == (expected == r.k)
        cut = truth[at + r.emitted - 1] == EOS or at + r.emitted == max_new
        assert r.emitted == r.accepted + 1 or (cut and r.emitted < r.accepted + 1)
        judged = min(r.accepted + 1, len(truth) - at)  # the target's choices that lie within the budget
        assert r.target_tokens[:judged] == tuple(truth[at : at + judged])
        at += r.emitted
    assert at == len(truth) and drafter.told == [r.accepted for r in run.rounds]
    assert run.stop_reason == ("eos" if truth[-1] == EOS else "max_new_tokens")


def random_q(draw: st.DrawFn, k: int) -> torch.Tensor:
    rows = [draw(st.lists(st.floats(0.0, 1.0), min_size=VOCAB, max_size=VOCAB)) for _ in range(k)]
    q = torch.tensor(rows).view(k, VOCAB) + 1e-3
    return q / q.sum(-1, keepdim=True)


@st.composite
def sampled_rounds(draw: st.DrawFn) -> list[tuple[list[int], bool]]:
    """Per round: the drafts, and whether they come with probabilities (a model draft) or not (prompt lookup)."""
    return draw(st.lists(st.tuples(st.lists(st.integers(0, VOCAB - 1), max_size=5), st.booleans()), max_size=8))


class RandomDrafts:
    """Random drafts, with random q rows or none, as a draft model or prompt lookup would give them."""

    calls = 0
    wants_hidden = ()
    wants_top = 0

    def __init__(self, rounds: list[tuple[list[int], bool]], generator: torch.Generator) -> None:
        self.rounds, self.generator = iter(rounds), generator

    def prefill(self, tokens: torch.Tensor, hidden: torch.Tensor | None, top: torch.Tensor | None) -> None:
        pass

    def propose(self, tokens: torch.Tensor, k: int) -> Draft:
        drafts, with_q = next(self.rounds, ([], False))
        drafts = drafts[:k]
        q = torch.rand(len(drafts), VOCAB, generator=self.generator) + 0.01 if with_q and drafts else None
        q = None if q is None else q / q.sum(-1, keepdim=True)
        return Draft(tokens=torch.tensor(drafts, dtype=torch.long), q=q)

    def accepted(self, n: int, hidden: torch.Tensor | None, top: torch.Tensor | None) -> None:
        pass


@SETTINGS
@given(rounds=sampled_rounds(), greedy=st.booleans(), seed=st.integers(0, 2**16))
def test_after_every_round_the_cache_holds_the_committed_text_but_the_newest_token(target, rounds, greedy, seed):
    decoding = GREEDY if greedy else Decoding("sample", 0.9, 0.95)
    generator = torch.Generator().manual_seed(seed)
    drafter = RandomDrafts(rounds, generator)
    model, text = CachedTarget(target), CommittedText(PROMPT, len(PROMPT) + 64, target.device)
    with torch.inference_mode():
        first = model.prefill(text.tokens)[0].argmax().view(1)
        text.append(first.tolist(), first)
        for _ in range(len(rounds)):
            committed = text.length
            clock = Clock(target.device)
            r = speculative_round(model, drafter, text, 5, decoding, generator, clock, 64, frozenset()).read(clock)
            assert model.length == text.length - 1 == committed + r.emitted - 1
            assert r.accepted + r.rejected + r.thrown == r.k and r.emitted == r.accepted + 1
            kept = text.tokens[committed:].tolist()
            assert kept[: r.accepted] == list(r.draft_tokens[: r.accepted])
            if not greedy:
                assert list(r.target_tokens) == kept  # sampling records the kept drafts and the drawn token
        # the cache equals a fresh prefill of the committed text but the newest token
        fresh = CachedTarget(target)
        fresh.prefill(text.tokens[:-1])
        for mine, theirs in zip(model.cache.layers, fresh.cache.layers, strict=True):
            torch.testing.assert_close(mine.keys, theirs.keys, atol=1e-5, rtol=1e-5)


@st.composite
def distributions(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    k = draw(st.integers(0, 4))
    p = random_q(draw, k + 1)
    q = random_q(draw, k)
    drafts = torch.tensor(draw(st.lists(st.integers(0, VOCAB - 1), min_size=k, max_size=k)), dtype=torch.long)
    return p, q, drafts


@SETTINGS
@given(pqd=distributions(), point_mass=st.booleans(), seed=st.integers(0, 2**16))
def test_a_sampled_correction_is_never_a_token_the_residual_excludes(pqd, point_mass, seed):
    p, q, drafts = pqd
    k = drafts.numel()
    n, token, _ = accept_sampled(drafts, None if point_mass else q, p, torch.Generator().manual_seed(seed))
    assert 0 <= n <= k
    if n == k:
        assert p[k, token] > 0  # the bonus comes from p itself
    elif point_mass:
        assert token != int(drafts[n]) and p[n, token] > 0  # p without the rejected token
    else:
        assert p[n, token] > q[n, token]  # only where p exceeds q
