"""The training-time test (EAGLE-3, HASS): the head is unrolled on its own outputs, as it runs when drafting.

Step 0 reads the target's features at position i with token i+1 and predicts token i+2. Step j reads, at the
same index i, the head's own output of step j-1 with token i+1+j and predicts token i+2+j: what the head does
for its (j+1)-th draft. Its attention sees the step-0 keys up to i (the target's features, as the draft cache
holds them) and its own keys of steps 1..j at index i (the drafts made since), exactly the cache it has when
drafting. Tokens fed are the target's own (the data is its answers): a later draft only counts when the earlier
ones were right, and then they were these tokens. A head that learns the context as well (`--learn-context`) is
fed and judged on the prompts' own tokens there, which the target did not write: more data, less exactly its own.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from runner.engine.weights.heads import Attend, EagleHead
from runner.train.data import Sample

STEP_WEIGHT = 0.8  # step j's loss is weighted STEP_WEIGHT**j (EAGLE-3)


@dataclass(frozen=True)
class Batch:
    """Samples right-padded to one length T; the head's index i runs over 0..T-2."""

    tokens: Tensor  # (B, T) ids, 0 after each sample's end
    features: Tensor  # (B, T-1, L·H) the target's features, zero after each sample's end
    lengths: Tensor  # (B, 1) tokens per sample
    learn_from: Tensor  # (B, 1) the first token a prediction is judged at: the answer's, or earlier (`batches`)

    def fed(self, step: int) -> Tensor:
        """(B, T-1): the token step `step` reads at index i, token i+1+step (0 past the end)."""
        return F.pad(self.tokens[:, 1 + step :], (0, step))

    def judged(self, step: int) -> Tensor:
        """(B, T-1) bool: index i predicts token `learn_from` or a later one at step 0, and the text goes on to
        token i+2+step."""
        i = torch.arange(self.tokens.shape[1] - 1, device=self.tokens.device)[None]
        return (i + 2 >= self.learn_from) & (i + 2 + step < self.lengths)

    def wanted(self, step: int) -> Tensor:
        """(B, T-1): the target's token i+2+step, the one step `step` should predict."""
        return F.pad(self.tokens[:, 2 + step :], (0, step + 1))


def batches(samples: list[Sample], max_tokens: int, rng: random.Random | None, device: torch.device,
            learn_context: bool = False) -> list[Batch]:
    """Samples of similar length together, at most `max_tokens` padded tokens a batch; shuffled when `rng` is given.
    Predictions are judged from each sample's answer on, or with `learn_context` after the samples' `fixed_start`."""
    learn_from = fixed_start(samples) if learn_context else None
    ordered = sorted(samples, key=lambda s: s.tokens.numel())
    groups: list[list[Sample]] = [[]]
    for sample in ordered:
        if groups[-1] and (len(groups[-1]) + 1) * sample.tokens.numel() > max_tokens:
            groups.append([])
        groups[-1].append(sample)
    if rng is not None:
        rng.shuffle(groups)
    return [_pad(group, device, learn_from) for group in groups if group]


def fixed_start(samples: list[Sample]) -> int:
    """How many tokens every sample starts with alike (the chat template's system turn and the user's header): with
    `learn_context`, the head learns to predict every token after them, the prompts' own text included, its label the
    text's next token. That is data the target did not write greedily, at no cost of answering: the features of
    every prompt position were kept anyway."""
    first = samples[0].tokens
    common = first.numel()
    for sample in samples[1:]:
        n = min(common, sample.tokens.numel())
        differ = (first[:n] != sample.tokens[:n]).nonzero()
        common = int(differ[0]) if differ.numel() else n
    return common


def _pad(group: list[Sample], device: torch.device, learn_from: int | None) -> Batch:
    width = max(s.tokens.numel() for s in group)
    tokens = torch.stack([F.pad(s.tokens, (0, width - s.tokens.numel())) for s in group])
    features = torch.stack([F.pad(s.features.float(), (0, 0, 0, width - 1 - s.features.shape[0])) for s in group])
    lengths = torch.tensor([[s.tokens.numel()] for s in group])
    starts = torch.tensor([[s.answer_start if learn_from is None else learn_from] for s in group])
    return Batch(tokens.to(device), features.to(device), lengths.to(device), starts.to(device))


def _unrolled_attend() -> Attend:
    """Attention of step j, for each layer of the head: causal over step 0's keys, plus each later step's key at the
    same index (j + 1 keys per layer so far)."""
    cached: dict[int, tuple[list[Tensor], list[Tensor]]] = {}

    def attend(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        keys, values = cached.setdefault(layer, ([], []))
        keys.append(k)
        values.append(v)
        groups = q.shape[1] // k.shape[1]  # query heads per key head (grouped-query attention)
        ks = [t.repeat_interleave(groups, dim=1) for t in keys]
        vs = [t.repeat_interleave(groups, dim=1) for t in values]
        scale = 1 / math.sqrt(q.shape[-1])
        length = q.shape[2]
        causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
        scores = (q @ ks[0].transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))  # (B, H, T, T)
        diagonal = [(q * key).sum(-1, keepdim=True) * scale for key in ks[1:]]  # each (B, H, T, 1)
        weights = torch.softmax(torch.cat([scores, *diagonal], dim=-1), dim=-1)
        out = weights[..., :length] @ vs[0]
        for m, value in enumerate(vs[1:]):
            out = out + weights[..., length + m : length + m + 1] * value
        return out

    return attend


@dataclass(frozen=True)
class StepResult:
    """One unrolled step over a batch."""

    loss: Tensor  # mean cross-entropy over its judged positions whose token the draft vocabulary holds
    correct: Tensor  # (B, T-1) bool: the head's top draft equals the target's token (False where not judged)
    judged: Tensor  # (B, T-1) bool


def unroll(head: EagleHead, batch: Batch, depth: int) -> list[Tensor]:
    """The head's output (B, T-1, h) at every index for each step 0..depth-1."""
    attend = _unrolled_attend()
    hidden = head.fuse(batch.features)  # (B, T-1, h)
    positions = torch.arange(hidden.shape[1], device=hidden.device)[None]
    outputs = []
    for step in range(depth):
        outputs.append(head.step(hidden, batch.fed(step), positions + step, attend))
        hidden = head.feedback(outputs[-1])
    return outputs


def unrolled(head: EagleHead, batch: Batch, depth: int, row_of: Tensor) -> list[StepResult]:
    """Run `depth` steps and score them; `row_of` (V,) maps a target id to its draft-vocabulary row, -1 outside."""
    draft_ids = head.draft_ids
    results = []
    for step, hidden in enumerate(unroll(head, batch, depth)):
        judged = batch.judged(step)
        wanted = batch.wanted(step)[judged]
        logits = head.logits(hidden[judged])  # (n, Vd): only where a prediction is judged, the costly part
        rows = row_of[wanted]
        known = rows >= 0
        loss = F.cross_entropy(logits[known], rows[known]) if bool(known.any()) else logits.sum() * 0
        correct = torch.zeros_like(judged)
        correct[judged] = draft_ids[logits.argmax(-1)] == wanted
        results.append(StepResult(loss, correct, judged))
    return results


def weighted_loss(results: list[StepResult]) -> Tensor:
    return sum(STEP_WEIGHT**j * r.loss for j, r in enumerate(results)) / sum(STEP_WEIGHT**j for j in
                                                                               range(len(results)))


def acceptance_counts(results: list[StepResult]) -> list[tuple[int, int]]:
    """Per draft position j+1: (judged, accepted), where position j+1 is judged only when drafts 1..j were right,
    as in a verification round."""
    counts = []
    chain = torch.ones_like(results[0].judged)
    for r in results:
        judged = r.judged & chain
        chain = judged & r.correct
        counts.append((int(judged.sum()), int(chain.sum())))
    return counts
