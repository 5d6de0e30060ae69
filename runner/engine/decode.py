"""The decode loop: speculative rounds (draft, verify, compare, append, roll back) and plain decoding.

Plain decoding is the same loop with a drafter that proposes nothing, so the baseline runs through
the same model code, KV cache and timing as every speculative run.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor
from transformers import DynamicCache
from transformers.utils import ModelOutput

from runner.engine.drafters import Drafter, crop_to
from runner.engine.models import Loaded
from runner.engine.sampling import Decoding, accept_greedy, accept_sampled, draw, probabilities
from runner.records import Generation, Round


class Clock:
    """Wall time that includes the device's queued work (CUDA runs asynchronously)."""

    def __init__(self, device: torch.device) -> None:
        self.sync = device.type == "cuda"

    def __call__(self) -> float:
        if self.sync:
            torch.cuda.synchronize()
        return time.perf_counter()


class Target:
    """The target model and its KV cache.

    Invariant between rounds: the cache holds every committed token but the newest one, which the
    next verify pass feeds together with the drafts.
    """

    def __init__(self, loaded: Loaded) -> None:
        self.model = loaded.model
        self.cache = DynamicCache(config=loaded.model.config)

    def prefill(self, tokens: Tensor, layers: tuple[int, ...] = ()) -> tuple[Tensor, Tensor | None]:
        """One pass over the whole prompt: the logits (V,) of the first new token, and `features_of` its positions."""
        out = self.model(input_ids=tokens[None], cache=self.cache, use_cache=True, logits_to_keep=1,
                         output_hidden_states=bool(layers))
        return out.logits[0, -1], features_of(out, layers)

    def verify(self, fed: Tensor, layers: tuple[int, ...] = ()) -> tuple[Tensor, Tensor | None]:
        """One pass over `fed` (T,): the logits at every fed position (T, V), and `features_of` those positions."""
        out = self.model(
            input_ids=fed[None], cache=self.cache, use_cache=True,
            logits_to_keep=fed.numel(), output_hidden_states=bool(layers),
        )
        return out.logits[0], features_of(out, layers)

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()


def features_of(out: ModelOutput, layers: tuple[int, ...]) -> Tensor | None:
    """(T, len(layers)·H): the hidden states a drafter asked for, side by side; None when it asked for none."""
    return torch.cat([out.hidden_states[i][0] for i in layers], dim=-1) if layers else None


class Sequence:
    """The committed text in a preallocated buffer, so appending never copies the prefix."""

    def __init__(self, prompt: list[int], capacity: int, device: torch.device) -> None:
        self.buffer = torch.zeros(capacity, dtype=torch.long, device=device)
        self.buffer[: len(prompt)] = torch.tensor(prompt, dtype=torch.long)
        self.length = len(prompt)
        self.last = prompt[-1]  # the newest token, on the host

    @property
    def tokens(self) -> Tensor:
        return self.buffer[: self.length]

    def append(self, new: list[int]) -> None:
        self.buffer[self.length : self.length + len(new)] = torch.tensor(new, dtype=torch.long)
        self.length += len(new)
        self.last = new[-1]


def speculative_round(
    target: Target, drafter: Drafter, text: Sequence, k: int, decoding: Decoding,
    generator: torch.Generator, clock: Clock, budget: int, eos: frozenset[int],
) -> Round:
    """One round as the explainer tells it; appends the emitted tokens to `text`."""
    start = clock()
    committed = text.length
    # 1. Draft: the drafter proposes up to k tokens d1..dk (with q-probabilities when sampling).
    draft = drafter.propose(text.tokens, k)
    drafted = clock()
    k = draft.tokens.numel()
    # 2. Verify: ONE target pass over the newest committed token + d1..dk gives t1..t(k+1).
    fed = torch.cat([text.tokens[-1:], draft.tokens])  # (k+1,)
    logits, hidden = target.verify(fed, drafter.wants_hidden)  # (k+1, V)
    # 3. Compare, left to right: accepted while the target agrees; the first failure is rejected, the
    #    rest are thrown (never judged); then the target's own token, the correction or the bonus.
    draft_list = draft.tokens.tolist()
    if decoding.greedy:
        choices = logits.argmax(-1).tolist()  # the one host sync of a greedy round
        accepted = accept_greedy(draft_list, choices)
        target_tokens, token = choices, choices[accepted]
    else:
        accepted, token = accept_sampled(draft.tokens, draft.q, probabilities(logits, decoding), generator)
        target_tokens = draft_list[:accepted] + [token]
    verified = clock()
    # 4. Append the kept drafts and the target's token, cut at EOS or max_new_tokens.
    emitted = (draft_list[:accepted] + [token])[:budget]
    for i, t in enumerate(emitted):
        if t in eos:
            emitted = emitted[: i + 1]
            break
    text.append(emitted)
    # 5. Roll back: both caches forget the drafts that were not kept.
    crop_to(target.cache, text.length - 1)
    drafter.accepted(accepted, hidden[: accepted + 1] if hidden is not None else None)
    assert target.length == text.length - 1 == committed + len(emitted) - 1
    rejected = int(accepted < k)
    return Round(
        k=k, accepted=accepted, rejected=rejected, thrown=k - accepted - rejected, bonus=accepted == k,
        emitted=len(emitted), draft_s=drafted - start, verify_s=verified - drafted,
        draft_tokens=tuple(draft_list), target_tokens=tuple(target_tokens),
    )


def generate(
    target: Loaded, drafter: Drafter, prompt: list[int], k: int | None, decoding: Decoding,
    max_new_tokens: int, generator: torch.Generator,
) -> Generation:
    """Decode `prompt` with speculative rounds of up to k drafts; k None (with `NoDraft`) is plain decoding."""
    if not prompt:
        raise ValueError("the prompt is empty")
    if max_new_tokens < 1:
        raise ValueError(f"max-new-tokens must be >= 1, got {max_new_tokens}")
    if len(prompt) + max_new_tokens > target.max_context:
        raise ValueError(
            f"prompt ({len(prompt)} tokens) + max-new-tokens ({max_new_tokens}) exceeds the model's "
            f"context of {target.max_context} tokens"
        )
    device = target.device
    clock = Clock(device)
    with torch.inference_mode():
        start = clock()
        model = Target(target)
        text = Sequence(prompt, len(prompt) + max_new_tokens, device)
        # The prefill: one target pass over the prompt makes the first new token, as in plain decoding. The
        # drafter reads the prompt too; the new token is fed with round 0's drafts, like every later one.
        logits, features = model.prefill(text.tokens, drafter.wants_hidden)
        text.append([int(logits.argmax() if decoding.greedy else draw(probabilities(logits, decoding), generator))])
        drafter.prefill(text.tokens, features)
        prefilled = clock()
        rounds: list[Round] = []
        while text.last not in target.eos_ids and (made := text.length - len(prompt)) < max_new_tokens:
            budget = max_new_tokens - made
            # Never draft past the budget: k drafts can yield k+1 tokens.
            rounds.append(speculative_round(
                model, drafter, text, min(k or 0, budget - 1), decoding, generator, clock, budget, target.eos_ids,
            ))
        stop = "eos" if text.last in target.eos_ids else "max_new_tokens"
        end = clock()
    return Generation(
        prompt_tokens=tuple(prompt), output_tokens=tuple(text.tokens[len(prompt) :].tolist()),
        rounds=tuple(rounds), prefill_s=prefilled - start, wall_s=end - start,
        draft_calls=drafter.calls, stop_reason=stop,
    )
