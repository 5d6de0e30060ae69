"""One training of a draft head, end to end: check the input, make the data, train, save, record.

Safe to interrupt: the head directory is written whole at the end (nothing half-written in it), the
self-distilled data is cached chunk by chunk and the training's state after every finished epoch is kept aside
(`resume.py`), so running the same command again continues where it stopped; the database row says 'interrupted'
meanwhile.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from runner.engine.weights import head_files, models
from runner.engine.weights.medusa_heads import FINAL_NORMED
from runner.pair_engine import provenance
from runner.store.connect import check_db
from runner.store.trainings import TrainingLog
from runner.train import data, medusa_fit, resume
from runner.train.conversations import data_name
from runner.train.fit import (
    Epoch,
    TrainConfig,
    Trained,
    default_layers,
    feature_rms,
    fit,
    head_bytes,
    initial_head,
    load_split,
    new_train_id,
    save,
    vocabulary,
)

TRAIN_DTYPE = "float32"  # gradients in bf16 lose too much on CPU; features are stored in bf16 either way
KINDS = ("eagle", "medusa")  # `--kind`


def check(config: TrainConfig) -> None:
    """Refuse bad input before any model work; raises ValueError (ModelError, PromptError) or StoreError."""
    for name, value, low in (("epochs", config.epochs, 1), ("max-tokens", config.max_tokens, 1),
                             ("threads", 1 if config.threads is None else config.threads, 1),
                             ("unroll", config.unroll, 1), ("max-new-tokens", config.max_new_tokens, 1),
                             ("draft-vocab", config.draft_vocab, 1)):
        if value < low:
            raise ValueError(f"--{name} must be >= {low}, got {value}")
    if not config.lr > 0:
        raise ValueError(f"--lr must be > 0, got {config.lr}")
    if config.kind not in KINDS:
        raise ValueError(f'unknown --kind "{config.kind}"; use {" or ".join(KINDS)}')
    if config.learn_context and config.kind != "eagle":
        raise ValueError("--learn-context trains an EAGLE head only (--kind eagle)")
    out = config.out
    if out.exists() and not (out.is_dir() and (not any(out.iterdir()) or (out / head_files.CONFIG).is_file())):
        raise ValueError(f"--out {out} exists and is not a draft head directory; pick another")
    load_split(config.data)
    if config.db is not None:
        check_db(config.db)
    vocab = models.load_config(config.target).vocab_size
    if config.draft_vocab > vocab:
        raise ValueError(f"--draft-vocab {config.draft_vocab} exceeds the target's vocabulary of {vocab}")


class TokensPerSecond(ProgressColumn):
    """Tokens done over the task and how fast, over the last half minute."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        total = "?" if task.total is None else f"{task.total:,.0f}"
        return Text(f"{task.completed:,.0f}/{total} tokens" + (f", {speed:,.0f} tok/s" if speed else ""))


def _progress(console: Console) -> Progress:
    columns = (TextColumn("{task.description}"), BarColumn(), TokensPerSecond(), TimeRemainingColumn(),
               TextColumn("{task.fields[heldout]}"))
    return Progress(*columns, console=console, disable=not console.is_terminal, speed_estimate_period=30)


def train_draft(config: TrainConfig, console: Console) -> Trained:
    """Check, load the target, make (or reuse) the data, train, save the best epoch to `config.out`, record."""
    check(config)
    if config.threads:
        torch.set_num_threads(config.threads)
    started, cpu_start, load_before = time.perf_counter(), time.process_time(), os.getloadavg()[0]
    train_prompts, heldout_prompts, read = load_split(config.data)
    console.print(read.summary(data_name(config.data)), highlight=False)
    loaded = models.load(config.target, config.device, TRAIN_DTYPE)
    loaded.model.requires_grad_(False)
    medusa = config.kind == "medusa"
    layers = (FINAL_NORMED,) if medusa else default_layers(loaded.model.config.num_hidden_layers)
    state_path = resume.state_path(config, train_prompts + heldout_prompts)
    resumed = resume.load_state(state_path)
    result = Trained(resumed["train_id"] if resumed else new_train_id())
    log = TrainingLog(config.db, result.train_id)
    continued = {"started_at": datetime.fromisoformat(resumed["started_at"]),
                 "resumed_epoch": len(resumed["epochs"]) - 1} if resumed else {}
    log.start({**continued,
        "target": config.target, "draft": f"{config.kind}:{config.out}", "out_dir": str(config.out),
        "prompts_file": ", ".join(map(str, config.data)), "train_prompts": len(train_prompts),
        "heldout_prompts": len(heldout_prompts), "max_new_tokens": config.max_new_tokens, "epochs": config.epochs,
        "draft_vocab": loaded.vocab_size if medusa else config.draft_vocab, "layers": list(layers),
        "unroll": config.unroll, "lr": config.lr, "learn_context": config.learn_context,
        "seed": config.seed, "threads": torch.get_num_threads(), "load_before": load_before,
        "device": str(loaded.device), "dtype": TRAIN_DTYPE, "command": config.command,
        **{k: v for k, v in provenance(loaded.device).items() if k != "device_name"},
    })
    try:
        with _progress(console) as progress:
            _train(config, loaded, layers, (train_prompts, heldout_prompts), result, log, progress, console,
                   (state_path, resumed))
    except KeyboardInterrupt:
        log.finish("interrupted", _fields(result, started, cpu_start))
        raise
    except Exception as error:
        log.finish("error", _fields(result, started, cpu_start) | {"error": f"{type(error).__name__}: {error}"})
        raise
    log.finish("ok", _fields(result, started, cpu_start) | {"head_bytes": head_bytes(config.out)})
    state_path.unlink(missing_ok=True)
    return result


def _train(config: TrainConfig, loaded: models.Loaded, layers: tuple[int, ...], split: tuple[list, list],
           result: Trained, log: TrainingLog, progress: Progress, console: Console,
           kept: tuple[Path, dict | None]) -> None:
    (train_prompts, heldout_prompts), (state_path, resumed) = split, kept
    start = time.perf_counter()
    task = progress.add_task("the target answers the training conversations", total=config.max_tokens, heldout="")
    train, result.data_cached = data.corpus(loaded, train_prompts, layers, config.max_tokens, config.max_new_tokens,
                                            config.batch_size, lambda n: progress.advance(task, n))
    progress.update(task, description="… and the held-out prompts", completed=0, total=None)
    heldout, _ = data.corpus(loaded, heldout_prompts, layers, 10**9, config.max_new_tokens, config.batch_size,
                             lambda n: progress.advance(task, n))
    progress.remove_task(task)
    result.data_s = time.perf_counter() - start
    result.train_tokens = sum(s.answer_tokens for s in train)
    result.heldout_tokens = sum(s.answer_tokens for s in heldout)
    start = time.perf_counter()
    task = progress.add_task("epoch 1", total=None, heldout="")
    on_epoch = _reporter(config, log, console, progress, task)

    def on_step(tokens: int, total: int) -> None:
        progress.update(task, advance=tokens, total=total)

    if config.kind == "medusa":
        heads, result.coverage = medusa_fit.initial_heads(loaded, config.unroll), 1.0
        result.epochs, best = medusa_fit.fit_medusa(heads, train, heldout, config, on_epoch, on_step)
    else:
        draft_ids, result.coverage = vocabulary(train, config.draft_vocab, loaded.model.config.vocab_size)
        head = initial_head(loaded, layers, draft_ids, feature_rms(train, len(layers)), config.seed)
        identity = {"train_id": result.train_id, "started_at": log.started_at.isoformat()}  # plain types only
        result.epochs, best = fit(head, train, heldout, config, on_epoch, on_step, resumed,
                                  lambda state: resume.save_state(identity | state, state_path))
    result.saved_epoch = max(result.epochs, key=lambda e: e.expected_accepted).number
    result.train_s = time.perf_counter() - start
    if config.kind == "medusa":
        medusa_fit.save(heads, best, config)
    else:
        save(head, best, config.out)


def _reporter(config: TrainConfig, log: TrainingLog, console: Console, progress: Progress,
              task: int) -> Callable[[Epoch], None]:
    """What each scored epoch does: recorded, printed, and shown on the progress bar."""

    def on_epoch(epoch: Epoch) -> None:
        log.epoch(epoch.number, epoch.train_loss, epoch.heldout_loss, epoch.seconds,
                  None if epoch.number == 0 else config.lr, epoch.categories)
        rates = " ".join(f"{r:.3f}" for r in epoch.rates)
        by_category = ", ".join(f"{c} {' '.join(f'{a / j if j else 0:.2f}' for j, a in counts)}"
                                for c, counts in epoch.categories.items())
        console.print(f"epoch {epoch.number}: held-out loss {epoch.heldout_loss:.3f}, acceptance by position "
                      f"{rates}, expected accepted at k={config.unroll}: {epoch.expected_accepted:.2f} "
                      f"({by_category})", highlight=False)
        progress.reset(task, description=f"epoch {epoch.number + 1}",
                       heldout=f"held-out α@1 {epoch.rates[0]:.3f} (epoch {epoch.number})")

    return on_epoch


def _fields(result: Trained, started: float, cpu_start: float) -> dict:
    return {
        "train_tokens": result.train_tokens, "heldout_tokens": result.heldout_tokens,
        "vocab_coverage": result.coverage, "saved_epoch": result.saved_epoch, "data_cached": result.data_cached,
        "data_s": result.data_s, "train_s": result.train_s, "wall_s": time.perf_counter() - started,
        "cpu_s": time.process_time() - cpu_start, "load_after": os.getloadavg()[0],
    }


def epoch_table(trained: Trained) -> Table:
    """Per epoch: the losses and the held-out acceptance at each draft position (epoch 0: untrained)."""
    positions = len(trained.epochs[0].positions)
    table = Table(title=f"training {trained.train_id}", title_justify="left")
    for name in ("epoch", "train loss", "held-out loss", *(f"accept@{j}" for j in range(1, positions + 1)),
                 f"accepted at k={positions}", "s"):
        table.add_column(name, justify="right")
    for e in trained.epochs:
        mark = " (saved)" if e.number == trained.saved_epoch else ""
        table.add_row(f"{e.number}{mark}", "" if e.train_loss is None else f"{e.train_loss:.3f}",
                      f"{e.heldout_loss:.3f}", *(f"{r:.3f}" for r in e.rates), f"{e.expected_accepted:.2f}",
                      f"{e.seconds:.0f}")
    return table


def default_prompts() -> Path:
    """The training prompts shipped with specdash (disjoint from the built-in suite heads are evaluated on)."""
    return Path(__file__).parent / "prompts.jsonl"
