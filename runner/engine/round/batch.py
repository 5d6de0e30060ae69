"""Batched speculative decoding: B sequences decoded together, one target pass verifying every sequence's drafts.

Each sequence keeps its own drafter (its own k, tree or policy), text and sampling generator; the target's KV cache
holds all B rows. A pass carries each sequence's newest token and drafts (k + 1 rows, or its tree, with any extra
rows: the lookahead window), padded to the widest, under a 4D mask that lets each row see only its own committed
text and its own branch (as trees.py does for one sequence), at its own positions.

Rolling back marks which of the pass's new cache columns a sequence keeps, instead of moving memory: the others
become holes the mask hides, and the cache is compacted once it is more than half holes. A sequence that finishes
(EOS or max_new_tokens) leaves the batch: its row is dropped from the cache, and later passes are narrower.

Each sequence is prefilled alone, one after another, so its first token is batch 1's. Timing: a sequence's
prefill_s is the batch's whole prefill phase (no round starts before the last prefill); a round has its own drafting
as draft_s and the whole shared pass (every sequence's verdict included) as verify_s, the time it waited on the
target; its wall_s runs from the batch's start to its own last token, so it also holds the other sequences'
drafting.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import Tensor
from transformers import DynamicCache

from runner.engine.round import hidden_states, trees
from runner.engine.round.clock import Clock, Timed
from runner.engine.round.decode import (
    CommittedText,
    NonFiniteLogits,
    chain_verdict,
    check_lengths,
    commit,
    prefilled_text,
)
from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.draft import Drafter
from runner.engine.round.policies import FIXED, PolicySpec, Schedule, VerifyCosts
from runner.engine.weights.models import Loaded
from runner.records import Generation, Round


class BatchCache:
    """The target and one KV cache over B sequences, each row's committed text (but its newest token) cached."""

    def __init__(self, loaded: Loaded, caches: list[DynamicCache]) -> None:
        """From each sequence's own prefilled cache, left-padded to the longest."""
        self.model, self.vocab = loaded.model, loaded.vocab_size
        self.cached = [c.get_seq_length() for c in caches]  # committed tokens in the cache, per row
        width = max(self.cached)
        self.cache = caches[0]
        trees.check_cache(self.cache)  # a custom mask would get sliding windows wrong
        for layer, *rows in zip(self.cache.layers, *(c.layers for c in caches), strict=True):
            layer.keys, layer.values = (torch.cat([_left_pad(getattr(r, name), width) for r in rows])
                                        for name in ("keys", "values"))
        self.valid = torch.zeros(len(caches), width, dtype=torch.bool)  # (B, C): which cache columns hold text
        for row, n in enumerate(self.cached):
            self.valid[row, width - n :] = True
        self.fed_at = width  # the cache column of the last pass's first row

    def verify(self, fed: list[Tensor], parents: list[tuple[int, ...] | None],
               layers: tuple[int, ...]) -> tuple[Tensor, Tensor | None]:
        """One pass over every row's `fed` (T_i,) (its newest token and drafts; `parents` as `Draft.parents`): the
        logits (B, T, V), T = max T_i, and the hidden states `layers` asks for (`hidden_states.reading`), (B, T, L·H),
        or None."""
        rows, columns, widest = len(fed), self.valid.shape[1], max(f.numel() for f in fed)
        ids = torch.stack([torch.cat([f, f[:1].expand(widest - f.numel())]) for f in fed])  # (B, T), padding repeats
        sees = torch.zeros(rows, widest, columns + widest, dtype=torch.bool)
        sees[:, :, :columns] = self.valid[:, None, :]
        positions = torch.empty(rows, widest, dtype=torch.long)
        for row, (f, branch) in enumerate(zip(fed, parents, strict=True)):
            n = f.numel()
            chain = branch is None
            sees[row, :n, columns : columns + n] = (torch.ones(n, n, dtype=torch.bool).tril() if chain
                                                    else trees.branch_mask(branch))
            sees[row, n:, columns + n :] = torch.eye(widest - n, dtype=torch.bool)  # padding rows: themselves only
            depth = torch.arange(n) if chain else torch.tensor([0, *trees.depths(branch)])
            positions[row] = self.cached[row] + torch.cat([depth, torch.arange(n, widest)])
        device = ids.device
        mask = torch.full(sees.shape, torch.finfo(self.model.dtype).min, dtype=self.model.dtype)
        with hidden_states.reading(self.model, layers) as features_of:
            out = self.model(input_ids=ids, attention_mask=mask.masked_fill(sees, 0.0)[:, None].to(device),
                             position_ids=positions.to(device), cache=self.cache, use_cache=True,
                             logits_to_keep=widest, output_hidden_states=bool(layers))
        self.fed_at = columns
        self.valid = torch.cat([self.valid, torch.zeros(rows, widest, dtype=torch.bool)], dim=1)
        return out.logits[:, :, : self.vocab], features_of(out)

    def keep(self, row: int, kept: list[int]) -> None:
        """Roll row `row` back: of the last pass's rows, its cache keeps `kept` (the root and the accepted path)."""
        self.valid[row, [self.fed_at + r for r in kept]] = True
        self.cached[row] += len(kept)

    def select(self, rows: list[int]) -> None:
        """Keep only these rows (the sequences still decoding), in this order."""
        index = torch.tensor(rows, dtype=torch.long, device=self.cache.layers[0].keys.device)
        for layer in self.cache.layers:
            layer.batch_select_indices(index)
        self.valid = self.valid[rows]
        self.cached = [self.cached[r] for r in rows]

    def compact(self) -> None:
        """Once holes fill over half the cache, gather each row's text to the right, left-padded as at the start."""
        counts = self.valid.sum(dim=1)
        width = int(counts.max())
        if self.valid.shape[1] <= 2 * width:
            return
        columns = torch.zeros(len(self.cached), width, dtype=torch.long)
        valid = torch.zeros(len(self.cached), width, dtype=torch.bool)
        for row, n in enumerate(counts.tolist()):
            columns[row, width - n :] = self.valid[row].nonzero().flatten()
            valid[row, width - n :] = True
        for layer in self.cache.layers:
            heads, _, dim = layer.keys.shape[1:]
            index = columns.to(layer.keys.device)[:, None, :, None].expand(-1, heads, -1, dim)
            layer.keys, layer.values = layer.keys.gather(2, index), layer.values.gather(2, index)
        self.valid = valid


def _left_pad(x: Tensor, width: int) -> Tensor:
    """(1, H, n, D) -> (1, H, width, D), zeros first."""
    return torch.nn.functional.pad(x, (0, 0, width - x.shape[2], 0))


@dataclass
class Member:
    """One sequence of a batch, as it decodes."""

    prompt: list[int]
    drafter: Drafter
    generator: torch.Generator
    text: CommittedText
    schedule: Schedule
    rounds: list[Timed] = field(default_factory=list)
    read: list[Round] = field(default_factory=list)
    end: float | None = None  # the wall time it left the batch

    def finished(self, eos: frozenset[int], max_new_tokens: int) -> bool:
        return self.text.last in eos or self.text.length - len(self.prompt) >= max_new_tokens

    def take_times(self, clock: Clock, costs: VerifyCosts, wait: bool = False) -> None:
        """Read the rounds the device has passed (all of them with `wait`), for the policy and the costs."""
        while len(self.read) < len(self.rounds) and (wait or clock.done(self.rounds[len(self.read)].marks[-1])):
            self.read.append(self.rounds[len(self.read)].read(clock))
            costs.add(self.read[-1].k, self.read[-1].verify_s)
            self.schedule.timed(self.read[-1])


def batch_round(batch: BatchCache, members: list[Member], decoding: Decoding, clock: Clock, max_new_tokens: int,
                eos: frozenset[int]) -> None:
    """One round for every sequence of the batch: each drafts, ONE target pass verifies all, each keeps its own."""
    # 1. Draft: each sequence on its own, never past its budget.
    budgets = [max_new_tokens - (m.text.length - len(m.prompt)) for m in members]
    drafts, marks = [], []
    for m, budget in zip(members, budgets, strict=True):
        start = clock.mark()
        drafts.append(m.drafter.propose(m.text.tokens, min(m.schedule.next_k(), budget - 1)))
        marks.append((start, clock.mark()))
    # 2. Verify: one pass over every sequence's newest token and drafts.
    verifying = clock.mark()
    fed = [trees.fed(d, m.text.tokens[-1:]) for m, d in zip(members, drafts, strict=True)]  # extra rows included
    logits, hidden = batch.verify(fed, [trees.pass_parents(d) for d in drafts], members[0].drafter.wants_hidden)
    finite = logits.isfinite().all().view(1)
    # 3. Compare, per sequence, exactly as one sequence alone would: its root and drafts, never its extra rows.
    verdicts = [(chain_verdict if d.parents is None else trees.verdict)(
        d, logits[row, : d.tokens.numel() + 1], finite, decoding, m.generator)
        for row, (m, d) in enumerate(zip(members, drafts, strict=True))]
    verified = clock.mark()
    if not all(v.ok for v in verdicts):
        raise NonFiniteLogits(logits.dtype)
    # 4-5. Append and roll back, per sequence: its text, its drafter, its row of the cache.
    for row, (m, d, v, f) in enumerate(zip(members, drafts, verdicts, fed, strict=True)):
        n = f.numel()
        done, kept = commit(m.drafter, m.text, d, v, logits[row, :n], None if hidden is None else hidden[row, :n],
                            budgets[row], eos)
        batch.keep(row, kept)
        assert batch.cached[row] == m.text.length - 1
        m.schedule.observe(done.depth, done.accepted)
        m.rounds.append(Timed(replace(done, batch_seqs=len(members)), (*marks[row], verifying, verified)))


def generate_batch(
    loaded: Loaded, drafters: list[Drafter], prompts: list[list[int]], k: int | None, decoding: Decoding,
    max_new_tokens: int, generators: list[torch.Generator], policy: PolicySpec = FIXED,
    costs: VerifyCosts | None = None,
) -> list[Generation]:
    """Decode `prompts` together, each with its own drafter and generator (as `decode.generate` does one), every
    round's drafts verified in one shared pass; plain decoding at batch B with `NoDraft`s and k None."""
    for prompt in prompts:
        check_lengths(loaded, prompt, max_new_tokens)
    clock, costs = Clock(loaded.device), VerifyCosts() if costs is None else costs
    with torch.inference_mode():
        start = clock()
        members, caches = [], []
        for prompt, drafter, generator in zip(prompts, drafters, generators, strict=True):
            alone, text = prefilled_text(loaded, drafter, prompt, max_new_tokens, decoding, generator)
            members.append(Member(prompt, drafter, generator, text, policy.schedule(k or 0, costs)))
            caches.append(alone.cache)
        prefill_s = clock() - start  # every member's: no round starts before the last prefill
        batch = BatchCache(loaded, caches)
        live = list(range(len(members)))  # the members still decoding, in the cache's row order
        while True:
            for i in live:
                if members[i].finished(loaded.eos_ids, max_new_tokens):
                    members[i].end = clock()
            still = [i for i in live if members[i].end is None]
            if len(still) < len(live):  # the finished leave the batch
                batch.select([live.index(i) for i in still])
                live = still
            if not live:
                break
            batch_round(batch, [members[i] for i in live], decoding, clock, max_new_tokens, loaded.eos_ids)
            batch.compact()
            for i in live:
                members[i].take_times(clock, costs)
    for m in members:  # on CUDA the last rounds are read only now, once the device has passed them
        m.take_times(clock, costs, wait=True)
    return [Generation(
        prompt_tokens=tuple(m.prompt), output_tokens=tuple(m.text.ids[len(m.prompt) :]), rounds=tuple(m.read),
        prefill_s=prefill_s, wall_s=m.end - start, draft_calls=m.drafter.calls,
        stop_reason="eos" if m.text.last in loaded.eos_ids else "max_new_tokens") for m in members]
