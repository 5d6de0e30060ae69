"""The decode loop on the tiny random model: scripted drafts, the cut at max-new-tokens and EOS, and the caches.

Expected texts come from the model's greedy argmax without a cache (tests/conftest.py); the real model's
speculative output is checked against transformers' own `generate` in test_reference.py.
"""

from __future__ import annotations

import re
import time

import pytest
import torch

from runner.engine.drafters.model import ModelDrafter
from runner.engine.drafters.ngram import NgramDrafter
from runner.engine.drafters.registry import parse_draft
from runner.engine.pair import Pair
from runner.engine.round.clock import Clock
from runner.engine.round.decode import CachedTarget, CommittedText, generate, speculative_round
from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.draft import Draft, NoDraft
from runner.engine.weights.models import Loaded
from tests.helpers.tiny import greedy_without_cache, tiny_llama

GREEDY = Decoding("greedy", 0.0, 1.0)
PROMPT = [5, 900, 31, 4471, 12, 808, 77, 3090, 31, 12]


def self_draft(target) -> ModelDrafter:
    """The target drafting for itself: every greedy draft is the target's own token."""
    return ModelDrafter(target.model, GREEDY, None, target.vocab_size)


class Scripted:
    """Proposes exactly the scripted drafts, one list per round, and logs what it is told."""

    calls = 0
    wants_hidden = ()
    wants_top = 0

    def __init__(self, script: list[list[int]]) -> None:
        self.script = iter(script)
        self.told: list[int] = []

    def prefill(self, tokens: torch.Tensor, hidden: torch.Tensor | None, top: torch.Tensor | None) -> None:
        pass

    def propose(self, tokens: torch.Tensor, k: int) -> Draft:
        return Draft(tokens=torch.tensor(next(self.script)[:k]), q=None)

    def accepted(self, n: int, hidden: torch.Tensor | None, top: torch.Tensor | None) -> None:
        self.told.append(n)


@pytest.mark.parametrize("draft", ["ngram", "layerskip:1", "layerskip:3", "model:tiny"])
def test_greedy_speculative_equals_plain_greedy_on_a_tiny_random_model(tiny, tiny_dir, draft):
    spec = parse_draft(draft.replace("tiny", str(tiny_dir)))
    pair = Pair(tiny, [spec])
    prompt = list(range(100, 140)) * 2  # repeats, so prompt lookup finds matches
    expected = greedy_without_cache(tiny.model, prompt, 48)
    for k in (1, 2, 4, 8):
        assert list(pair.run(spec, prompt, k, GREEDY, 48, seed=0).output_tokens) == expected, (draft, k)


def test_the_target_drafting_for_itself_gets_a_bonus_every_round(tiny):
    run = generate(tiny, self_draft(tiny), PROMPT, 4, GREEDY, 30, torch.Generator())
    assert list(run.output_tokens) == greedy_without_cache(tiny.model, PROMPT, 30)
    # 1 + 5 × 5 tokens, then k shrinks to the budget: 4 tokens left, so 3 drafts and the bonus
    assert [(r.k, r.accepted, r.rejected, r.thrown, r.bonus, r.emitted) for r in run.rounds] == [
        (4, 4, 0, 0, True, 5)] * 5 + [(3, 3, 0, 0, True, 4)]


def test_scripted_drafts_give_exactly_the_explainers_round(tiny):
    g = greedy_without_cache(tiny.model, PROMPT, 9)
    wrong = (g[3] + 1) % tiny.model.config.vocab_size
    drafter = Scripted([[g[1], g[2], wrong, g[4]], [g[4], g[5], g[6], g[7]]])
    run = generate(tiny, drafter, PROMPT, 4, GREEDY, 9, torch.Generator())
    first, second = run.rounds
    # The prefill made g[0]. Round 0: two accepted, the third rejected and corrected to the target's g[3], the
    # fourth thrown.
    assert (first.k, first.accepted, first.rejected, first.thrown, first.bonus, first.emitted) == (4, 2, 1, 1, False, 3)
    assert first.draft_tokens == (g[1], g[2], wrong, g[4]) and first.target_tokens[:3] == tuple(g[1:4])
    # Round 1: all four accepted, plus the bonus g[8].
    assert (second.k, second.accepted, second.rejected, second.thrown, second.bonus, second.emitted) == (
        4, 4, 0, 0, True, 5,
    )
    assert second.target_tokens == tuple(g[4:9])
    assert list(run.output_tokens) == g
    assert drafter.told == [2, 4]
    assert run.target_passes == 3  # the prefill (1 token) + two rounds (3 + 5) for 9 tokens
    assert run.stop_reason == "max_new_tokens"


def test_rounds_are_cut_by_max_new_tokens_and_never_draft_past_it(tiny):
    run = generate(tiny, self_draft(tiny), PROMPT, 4, GREEDY, 8, torch.Generator())
    assert [(r.k, r.emitted) for r in run.rounds] == [(4, 5), (1, 2)]  # after the prefill's token: 1 + 5 + 2
    assert list(run.output_tokens) == greedy_without_cache(tiny.model, PROMPT, 8)
    assert run.stop_reason == "max_new_tokens"
    # one token left after a round: the last round drafts nothing
    short = generate(tiny, self_draft(tiny), PROMPT, 4, GREEDY, 7, torch.Generator())
    assert [(r.k, r.accepted, r.emitted) for r in short.rounds] == [(4, 4, 5), (0, 0, 1)]
    # a budget of one token is the prefill's alone: no round at all
    once = generate(tiny, self_draft(tiny), PROMPT, 4, GREEDY, 1, torch.Generator())
    assert (len(once.output_tokens), once.rounds, once.stop_reason) == (1, (), "max_new_tokens")


def test_generation_stops_at_eos_and_the_round_is_recorded_as_cut():
    model = tiny_llama(64, seed=7)
    prompt = [3, 9, 27, 17, 51, 25, 11]
    free = greedy_without_cache(model, prompt, 40)
    at = next(i for i in range(6, 40) if free[i] not in free[:i])  # a token first said at position ≥ 6: the EOS
    model.generation_config.eos_token_id = free[at]
    target = Loaded("tiny-eos", model, None, torch.device("cpu"), torch.float32)
    # Right drafts only: each round keeps its 8 drafts and the bonus (9 tokens) until the one that says EOS.
    run = generate(target, Scripted([free[j : j + 8] for j in range(1, at + 1, 9)]), prompt, 8, GREEDY, 64,
                   torch.Generator())
    assert list(run.output_tokens) == free[: at + 1] and run.stop_reason == "eos"
    starts = range(1, at + 1, 9)
    assert [(r.k, r.accepted, r.emitted) for r in run.rounds] == [(8, 8, min(9, at - j + 1)) for j in starts]
    ngram = generate(target, NgramDrafter(1), prompt, 8, GREEDY, 64, torch.Generator())
    assert list(ngram.output_tokens) == free[: at + 1] and ngram.stop_reason == "eos"


def test_after_every_round_the_caches_hold_exactly_the_committed_text(tiny):
    drafter = self_draft(tiny)
    target, text = CachedTarget(tiny), CommittedText(PROMPT, len(PROMPT) + 40, tiny.device)
    with torch.inference_mode():
        logits, _, _ = target.prefill(text.tokens)
        first = logits.argmax().view(1)
        text.append(first.tolist(), first)
        drafter.prefill(text.tokens, None, None)
        assert target.length == len(PROMPT) == text.length - 1
        for _ in range(6):
            clock = Clock(tiny.device)
            r = speculative_round(target, drafter, text, 3, GREEDY, None, clock, 40, frozenset()).read(clock)
            # The target's cache holds every committed token but the newest, fed with the next drafts.
            assert target.length == text.length - 1
            # The drafter's cache lags one more token after a bonus round (its last draft was never fed).
            assert drafter.cache.get_seq_length() == text.length - (2 if r.bonus else 1)


def test_drafters_that_ask_get_the_targets_hidden_states_of_the_kept_positions(tiny):
    class Listening(Scripted):
        wants_hidden = (2, -1)  # the input of layer 2 and the final normed output, side by side
        wants_top = 0

        def prefill(self, tokens: torch.Tensor, hidden: torch.Tensor | None, top: torch.Tensor | None) -> None:
            self.prompt_hidden = hidden

        def accepted(self, n: int, hidden: torch.Tensor | None, top: torch.Tensor | None) -> None:
            self.hidden = hidden

    g = greedy_without_cache(tiny.model, PROMPT, 4)
    drafter = Listening([[g[1], g[2], 7]])
    run = generate(tiny, drafter, PROMPT, 3, GREEDY, 4, torch.Generator())  # k = 2: the budget's limit
    width = 2 * tiny.model.config.hidden_size
    assert run.rounds[0].accepted == 2 and drafter.hidden.shape == (3, width)
    assert drafter.prompt_hidden.shape == (len(PROMPT), width)
    with torch.inference_mode():  # independently: one pass over the whole text
        full = torch.tensor([PROMPT + g[:3]])
        states = tiny.model(input_ids=full, output_hidden_states=True).hidden_states
        expected = torch.cat([states[2][0], states[-1][0]], dim=-1)
    torch.testing.assert_close(drafter.hidden, expected[-3:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(drafter.prompt_hidden, expected[: len(PROMPT)], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("prompt", "max_new", "message"), [
    ([], 4, "the prompt is empty"),
    ([5], 0, "max-new-tokens must be >= 1, got 0"),
    ([5] * 501, 12, "prompt (501 tokens) + max-new-tokens (12) exceeds the model's context of 512 tokens"),
])
def test_generate_refuses_what_it_cannot_decode(tiny, prompt, max_new, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        generate(tiny, NoDraft(), prompt, None, GREEDY, max_new, torch.Generator())


def test_a_prompt_that_fills_the_context_exactly_is_decoded(tiny):
    run = generate(tiny, NoDraft(), [5] * 500, None, GREEDY, 12, torch.Generator())  # 500 + 12 = 512
    assert len(run.output_tokens) == 12 and run.prompt_tokens == (5,) * 500


def test_the_timings_partition_the_run(tiny):
    started = time.perf_counter()
    run = generate(tiny, self_draft(tiny), PROMPT, 3, GREEDY, 12, torch.Generator())
    outside = time.perf_counter() - started
    assert all(r.draft_s >= 0 and r.verify_s >= 0 for r in run.rounds)
    # the same clock, read around the call: the parts fit in the whole, and the whole in what the caller saw
    assert 0 <= run.prefill_s + run.draft_s + run.verify_s <= run.wall_s <= outside
    assert run.prompt_tokens == tuple(PROMPT) and run.draft_calls == sum(r.k for r in run.rounds)  # a call a draft
    plain = generate(tiny, NoDraft(), PROMPT, None, GREEDY, 12, torch.Generator())
    assert plain.draft_calls == 0 and [r.k for r in plain.rounds] == [0] * 11


def test_a_sampled_run_is_reproduced_by_its_seed_whatever_torchs_global_state(tiny):
    decoding = Decoding("sample", 0.9, 0.95)
    draft = tiny_llama(tiny.model.config.vocab_size, seed=9)

    def run(global_seed: int) -> tuple:
        torch.manual_seed(global_seed)
        gen = torch.Generator().manual_seed(4)
        out = generate(tiny, ModelDrafter(draft, decoding, gen, tiny.vocab_size), PROMPT, 3, decoding, 16, gen)
        return out.output_tokens, [(r.draft_tokens, r.target_tokens) for r in out.rounds]

    assert run(0) == run(1)


def test_in_sample_mode_the_prefills_token_is_drawn(tiny):
    # the tiny model spreads its next token over thousands of ids: five seeds, five first tokens
    firsts = {generate(tiny, NoDraft(), PROMPT, None, Decoding("sample", 1.0, 1.0), 1,
                       torch.Generator().manual_seed(seed)).output_tokens for seed in range(5)}
    assert len(firsts) == 5
