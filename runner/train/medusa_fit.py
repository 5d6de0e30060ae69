"""`runner train-draft --kind medusa`: Medusa-1 heads trained on the same self-distilled answers as EAGLE heads.

The data are `data.corpus`'s with the one hidden state the heads read (-1, the final normed one), so a sample's
features[t] is the state at position t, whose logits made token t + 1; head i learns token t + 2 + i there, at every
t from the answer's first token on (where a round can start). The heads share the target's LM head (not trained, not
saved) and each has one residual block started at zero, so every head starts as the target's own next-token guess.
Loss: cross-entropy of each head, head i weighted 0.8^i (Medusa-1's λ), AdamW with warm-up and cosine decay.

Every epoch (and the untrained heads, epoch 0) is scored on the held-out answers as a greedy chain round accepts: at
draft position j, how often head j - 1's top token is right given that the heads before it were.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from runner.engine.weights import medusa_files, models
from runner.engine.weights.medusa_heads import MedusaHeads
from runner.train.data import Sample
from runner.train.fit import Epoch, TrainConfig, schedule

LAYERS = 1  # residual blocks per head, as Medusa-1 publishes its heads
DECAY = 0.8  # head i's loss weight is DECAY^i
IGNORE = -100  # no target: the text ends before the token this head would guess
ROWS = 256  # hidden states per optimizer step


def initial_heads(loaded: models.Loaded, heads: int) -> MedusaHeads:
    """Heads over the target's own LM head, their blocks at zero: x + SiLU(0) = x."""
    lm = loaded.model.get_output_embeddings().weight
    made = MedusaHeads(heads, LAYERS, lm.shape[1], (False,) * heads, lm, loaded.vocab_size).to(loaded.device)
    with torch.no_grad():
        for p in made.parameters():
            p.zero_()
    return made


def rows(samples: list[Sample], heads: int) -> tuple[Tensor, Tensor, list[str]]:
    """Every position a round can start from: its hidden state (N, H), each head's target token (N, heads; IGNORE
    past the text's end), and its sample's category."""
    features, targets, categories = [], [], []
    for s in samples:
        start, length = s.answer_start - 1, s.tokens.numel()  # position answer_start - 1 made the first answer token
        at = torch.arange(start, length - 1)  # rows whose newest token is in the answer
        wanted = at[:, None] + 2 + torch.arange(heads)[None]  # head i: token t + 2 + i
        targets.append(torch.where(wanted < length, s.tokens[wanted.clamp(max=length - 1)], IGNORE))
        features.append(s.features[at].float())
        categories += [s.category] * at.numel()
    return torch.cat(features), torch.cat(targets), categories


def loss_of(heads: MedusaHeads, x: Tensor, y: Tensor) -> Tensor:
    logits = heads(x)  # (heads, B, V)
    losses = [F.cross_entropy(logits[i].float(), y[:, i], ignore_index=IGNORE) for i in range(heads.heads)
              if bool((y[:, i] != IGNORE).any())]
    return sum(DECAY**i * loss for i, loss in enumerate(losses))


def evaluate(heads: MedusaHeads, x: Tensor, y: Tensor, categories: list[str]) -> tuple[
        float, dict[str, list[tuple[int, int]]]]:
    """Held-out loss and, per category, (judged, accepted) at draft positions 1..heads of a greedy chain."""
    with torch.no_grad():
        loss = float(loss_of(heads, x, y))
        right = torch.cat([heads(x[i : i + ROWS]).argmax(-1).T for i in range(0, x.shape[0], ROWS)]) == y
    judged = (y != IGNORE) & torch.cat([torch.ones_like(right[:, :1]), right[:, :-1].cumprod(1).bool()], dim=1)
    accepted = judged & right
    per_category = {}
    for category in sorted(set(categories)):
        mine = torch.tensor([c == category for c in categories])
        per_category[category] = [(int(judged[mine, j].sum()), int(accepted[mine, j].sum()))
                                  for j in range(heads.heads)]
    return loss, per_category


def fit_medusa(heads: MedusaHeads, train: list[Sample], heldout: list[Sample], config: TrainConfig,
               on_epoch: Callable[[Epoch], None], on_step: Callable[[int, int], None]) -> tuple[list[Epoch], dict]:
    """Train for config.epochs; every epoch's scores, and the weights of the one with the most expected accepted."""
    device = next(heads.parameters()).device
    x, y, _ = rows(train, heads.heads)
    hx, hy, categories = rows(heldout, heads.heads)
    x, y, hx, hy = x.to(device), y.to(device), hx.to(device), hy.to(device)
    torch.manual_seed(config.seed)
    rng = random.Random(config.seed)
    steps = (x.shape[0] + ROWS - 1) // ROWS
    optimizer = torch.optim.AdamW(heads.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule(config, steps * config.epochs))
    start = time.perf_counter()
    epochs = [Epoch(0, None, *evaluate(heads, hx, hy, categories), time.perf_counter() - start)]
    best = {name: t.detach().clone() for name, t in heads.weights().items()}
    on_epoch(epochs[0])
    for number in range(1, config.epochs + 1):
        start, losses = time.perf_counter(), []
        order = list(range(x.shape[0]))
        rng.shuffle(order)
        for i in range(0, len(order), ROWS):
            batch = torch.tensor(order[i : i + ROWS], device=device)
            loss = loss_of(heads, x[batch], y[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(heads.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            losses.append(float(loss.detach()))
            on_step(batch.numel(), x.shape[0])
        epoch = Epoch(number, sum(losses) / len(losses), *evaluate(heads, hx, hy, categories),
                      time.perf_counter() - start)
        if epoch.expected_accepted > max(e.expected_accepted for e in epochs):
            best = {name: t.detach().clone() for name, t in heads.weights().items()}
        epochs.append(epoch)
        on_epoch(epoch)
    return epochs, best


def save(heads: MedusaHeads, weights: dict, config: TrainConfig) -> None:
    heads.load_weights(weights)
    medusa_files.save(heads, config.out, config.target)
