"""The decode loop: speculative rounds (draft, verify, compare, append, roll back) and plain decoding.

Plain decoding is the same loop with a drafter that proposes nothing, so the baseline runs through
the same model code, KV cache and timing as every speculative run.

On CUDA the loop keeps the device busy: a round reads the device once (`host`: the drafts and the target's
choices together; prompt lookup reads the new text once more), timing uses events, and tokens reach the
device's copy of the text by device-to-device copies.
"""

from __future__ import annotations

import torch
from torch import Tensor

from runner.engine.round import hidden_states, trees
from runner.engine.round.clock import Clock, Timed
from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.draft import Draft, Drafter, crop_to, new_cache
from runner.engine.round.policies import FIXED, PolicySpec, VerifyCosts
from runner.engine.round.sampling import Ranked, accept_greedy, accept_sampled, draw, host, probabilities, ranked
from runner.engine.weights.models import Loaded
from runner.records import Generation, Round


class NonFiniteLogits(ValueError):
    """The target's logits overflowed (inf/NaN): typically float16 on a model trained in bfloat16."""

    def __init__(self, dtype: torch.dtype) -> None:
        name = str(dtype).removeprefix("torch.")
        super().__init__(f"the target's logits are inf/NaN in {name} (an overflow); use --dtype bfloat16 or float32")


class CachedTarget:
    """The target model and its KV cache.

    Invariant between rounds: the cache holds every committed token but the newest one, which the
    next verify pass feeds together with the drafts.
    """

    def __init__(self, loaded: Loaded) -> None:
        self.model = loaded.model
        self.vocab = loaded.vocab_size  # logits past the tokenizer's ids (a padded head) are cut
        self.cache = new_cache(loaded.model)

    def prefill(self, tokens: Tensor, layers: tuple[int, ...] = (),
                top: int = 0) -> tuple[Tensor, Tensor | None, Ranked | None]:
        """One pass over the whole prompt: the logits (V,) of the first new token, the `layers` hidden states of its
        positions (P, n·H) (`hidden_states.reading`), and with `top` the target's `top` likeliest tokens at every
        prompt position (`Ranked`, P rows), else None."""
        with hidden_states.reading(self.model, layers) as features_of:
            out = self.model(input_ids=tokens[None], cache=self.cache, use_cache=True,
                             logits_to_keep=tokens.numel() if top else 1, output_hidden_states=bool(layers))
        crop_to(self.cache, tokens.numel())  # trims sliding-window layers back to their window
        logits = out.logits[0, :, : self.vocab]
        return logits[-1], _row(features_of(out)), ranked(logits, top) if top else None

    def verify(self, fed: Tensor, layers: tuple[int, ...] = (),
               parents: tuple[int, ...] | None = None) -> tuple[Tensor, Tensor | None]:
        """One pass over `fed` (T,): the logits at every fed position (T, V), and the `layers` hidden states there.
        With `parents`, `fed` is the root and a tree's nodes, each row seeing only its own branch (trees.py); a
        chain passes no mask, so the model runs its own causal one."""
        mask = positions = None
        if parents is not None:
            trees.check_cache(self.cache)
            mask = trees.attention_mask(parents, self.length, self.model.dtype, fed.device)  # (1, 1, T, past + T)
            positions = trees.position_ids(parents, self.length, fed.device)  # (1, T)
        with hidden_states.reading(self.model, layers) as features_of:
            out = self.model(
                input_ids=fed[None], attention_mask=mask, position_ids=positions, cache=self.cache, use_cache=True,
                logits_to_keep=fed.numel(), output_hidden_states=bool(layers),
            )
        return out.logits[0, :, : self.vocab], _row(features_of(out))

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()


def _row(features: Tensor | None) -> Tensor | None:
    return None if features is None else features[0]


class CommittedText:
    """The committed text: a preallocated device buffer (appending never copies the prefix) and its host mirror."""

    def __init__(self, prompt: list[int], capacity: int, device: torch.device) -> None:
        self.buffer = torch.zeros(capacity, dtype=torch.long, device=device)
        self.buffer[: len(prompt)] = torch.tensor(prompt, dtype=torch.long)
        self.ids = list(prompt)  # the same ids on the host

    @property
    def length(self) -> int:
        return len(self.ids)

    @property
    def last(self) -> int:
        return self.ids[-1]

    @property
    def tokens(self) -> Tensor:
        return self.buffer[: self.length]

    def append(self, new: list[int], on_device: Tensor) -> None:
        """`on_device` starts with the same ids, already on the device: no host-to-device copy."""
        self.buffer[self.length : self.length + len(new)] = on_device[: len(new)]
        self.ids.extend(new)


def cut(tokens: list[int], budget: int, eos: frozenset[int]) -> list[int]:
    """The tokens a round may append: at most `budget`, and nothing after an end-of-sequence token."""
    tokens = tokens[:budget]
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


def chain_verdict(draft: Draft, logits: Tensor, finite: Tensor, decoding: Decoding,
                   generator: torch.Generator) -> trees.Verdict:
    """Step 3 for a chain: accepted while the target agrees, left to right, with the round's one host sync."""
    k = draft.tokens.numel()
    if decoding.greedy:
        choices = logits.argmax(-1)  # (k+1,)
        *read, ok = host(torch.cat([draft.tokens, choices, finite]))
        draft_list, target_tokens = read[:k], read[k:]
        accepted = accept_greedy(draft_list, target_tokens)
        token = target_tokens[accepted]
        kept = torch.cat([draft.tokens[:accepted], choices[accepted : accepted + 1]])
    else:
        n, drawn, test = accept_sampled(draft.tokens, draft.q, probabilities(logits, decoding), generator)
        # One host sync for all: float64 holds every token id exactly.
        read = host(torch.cat([draft.tokens.double(), n.view(1), drawn.view(1), finite, test]))
        draft_list, (accepted, token, ok) = [int(t) for t in read[:k]], (int(v) for v in read[k : k + 3])
        kept = torch.cat([draft.tokens[:accepted], drawn.view(1)])
        target_tokens = draft_list[:accepted] + [token]
        judged = min(accepted + 1, k)
        p_d, q_d, u = (tuple(read[k + 3 + i * k : k + 3 + i * k + judged]) for i in range(3))
        return trees.Verdict(draft_list, list(range(accepted)), token, kept, target_tokens, int(accepted < k),
                             bool(ok), trees.Test(p_d, q_d, u, bool(read[-1])))
    return trees.Verdict(draft_list, list(range(accepted)), token, kept, target_tokens, int(accepted < k), bool(ok))


def speculative_round(
    target: CachedTarget, drafter: Drafter, text: CommittedText, k: int, decoding: Decoding,
    generator: torch.Generator, clock: Clock, budget: int, eos: frozenset[int],
) -> Timed:
    """One round as the explainer tells it; appends the emitted tokens to `text`."""
    start = clock.mark()
    committed = text.length
    # 1. Draft: the drafter proposes up to k tokens d1..dk (with q-probabilities when sampling).
    draft = drafter.propose(text.tokens, k)
    drafted = clock.mark()
    k = draft.tokens.numel()
    # 2. Verify: ONE target pass over the newest committed token + d1..dk gives t1..t(k+1); in a tree each node
    #    sees only its own branch, so its row is the target's choice after that branch. A draft's extra rows (the
    #    lookahead window) ride along after d1..dk, never judged.
    fed = trees.fed(draft, text.tokens[-1:])  # (k+1+E,)
    logits, hidden = target.verify(fed, drafter.wants_hidden, trees.pass_parents(draft))  # (k+1+E, V)
    judged = logits[: k + 1]  # (k+1, V) the root and the drafts
    finite = judged.isfinite().all().view(1)
    # 3. Compare, from the root down: accepted while the target agrees; the first failure is rejected (in a tree:
    #    every child of the last accepted node failed), the rest are thrown (never judged); then the target's
    #    own token, the correction or the bonus.
    judge = chain_verdict if draft.parents is None else trees.verdict
    verdict = judge(draft, judged, finite, decoding, generator)
    verified = clock.mark()
    if not verdict.ok:
        raise NonFiniteLogits(logits.dtype)
    # 4. Append the kept drafts and the target's token, cut at EOS or max_new_tokens; the drafter learns its fate
    #    (and, when it asks, the target's top tokens at every row, extra rows included).
    done, kept_rows = commit(drafter, text, draft, verdict, logits, hidden, budget, eos)
    # 5. Roll back: both caches keep the committed text, i.e. the verify pass's rows of the root and the accepted
    #    path (for a chain, its first rows: a crop); extra rows are never kept.
    trees.keep(target.cache, committed - 1, kept_rows)
    assert target.length == text.length - 1 == committed + done.emitted - 1
    return Timed(done, (start, drafted, drafted, verified))


def commit(drafter: Drafter, text: CommittedText, draft: Draft, verdict: trees.Verdict, logits: Tensor,
           hidden: Tensor | None, budget: int, eos: frozenset[int]) -> tuple[Round, list[int]]:
    """Steps 4 and the drafter's half of 5: the judged round appended to `text` (at most `budget` tokens, nothing
    after EOS) and told to the drafter. Returns the round, its times not yet read, and the verify rows whose cache
    entries the target keeps: the root and the accepted path, as far as the text was appended."""
    k, accepted = draft.tokens.numel(), len(verdict.path)
    emitted = cut([verdict.drafts[j] for j in verdict.path] + [verdict.token], budget, eos)
    text.append(emitted, verdict.kept)
    rows = [0, *(j + 1 for j in verdict.path)]
    top = ranked(logits, drafter.wants_top) if drafter.wants_top else None
    drafter.accepted(accepted, hidden[rows] if hidden is not None else None, top)
    return Round(
        k=k, accepted=accepted, rejected=verdict.rejected, thrown=k - accepted - verdict.rejected,
        bonus=not verdict.rejected, emitted=len(emitted), draft_s=0.0, verify_s=0.0,
        draft_tokens=tuple(verdict.drafts), target_tokens=tuple(verdict.target_tokens), draft_parents=draft.parents,
        accepted_path=None if draft.parents is None else tuple(verdict.path),
        extra_rows=0 if draft.extra is None else draft.extra.numel(),
        **({} if verdict.test is None else verdict.test.columns()),
    ), rows[: len(emitted)]


def first_token(logits: Tensor, decoding: Decoding, generator: torch.Generator) -> tuple[int, Tensor]:
    """The prefill's token, on the host and on the device (one host sync per run)."""
    token = (logits.argmax() if decoding.greedy else draw(probabilities(logits, decoding), generator)).view(1)
    value, ok = host(torch.cat([token, logits.isfinite().all().view(1)]))
    if not ok:
        raise NonFiniteLogits(logits.dtype)
    return value, token


def check_lengths(loaded: Loaded, prompt: list[int], max_new_tokens: int) -> None:
    """ValueError for an empty prompt, a budget below 1, or a prompt and budget past the model's context."""
    if not prompt:
        raise ValueError("the prompt is empty")
    if max_new_tokens < 1:
        raise ValueError(f"max-new-tokens must be >= 1, got {max_new_tokens}")
    if len(prompt) + max_new_tokens > loaded.max_context:
        raise ValueError(
            f"prompt ({len(prompt)} tokens) + max-new-tokens ({max_new_tokens}) exceeds the model's "
            f"context of {loaded.max_context} tokens"
        )


def prefilled_text(loaded: Loaded, drafter: Drafter, prompt: list[int], max_new_tokens: int, decoding: Decoding,
                   generator: torch.Generator) -> tuple[CachedTarget, CommittedText]:
    """The prefill: one target pass over the prompt makes the first new token, as in plain decoding. The drafter
    reads the prompt too; the new token is fed with round 0's drafts, like every later one."""
    target = CachedTarget(loaded)
    text = CommittedText(prompt, len(prompt) + max_new_tokens, loaded.device)
    logits, features, top = target.prefill(text.tokens, drafter.wants_hidden, drafter.wants_top)
    first, on_device = first_token(logits, decoding, generator)
    text.append([first], on_device)
    drafter.prefill(text.tokens, features, top)
    return target, text


def generate(
    loaded: Loaded, drafter: Drafter, prompt: list[int], k: int | None, decoding: Decoding,
    max_new_tokens: int, generator: torch.Generator, policy: PolicySpec = FIXED, costs: VerifyCosts | None = None,
) -> Generation:
    """Decode `prompt` with speculative rounds of k drafts, or as many as `policy` gives each round starting from k;
    k None (with `NoDraft`) is plain decoding. Every round's verify time goes into `costs` (shared by a Pair's
    generations), which the `auto` policy reads."""
    check_lengths(loaded, prompt, max_new_tokens)
    clock = Clock(loaded.device)
    with torch.inference_mode():
        start = clock()
        target, text = prefilled_text(loaded, drafter, prompt, max_new_tokens, decoding, generator)
        prefilled = clock()
        rounds: list[Timed] = []
        read: list[Round] = []  # the rounds with their times read, each once the device has passed it
        costs = VerifyCosts() if costs is None else costs
        schedule = policy.schedule(k or 0, costs)
        while text.last not in loaded.eos_ids and (made := text.length - len(prompt)) < max_new_tokens:
            budget = max_new_tokens - made
            # Never draft past the budget: k drafts can yield k+1 tokens.
            timed = speculative_round(
                target, drafter, text, min(schedule.next_k(), budget - 1), decoding, generator, clock, budget,
                loaded.eos_ids,
            )
            schedule.observe(timed.round.depth, timed.round.accepted)
            rounds.append(timed)
            while len(read) < len(rounds) and clock.done(rounds[len(read)].marks[-1]):
                read.append(rounds[len(read)].read(clock))
                costs.add(read[-1].k, read[-1].verify_s)
                schedule.timed(read[-1])
        stop = "eos" if text.last in loaded.eos_ids else "max_new_tokens"
        end = clock()
    for timed in rounds[len(read) :]:  # on CUDA the last rounds are read only now, once the device has passed them
        read.append(timed.read(clock))
        costs.add(read[-1].k, read[-1].verify_s)
    return Generation(
        prompt_tokens=tuple(prompt), output_tokens=tuple(text.ids[len(prompt) :]), rounds=tuple(read),
        prefill_s=prefilled - start, wall_s=end - start, draft_calls=drafter.calls, stop_reason=stop,
    )
