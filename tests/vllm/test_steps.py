"""vLLM's verify steps as rounds, on hand-made metrics: every count worked out by hand."""

from __future__ import annotations

import pytest

from runner.records import Generation
from runner.vllm.client import reply_of
from runner.vllm.process import VllmError
from runner.vllm.steps import rounds_of


def outcome(rounds) -> list[tuple]:
    return [(r.k, r.accepted, r.rejected, r.thrown, r.bonus, r.emitted) for r in rounds]


def test_each_step_is_a_round_with_its_rejected_thrown_and_bonus():
    # k = 4: 4 accepted (bonus), 2 accepted (the 3rd refused, the 4th thrown), 0 accepted (refused at once, 3
    # thrown); output 1 (prefill) + 5 + 3 + 1 = 10 tokens
    rounds = rounds_of((4, 4, 4), (4, 2, 0), 10)
    assert outcome(rounds) == [(4, 4, 0, 0, True, 5), (4, 2, 1, 1, False, 3), (4, 0, 1, 3, False, 1)]
    assert all(r.draft_tokens is None and r.target_tokens is None and r.draft_s is None and r.verify_s is None
               for r in rounds)


def test_steps_vllm_leaves_out_are_rounds_that_drafted_nothing():
    # prompt lookup found no match on 3 steps: 1 + (4+1) + (1+1) = 8 of 11 tokens, so 3 rounds drafted nothing
    rounds = rounds_of((4, 4), (4, 1), 11)
    assert outcome(rounds) == [(4, 4, 0, 0, True, 5), (4, 1, 1, 2, False, 2)] + [(0, 0, 0, 0, True, 1)] * 3
    assert 1 + sum(r.emitted for r in rounds) == 11


def test_a_last_step_cut_by_max_tokens_emits_what_was_left():
    # 1 + 5 + 5 = 11 > 9: the last step's 4 accepted drafts and bonus were cut to 3 tokens
    assert outcome(rounds_of((4, 4), (4, 4), 9)) == [(4, 4, 0, 0, True, 5), (4, 4, 0, 0, True, 3)]


def test_plain_decoding_is_one_round_per_token_after_the_prefills():
    assert outcome(rounds_of((), (), 4)) == [(0, 0, 0, 0, True, 1)] * 3
    assert rounds_of((), (), 0) == ()


def test_steps_that_emit_more_than_the_output_are_refused():
    with pytest.raises(ValueError, match="more than"):
        rounds_of((4,), (0,), 1)  # 1 + 1 = 2 tokens for an output of 1


def test_the_generation_of_vllm_rounds_has_no_times():
    rounds = rounds_of((4,), (2,), 4)
    generation = Generation((1,), (5, 6, 7, 8), rounds, 0.1, 0.3, 1, "max_new_tokens")
    assert (generation.draft_s, generation.verify_s, generation.target_passes) == (None, None, 2)


ANSWER = {"choices": [{"token_ids": [5, 6, 7, 8], "finish_reason": "length"}],
          "metrics": {"time_to_first_token_ms": 100.0, "generation_time_ms": 250.0,
                      "speculative_decoding": {"mean_acceptance_length": 3.0, "draft_acceptance_rate": 0.5,
                                               "acceptance_histogram": [0, 0, 1, 0, 0], "num_spec_steps": 1,
                                               "num_accepted_draft_tokens": 2, "num_draft_tokens": 4,
                                               "num_spec_tokens": 4, "per_step_accepted": [2],
                                               "per_step_drafted": [4]}}}


def test_a_response_is_read_into_ids_times_and_steps():
    reply = reply_of(ANSWER)
    assert (reply.output_ids, reply.finish_reason, reply.ttft_s, reply.generation_s) == ((5, 6, 7, 8), "length",
                                                                                         0.1, 0.25)
    assert (reply.steps.accepted, reply.steps.drafted, reply.steps.num_spec_tokens) == ((2,), (4,), 4)


def test_a_response_without_per_step_metrics_is_refused():
    summary = {**ANSWER["metrics"]["speculative_decoding"], "per_step_accepted": None, "per_step_drafted": None}
    with pytest.raises(VllmError, match="per-request-spec-decode-metrics detailed"):
        reply_of({**ANSWER, "metrics": {**ANSWER["metrics"], "speculative_decoding": summary}})
    with pytest.raises(VllmError, match="enable-per-request-metrics"):
        reply_of({**ANSWER, "metrics": None})
