"""A vLLM request's verify steps as rounds, in the explainer's terms.

vLLM reports per step only how many drafts it proposed and accepted (`per_step_drafted`, `per_step_accepted`), not
the tokens nor the times: a round's tokens and times are None (NULL in `rounds`). A step whose drafter proposed
nothing (prompt lookup found no match) is not verified as a speculative step and is absent from the arrays; it still
emitted one token, so it is recorded as a round that drafted nothing (k = 0), after the reported steps (vLLM does not
say where they fell). Then the rounds account for the whole output: the prefill's token plus every round's.
"""

from __future__ import annotations

from runner.records import Round


def step_round(drafted: int, accepted: int, emitted: int) -> Round:
    """One verify step: the first draft the target refused is rejected, those after it thrown; all accepted earns
    the bonus token."""
    rejected = int(accepted < drafted)
    return Round(k=drafted, accepted=accepted, rejected=rejected, thrown=drafted - accepted - rejected,
                 bonus=accepted == drafted, emitted=emitted, draft_s=None, verify_s=None,
                 draft_tokens=None, target_tokens=None)


def rounds_of(drafted: tuple[int, ...], accepted: tuple[int, ...], output_len: int) -> tuple[Round, ...]:
    """The rounds of a request of `output_len` new tokens whose verify steps drafted and accepted these counts.

    Each step emits its accepted drafts and one target token; the last may be cut by max_tokens or EOS, which ends
    the output. Tokens left over after the steps and the prefill's were emitted by steps that drafted nothing."""
    if len(drafted) != len(accepted):
        raise ValueError(f"vLLM reported {len(drafted)} drafted counts for {len(accepted)} accepted ones")
    if output_len == 0:
        return ()
    emitted = [a + 1 for a in accepted]
    over = 1 + sum(emitted) - output_len
    if over > 0:  # the last step was cut: it emitted only what the output still had room for
        if not emitted or emitted[-1] - over < 1:
            raise ValueError(f"vLLM's steps emit {1 + sum(emitted)} tokens, more than the {output_len} it returned")
        emitted[-1] -= over
    rounds = [step_round(d, a, e) for d, a, e in zip(drafted, accepted, emitted, strict=True)]
    return (*rounds, *(step_round(0, 0, 1) for _ in range(max(0, -over))))
