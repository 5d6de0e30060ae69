"""The decode loop against plain greedy, scripted drafts and the KV-cache invariant.

The real model's speculative output is checked against transformers' own `generate` in test_reference.py.
"""

from __future__ import annotations

import pytest
import torch

from runner.engine.decode import Clock, Sequence, Target, generate, speculative_round
from runner.engine.drafters import Draft, ModelDrafter, NgramDrafter, NoDraft
from runner.engine.pair import Pair, models, parse_draft
from runner.engine.sampling import Decoding

GREEDY = Decoding("greedy", 0.0, 1.0)
PROMPT = (
    "Summarize the following text in one sentence: The town council voted on Tuesday to close the old bridge "
    "over the river for repairs, starting next month. The repairs will take about six weeks, and a ferry will "
    "run every half hour during the closure. The council said the bridge is safe but the railings are rusting."
)


def plain(target: models.Loaded, prompt: list[int], n: int) -> tuple[int, ...]:
    return generate(target, NoDraft(), prompt, 0, GREEDY, n, torch.Generator()).output_tokens


class Scripted:
    """Proposes exactly the scripted drafts, one list per round, and logs what it is told."""

    calls = 0
    wants_hidden = False

    def __init__(self, script: list[list[int]]) -> None:
        self.script = iter(script)
        self.told: list[int] = []

    def prefill(self, tokens: torch.Tensor) -> None:
        pass

    def propose(self, tokens: torch.Tensor, k: int) -> Draft:
        return Draft(tokens=torch.tensor(next(self.script)[:k]), q=None)

    def accepted(self, n: int, hidden: torch.Tensor | None) -> None:
        self.told.append(n)


@pytest.mark.parametrize("draft", ["ngram", "layerskip:1", "layerskip:3", "model:tiny"])
def test_greedy_speculative_equals_plain_greedy_on_a_tiny_random_model(tiny, tiny_dir, draft):
    spec = parse_draft(draft.replace("tiny", str(tiny_dir)))
    pair = Pair(tiny, [spec])
    prompt = list(range(100, 140)) * 2  # repeats, so prompt lookup finds matches
    expected = plain(tiny, prompt, 48)
    assert len(expected) == 48
    for k in (1, 2, 4, 8):
        assert pair.run(spec, prompt, k, GREEDY, 48, seed=0).output_tokens == expected, (draft, k)


def test_the_target_drafting_for_itself_gets_a_bonus_every_round(smollm2):
    prompt = models.encode_chat(smollm2, "Write a haiku about rain.")
    run = generate(smollm2, ModelDrafter(smollm2.model, GREEDY, None), prompt, 4, GREEDY, 30, torch.Generator())
    assert run.output_tokens == plain(smollm2, prompt, 30)
    assert [(r.k, r.accepted, r.rejected, r.thrown, r.bonus) for r in run.rounds[:5]] == [(4, 4, 0, 0, True)] * 5
    assert all(r.bonus and r.accepted == r.k for r in run.rounds)


def test_scripted_drafts_give_exactly_the_explainers_round(smollm2):
    prompt = models.encode_chat(smollm2, PROMPT)
    g = plain(smollm2, prompt, 9)
    wrong = (g[3] + 1) % len(smollm2.tokenizer)
    drafter = Scripted([[g[1], g[2], wrong, g[4]], [g[4], g[5], g[6], g[7]]])
    run = generate(smollm2, drafter, prompt, 4, GREEDY, 9, torch.Generator())
    first, second = run.rounds
    # The prefill made g[0]. Round 0: two accepted, the third rejected and corrected to the target's g[3], the
    # fourth thrown.
    assert (first.k, first.accepted, first.rejected, first.thrown, first.bonus, first.emitted) == (4, 2, 1, 1, False, 3)
    assert first.target_tokens[:3] == g[1:4]
    # Round 1: all four accepted, plus the bonus g[8].
    assert (second.k, second.accepted, second.rejected, second.thrown, second.bonus, second.emitted) == (
        4, 4, 0, 0, True, 5,
    )
    assert second.target_tokens[4] == g[8]
    assert run.output_tokens == g
    assert drafter.told == [2, 4]
    assert run.target_passes == 3  # the prefill (1 token) + two rounds (3 + 5) for 9 tokens


def test_rounds_are_cut_by_max_new_tokens_and_never_draft_past_it(smollm2):
    prompt = models.encode_chat(smollm2, PROMPT)
    run = generate(smollm2, ModelDrafter(smollm2.model, GREEDY, None), prompt, 4, GREEDY, 8, torch.Generator())
    assert [(r.k, r.emitted) for r in run.rounds] == [(4, 5), (1, 2)]  # after the prefill's token: 1 + 5 + 2
    assert len(run.output_tokens) == 8 and run.stop_reason == "max_new_tokens"


def test_generation_stops_at_eos_and_the_round_is_recorded_as_cut(smollm2):
    prompt = models.encode_chat(smollm2, "Reply with just the word yes.")
    expected = plain(smollm2, prompt, 64)
    eos = smollm2.tokenizer.eos_token_id
    assert expected[-1] == eos and len(expected) < 64
    run = generate(smollm2, NgramDrafter(3), prompt, 8, GREEDY, 64, torch.Generator())
    assert run.output_tokens == expected and run.stop_reason == "eos"
    assert sum(r.emitted for r in run.rounds) == len(expected) - 1  # the first came from the prefill


def test_after_every_round_the_caches_hold_exactly_the_committed_text(smollm2):
    prompt = models.encode_chat(smollm2, PROMPT)
    drafter = ModelDrafter(smollm2.model, GREEDY, None)
    target, text = Target(smollm2), Sequence(prompt, len(prompt) + 40, smollm2.device)
    with torch.inference_mode():
        text.append([int(target.prefill(text.tokens).argmax())])
        drafter.prefill(text.tokens)
        assert target.length == len(prompt) == text.length - 1
        for _ in range(6):
            r = speculative_round(target, drafter, text, 3, GREEDY, None, Clock(smollm2.device), 40, frozenset())
            # The target's cache holds every committed token but the newest, fed with the next drafts.
            assert target.length == text.length - 1
            # The drafter's cache lags one more token after a bonus round (its last draft was never fed).
            assert drafter.cache.get_seq_length() == text.length - (2 if r.bonus else 1)


def test_drafters_that_ask_get_the_targets_hidden_states_of_the_kept_positions(smollm2):
    class Listening(Scripted):
        wants_hidden = True

        def accepted(self, n: int, hidden: torch.Tensor | None) -> None:
            self.hidden = hidden

    prompt = models.encode_chat(smollm2, PROMPT)
    g = plain(smollm2, prompt, 4)
    drafter = Listening([[g[1], g[2], 7]])
    run = generate(smollm2, drafter, prompt, 3, GREEDY, 4, torch.Generator())  # k = 2: the budget's limit
    assert run.rounds[0].accepted == 2 and drafter.hidden.shape == (3, smollm2.model.config.hidden_size)
    with torch.inference_mode():  # independently: one pass over the whole text
        full = torch.tensor([prompt + list(g[:3])])
        expected = smollm2.model(input_ids=full, output_hidden_states=True).hidden_states[-1][0, -3:]
    torch.testing.assert_close(drafter.hidden, expected, atol=1e-4, rtol=1e-4)
