"""`train-draft`: an EAGLE-style draft head trained for a target on its own answers."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import torch
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from runner.cli.shared import Device, Target, app, fail, stderr, stdout
from runner.engine.weights import models
from runner.store.schema import StoreError
from runner.train.conversations import DataError
from runner.train.fit import TrainConfig
from runner.train.pipeline import default_prompts, epoch_table, train_draft
from runner.train.write_prompts import write_prompts


@app.command("write-prompts")
def write_prompts_command(
    out: Annotated[Path, typer.Option(help="the JSONL the prompts are appended to (train-draft --data reads it)")],
    count: Annotated[int, typer.Option(help="prompts the file should hold")] = 400,
    target: Target = models.DEFAULT_MODEL,
    seed: int = 0,
    batch_size: Annotated[int, typer.Option(help="requests the target answers together")] = 16,
    device: Device = None,
    threads: Annotated[int | None, typer.Option(help="torch threads (default: one per core); 1 is much faster on a "
                                                     "machine other jobs keep busy")] = None,
) -> None:
    """Have the target write training prompts across topics and kinds of task, deduplicated and disjoint from the
    evaluation prompts; a rerun adds to the file."""
    if count < 1 or batch_size < 1:
        fail(f"--count and --batch-size must be >= 1, got {count} and {batch_size}")
    if out.exists() and not out.is_file():
        fail(f"--out {out} is not a file")
    if threads is not None:
        if threads < 1:
            fail(f"--threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    try:
        loaded = models.load(target, device, "float32")
        with Progress(TextColumn("writing prompts"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=stderr, disable=not stderr.is_terminal) as progress:
            task = progress.add_task("", total=count)
            written = write_prompts(loaded, out, count, seed, batch_size, lambda n: progress.advance(task, n))
    except (ValueError, DataError) as exc:
        fail(str(exc))
    stdout.print(written.line(out), highlight=False, soft_wrap=True)


@app.command("train-draft")
def train_draft_command(
    out: Annotated[Path, typer.Option(help="the head's directory (config.json + model.safetensors), written last")],
    target: Target = models.DEFAULT_MODEL,
    data: Annotated[list[Path] | None, typer.Option(
        "--data", "--prompts", help="conversations (ShareGPT `conversations`, OpenAI `messages`, `turns`) or prompts "
        "({id, category, prompt}), JSON Lines or one JSON array; repeat for several files, read one after another; "
        "the target rewrites every answer. Default: the shipped training prompts")] = None,
    max_tokens: Annotated[int, typer.Option(help="answer tokens of training data the target writes")] = 60_000,
    epochs: int = 6,
    draft_vocab: Annotated[int, typer.Option(help="the head's vocabulary: the most frequent answer tokens")] = 8192,
    unroll: Annotated[int, typer.Option(help="draft positions trained on the head's own outputs (medusa: its heads)")]
    = 3,
    lr: Annotated[float, typer.Option(help="AdamW's peak learning rate")] = 2e-3,
    max_new_tokens: Annotated[int, typer.Option(help="the longest answer per training prompt")] = 192,
    seed: int = 0,
    db: Annotated[Path, typer.Option(help="the DuckDB file the training and its epochs go to")] = Path("runs.duckdb"),
    device: Device = None,
    threads: Annotated[int | None, typer.Option(help="torch threads (default: one per core); 1 is faster on a "
                                                     "machine other jobs keep busy")] = None,
    kind: Annotated[str, typer.Option(help="eagle (an EAGLE-3 head) or medusa (Medusa-1 heads)")] = "eagle",
    learn_context: Annotated[bool, typer.Option(help="the head also learns to predict the prompts' own text, not "
                                                     "only the target's answers")] = False,
) -> None:
    """Train an EAGLE-style draft head (or Medusa heads) for a target on its own answers; record every epoch."""
    config = TrainConfig(
        target=target, out=out, data=tuple(data or [default_prompts()]), max_tokens=max_tokens, epochs=epochs,
        draft_vocab=draft_vocab, seed=seed, db=db, unroll=unroll, lr=lr, max_new_tokens=max_new_tokens,
        device=device, threads=threads, command=" ".join(["python -m runner", *sys.argv[1:]]), kind=kind,
        learn_context=learn_context,
    )
    try:
        trained = train_draft(config, stderr)
    except (ValueError, StoreError) as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        stderr.print(f"interrupted: {out} was not written; run the same command again to continue from the last "
                     "finished epoch")
        raise typer.Exit(130) from None
    stdout.print(epoch_table(trained), highlight=False)
    stdout.print(f"saved epoch {trained.saved_epoch} to {out}; compare it: python -m runner sweep --draft {kind}:{out}",
                 highlight=False, soft_wrap=True)
