"""`runner train-draft`: make the data, pick the draft vocabulary, train the head epoch by epoch, keep the best.

Every epoch (and the untrained head, epoch 0) is scored on held-out prompts: at each draft position, how often
the head's top draft equals the target's token given that the drafts before it did, which is what a greedy
verification round accepts. The epoch with the most expected accepted drafts is saved.
"""

from __future__ import annotations

import math
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import PretrainedConfig

from runner.engine.weights import head_files, models
from runner.engine.weights.head_config import HeadConfig
from runner.engine.weights.heads import EagleHead
from runner.store.trainings import pooled
from runner.train.conversations import Conversation, Read, data_name, read_all
from runner.train.data import Sample
from runner.train.unroll import acceptance_counts, batches, unrolled, weighted_loss

HELDOUT_EVERY = 10  # every 10th prompt of each category is held out for the per-epoch evaluation
WARMUP_SHARE = 0.05  # of all optimizer steps, spent ramping the learning rate up
FLOOR_SHARE = 0.1  # the cosine schedule ends at this share of the peak learning rate


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a training; the CLI only parses into this."""

    target: str  # model spec of the target the head drafts for
    out: Path  # the head's directory: config.json + model.safetensors, written whole at the end
    data: tuple[Path, ...]  # files of conversations or prompts, read in turn; every HELDOUT_EVERY-th held out
    max_tokens: int  # answer tokens of training data the target writes (whole answers, so a little more)
    epochs: int
    draft_vocab: int  # rows of the head's LM head: the most frequent tokens of the training answers
    seed: int
    db: Path | None  # where the training and its epochs are recorded; None: nowhere
    unroll: int = 3  # draft positions trained (training-time test; Medusa: its heads) and scored per epoch
    lr: float = 2e-3  # AdamW's peak learning rate
    max_new_tokens: int = 192  # the longest answer the target writes to a training prompt
    batch_size: int = 32  # prompts the target answers together
    threads: int | None = None  # torch threads; None: torch's default (one per core)
    batch_tokens: int = 1024  # padded tokens per optimizer step: small, for many steps on little data
    device: str | None = None  # None: cuda when present
    command: str = ""  # the command line, recorded with the training
    kind: str = "eagle"  # what is trained: an EAGLE head, or Medusa heads ('medusa', `medusa_fit.py`)
    learn_context: bool = False  # an EAGLE head also learns each prompt's own next tokens (`unroll.fixed_start`)


@dataclass(frozen=True)
class Epoch:
    number: int  # 0: the untrained head
    train_loss: float | None
    heldout_loss: float
    categories: dict[str, list[tuple[int, int]]]  # per held-out category, (judged, accepted) at positions 1..unroll
    seconds: float

    @property
    def positions(self) -> list[tuple[int, int]]:
        """(judged, accepted) at draft positions 1..unroll over every held-out category."""
        return pooled(self.categories)

    @property
    def rates(self) -> list[float]:
        return [accepted / judged if judged else 0.0 for judged, accepted in self.positions]

    @property
    def expected_accepted(self) -> float:
        """Mean drafts a greedy round of k = unroll accepts: Σ_j P(drafts 1..j all right)."""
        first = self.positions[0][0]
        return sum(accepted for _, accepted in self.positions) / first if first else 0.0


@dataclass
class Trained:
    """What a training made, for the CLI's summary and the database row."""

    train_id: str
    epochs: list[Epoch] = field(default_factory=list)
    saved_epoch: int = 0
    train_tokens: int = 0
    heldout_tokens: int = 0
    coverage: float = 0.0
    data_cached: bool = False
    data_s: float = 0.0
    train_s: float = 0.0


def split(prompts: list[Conversation]) -> tuple[list[Conversation], list[Conversation]]:
    """(training conversations, held-out ones): every HELDOUT_EVERY-th of each category is held out, all its
    turns with it."""
    seen: dict[str, int] = {}
    train, heldout = [], []
    for prompt in prompts:
        seen[prompt.category] = seen.get(prompt.category, 0) + 1
        (heldout if seen[prompt.category] % HELDOUT_EVERY == 0 else train).append(prompt)
    return train, heldout


def vocabulary(samples: list[Sample], size: int, vocab_size: int) -> tuple[torch.Tensor, float]:
    """The `size` target ids the answers use most (ties: the prompts' use, then the lower id), in id order, and
    the share of answer tokens they cover: a draft can never propose a token outside them."""
    answers = torch.bincount(torch.cat([s.tokens[s.answer_start :] for s in samples]), minlength=vocab_size)
    asked = torch.bincount(torch.cat([s.tokens[: s.answer_start] for s in samples]), minlength=vocab_size)
    score = answers.double() * (asked.sum().item() + 1) + asked.double()
    ids = score.argsort(descending=True, stable=True)[:size].sort().values
    return ids, answers[ids].sum().item() / max(1, answers.sum().item())


def rope_of(config: PretrainedConfig) -> dict:
    """The target's rotary settings as published heads write them (rope_theta, rope_scaling)."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    theta = float(params.pop("rope_theta", getattr(config, "rope_theta", 10000.0)))
    kind = params.get("rope_type", "default")
    return {"rope_theta": theta} | ({} if kind == "default" else {"rope_scaling": params})


def feature_rms(samples: list[Sample], layers: int) -> torch.Tensor:
    """(layers,) root mean square of each layer's features, the first position left out (attention sinks there
    reach hundreds of times the typical size)."""
    features = torch.cat([s.features[1:].float() for s in samples])  # (n, layers·H)
    return features.view(features.shape[0], layers, -1).pow(2).mean(dim=(0, 2)).sqrt()


def initial_head(loaded: models.Loaded, layers: tuple[int, ...], draft_ids: torch.Tensor,
                 rms: torch.Tensor, seed: int) -> EagleHead:
    """A head of the target's width, started so that it learns in few steps. Its LM head starts as the target's
    own rows for the draft vocabulary, and its final norm as the target's scaled so that a random direction gets
    logits of spread 1 (the target's own would give ~6, and a loss of ~20 to unlearn first). `fc` is scaled so that
    each layer's features (`rms` apart: ~3 to ~23 for SmolLM2) add up to a residual stream of unit size, and the
    attention's and the MLP's output projections start at zero, so the layer's branches are not drowned. Its random
    weights are `seed`'s, so one recipe trains one head."""
    torch.manual_seed(seed)
    tc = loaded.model.config
    heads = tc.num_attention_heads
    config = HeadConfig(
        hidden_size=tc.hidden_size, target_hidden_size=tc.hidden_size, intermediate_size=tc.intermediate_size,
        num_attention_heads=heads, num_key_value_heads=tc.num_key_value_heads or heads,
        head_dim=getattr(tc, "head_dim", None) or tc.hidden_size // heads, rms_norm_eps=tc.rms_norm_eps,
        vocab_size=tc.vocab_size, draft_vocab_size=draft_ids.numel(),
        aux_layer_ids=layer_ids(layers, tc.num_hidden_layers), hidden_act=tc.hidden_act,
        max_position_embeddings=tc.max_position_embeddings, rope=rope_of(tc), target=loaded.spec,
    )
    head = EagleHead(config, loaded.model.get_input_embeddings(), layers).to(loaded.device)
    head.set_vocabulary(draft_ids.to(loaded.device))
    with torch.no_grad():
        width = tc.hidden_size * len(layers)
        scale = (1 / (math.sqrt(width) * rms)).repeat_interleave(tc.hidden_size).to(loaded.device)  # (L·H,)
        head.fc.weight.copy_(torch.randn_like(head.fc.weight) * scale)
        head.midlayer.self_attn.o_proj.weight.zero_()
        head.midlayer.mlp.down_proj.weight.zero_()
        rows, norm = loaded.model.get_output_embeddings().weight[draft_ids], loaded.model.get_decoder().norm.weight
        head.lm_head.weight.copy_(rows)
        spread = (rows.pow(2) * norm.pow(2)).sum(-1).sqrt().mean()  # logits' std for a unit-rms random direction
        head.norm.weight.copy_(norm / spread)
    return head


def trainable(head: EagleHead) -> list[torch.nn.Parameter]:
    """Everything but the target's embedding, which the head only reads."""
    return [p for name, p in head.named_parameters() if not name.startswith("embed_tokens.")]


def row_of(head: EagleHead) -> torch.Tensor:
    """(V,) each target id's row in the draft vocabulary, -1 outside it."""
    rows = torch.full((head.config.vocab_size,), -1, dtype=torch.long, device=head.d2t.device)
    rows[head.draft_ids] = torch.arange(head.d2t.numel(), device=head.d2t.device)
    return rows


def evaluate(head: EagleHead, samples: list[Sample], config: TrainConfig, device: torch.device) -> tuple[
        float, dict[str, list[tuple[int, int]]]]:
    """Held-out loss (mean over batches, weighted by judged positions) and, per category, (judged, accepted) per
    draft position; each category is batched apart so that its counts are its own."""
    rows = row_of(head)
    total, weight = 0.0, 0
    per_category: dict[str, list[tuple[int, int]]] = {}
    with torch.no_grad():
        for category in sorted({s.category for s in samples}):
            counts = [(0, 0)] * config.unroll
            for batch in batches([s for s in samples if s.category == category], config.batch_tokens, None, device):
                results = unrolled(head, batch, config.unroll, rows)
                judged = int(results[0].judged.sum())
                total += float(weighted_loss(results)) * judged
                weight += judged
                counts = [(a + c, b + d) for (a, b), (c, d) in zip(counts, acceptance_counts(results), strict=True)]
            per_category[category] = counts
    return total / max(1, weight), per_category


def schedule(config: TrainConfig, steps: int) -> Callable[[int], float]:
    """Learning-rate multiplier: a linear warm-up, then a cosine down to FLOOR_SHARE."""
    warmup = max(1, round(WARMUP_SHARE * steps))

    def factor(step: int) -> float:
        cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, step / steps)))
        return min(1.0, (step + 1) / warmup) * (FLOOR_SHARE + (1 - FLOOR_SHARE) * cosine)

    return factor


def fit(head: EagleHead, train: list[Sample], heldout: list[Sample], config: TrainConfig,
        on_epoch: Callable[[Epoch], None], on_step: Callable[[int, int], None], resumed: dict | None = None,
        keep: Callable[[dict], None] = lambda state: None) -> tuple[list[Epoch], dict]:
    """Train for config.epochs, or what is left of them after the state `resumed` (as `keep` was given it); returns
    every epoch's scores and the weights of the best one. `keep` is given the whole state after each epoch, before
    `on_epoch`; `on_step(tokens, epoch_tokens)` after each optimizer step."""
    device = head.d2t.device
    rng = random.Random(config.seed)
    torch.manual_seed(config.seed)
    params = trainable(head)
    optimizer = torch.optim.AdamW(params, lr=config.lr, betas=(0.9, 0.95), weight_decay=0.0)
    per_epoch = batches(train, config.batch_tokens, None, device, config.learn_context)
    epoch_tokens = sum(int(b.lengths.sum()) for b in per_epoch)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule(config, len(per_epoch) * config.epochs))
    rows = row_of(head)
    if resumed is None:
        start = time.perf_counter()
        loss, categories = evaluate(head, heldout, config, device)
        epochs = [Epoch(0, None, loss, categories, time.perf_counter() - start)]
        best = {name: t.detach().clone() for name, t in head.weights().items()}
    else:
        head.load_state_dict(resumed["head"], strict=False)
        optimizer.load_state_dict(resumed["optimizer"])
        scheduler.load_state_dict(resumed["scheduler"])
        rng.setstate(resumed["rng"])
        epochs, best = [Epoch(**e) for e in resumed["epochs"]], resumed["best"]
    for epoch in epochs:
        on_epoch(epoch)
    for number in range(len(epochs), config.epochs + 1):
        start, losses = time.perf_counter(), []
        for batch in batches(train, config.batch_tokens, rng, device, config.learn_context):
            loss = weighted_loss(unrolled(head, batch, config.unroll, rows))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            scheduler.step()
            losses.append(float(loss.detach()))
            on_step(int(batch.lengths.sum()), epoch_tokens)
        heldout_loss, categories = evaluate(head, heldout, config, device)
        epoch = Epoch(number, sum(losses) / len(losses), heldout_loss, categories, time.perf_counter() - start)
        if epoch.expected_accepted > max(e.expected_accepted for e in epochs):
            best = {name: t.detach().clone() for name, t in head.weights().items()}
        epochs.append(epoch)
        keep({"head": head.weights(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
              "rng": rng.getstate(), "epochs": [asdict(e) for e in epochs], "best": best})
        on_epoch(epoch)
    return epochs, best


def default_layers(target_layers: int) -> tuple[int, ...]:
    """EAGLE-3's choice: the inputs of layers 2, L/2 and L-3 (indices into the target's hidden_states)."""
    return (2, target_layers // 2, target_layers - 3)


def layer_ids(layers: tuple[int, ...], target_layers: int) -> tuple[int, ...] | None:
    """How config.json names `layers`: as SpecForge does (outputs of layers, the first 1), which reads back as
    `layers` when they ascend from 2; else nothing, which is EAGLE-3's default (not ascending under 6 layers)."""
    if layers[0] == 2 and list(layers) == sorted(layers):
        return tuple(i - 1 for i in layers)
    if layers == default_layers(target_layers):
        return None
    raise ValueError(f"target layers {list(layers)} cannot be written as EAGLE-3 layer ids")


def new_train_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-", time.gmtime()) + uuid.uuid4().hex[:4]


def head_bytes(out: Path) -> int:
    return sum(f.stat().st_size for f in out.iterdir() if f.is_file())


def save(head: EagleHead, weights: dict, out: Path) -> None:
    head.load_state_dict(weights, strict=False)
    head_files.save(head, out)


def load_split(paths: tuple[Path, ...]) -> tuple[list[Conversation], list[Conversation], Read]:
    """The data files' conversations, in file order, split for training and evaluation, and what was read and
    skipped."""
    read = read_all(paths)
    train, heldout = split(read.conversations)
    if not heldout or not train:
        raise ValueError(f"{data_name(paths)}: needs {HELDOUT_EVERY} prompts in a category at least (every "
                         f"{HELDOUT_EVERY}th of each is held out for evaluation)")
    return train, heldout, read
