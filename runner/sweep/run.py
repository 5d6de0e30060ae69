"""A sweep: every prompt × mode × (baseline, then each draft × k), one recorded run per cell."""

from __future__ import annotations

import platform
import socket
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch
import transformers
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from runner.engine import models
from runner.engine.pair import PLAIN, DraftSpec, Pair, parse_draft
from runner.engine.sampling import Decoding
from runner.records import CELL_KEY, RunRecord
from runner.store.connect import check_db
from runner.store.runs import baseline_for, flush_pending, recorded_runs, write_run
from runner.sweep.prompts import Prompt


@dataclass(frozen=True)
class SweepConfig:
    """Everything that defines a sweep; the CLI only parses into this."""

    target: str  # model spec of the target
    drafts: tuple[str, ...]  # drafter specs, each run at every k
    ks: tuple[int, ...]  # draft lengths
    decodings: tuple[Decoding, ...]  # greedy and/or sampling settings; each gets its own baseline
    prompts: tuple[Prompt, ...]  # already selected and validated
    max_new_tokens: int
    seed: int  # sampling seed, the same for a baseline and its speculative runs
    db: Path
    device: str | None  # None: cuda when present
    dtype: str | None  # None: bf16 on cuda, fp32 on cpu
    sweep_id: str | None = None  # set to resume: cells already recorded are skipped
    kernels: str = "skinny"  # the linears' path on CPU: 'skinny' (measured per shape) or 'stock' (F.linear)
    threads: int | None = None  # torch CPU threads; None leaves torch's setting as it is


@dataclass(frozen=True)
class Cell:
    """One run to make."""

    prompt: Prompt
    decoding: Decoding
    draft: DraftSpec
    k: int | None  # None for the baseline

    def key(self, seed: int) -> tuple:
        """The cell's values of `CELL_KEY`, in its order."""
        d = self.decoding
        values = {"prompt_id": self.prompt.id, "draft": self.draft.text, "k": self.k, "mode": d.mode,
                  "temperature": d.temperature, "top_p": d.top_p, "seed": seed}
        return tuple(values[name] for name in CELL_KEY)


def interleaved(prompts: tuple[Prompt, ...]) -> list[Prompt]:
    """The first prompt of every category, then the second of each, …: a sweep cut short still covers
    every category."""
    rank: dict[str, int] = {}
    order = []
    for position, prompt in enumerate(prompts):
        rank[prompt.category] = rank.get(prompt.category, -1) + 1
        order.append((rank[prompt.category], position, prompt))
    return [prompt for *_, prompt in sorted(order, key=lambda item: item[:2])]


def plan(config: SweepConfig) -> Iterator[Cell]:
    """Baseline first, so each speculative run can be checked against it as soon as it finishes."""
    drafts = [parse_draft(d) for d in config.drafts]
    for prompt in interleaved(config.prompts):
        for decoding in config.decodings:
            yield Cell(prompt, decoding, PLAIN, None)
            for draft in drafts:
                for k in config.ks:
                    yield Cell(prompt, decoding, draft, k)


def provenance(device: torch.device) -> dict[str, str]:
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        commit = ""
    return {
        "torch_version": torch.__version__, "transformers_version": transformers.__version__,
        "python_version": platform.python_version(), "host": socket.gethostname(), "git_commit": commit,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
    }


def new_sweep_id() -> str:
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:4]


class Recorder:
    """Runs cells on a loaded pair and writes each as one run (one transaction with its rounds)."""

    def __init__(self, config: SweepConfig, sweep_id: str, pair: Pair) -> None:
        self.config, self.sweep_id, self.pair = config, sweep_id, pair
        self.provenance = provenance(pair.target.device)
        self.lossless_failures: list[str] = []
        self.errors: list[str] = []
        # (prompt id, decoding) -> the baseline's (run_id, output tokens), kept from this process's runs so a
        # speculative cell need not read them back; a resumed sweep finds earlier ones in the database.
        self.baselines: dict[tuple, tuple[str, tuple[int, ...]]] = {}

    def record(self, cell: Cell) -> None:
        cfg, target = self.config, self.pair.target
        ids = models.encode_chat(target, cell.prompt.text)
        d = cell.decoding
        key = (cell.prompt.id, d.mode, d.temperature, d.top_p)
        baseline = None if cell.k is None else self.baselines.get(key) or baseline_for(
            cfg.db, self.sweep_id, cell.prompt.id, d.mode, d.temperature, d.top_p, cfg.seed)
        started = datetime.now(UTC).isoformat()
        try:
            generation = self.pair.run(cell.draft, ids, cell.k, d, cfg.max_new_tokens, cfg.seed)
            status, error = "ok", None
        except Exception as exc:  # noqa: BLE001 - a failing cell (OOM, say) is recorded and the sweep goes on
            first_line = str(exc).splitlines()[0] if str(exc) else ""
            generation, status, error = None, "error", f"{type(exc).__name__}: {first_line}"
            self.errors.append(f"{cell.prompt.id} {cell.draft.text} k={cell.k}: {error}")
        lossless = None
        if generation is not None and d.greedy and baseline is not None:
            lossless = generation.output_tokens == baseline[1]
            if not lossless:
                self.lossless_failures.append(f"{cell.prompt.id} {cell.draft.text} k={cell.k}")
        run_id = uuid.uuid4().hex[:16]
        write_run(cfg.db, RunRecord(
            run_id=run_id, sweep_id=self.sweep_id, started_at=started, target=cfg.target,
            draft=cell.draft.text, draft_kind=cell.draft.kind, category=cell.prompt.category,
            prompt_id=cell.prompt.id, prompt_text=cell.prompt.text, k=cell.k, mode=d.mode,
            temperature=d.temperature, top_p=d.top_p, seed=cfg.seed, max_new_tokens=cfg.max_new_tokens,
            device=str(target.device), dtype=str(target.dtype).removeprefix("torch."), status=status, error=error,
            generation=generation,
            output_text=None if generation is None else target.tokenizer.decode(list(generation.output_tokens)),
            baseline_run_id=None if baseline is None else baseline[0], lossless=lossless,
            kernels=self.pair.kernels, threads=torch.get_num_threads(), provenance=self.provenance,
        ))
        if cell.k is None and generation is not None:
            self.baselines[key] = (run_id, generation.output_tokens)


def run_sweep(config: SweepConfig, console: Console) -> tuple[str, Recorder]:
    """Load once, warm up, then record every cell not yet recorded. Returns the sweep id and its recorder."""
    sweep_id = config.sweep_id or new_sweep_id()
    check_db(config.db)  # fail on a bad --db before loading any model, creating nothing
    done = recorded_runs(config.db, sweep_id) if config.sweep_id else set()
    cells = [c for c in plan(config) if c.key(config.seed) not in done]
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    target = models.load(config.target, config.device, config.dtype)
    drafts = [parse_draft(d) for d in config.drafts]
    pair = Pair(target, drafts, config.kernels)
    for p in config.prompts:
        if len(models.encode_chat(target, p.text)) + config.max_new_tokens > target.max_context:
            raise ValueError(f'prompt "{p.id}" + max-new-tokens exceeds the model\'s context of {target.max_context}')
    recorder = Recorder(config, sweep_id, pair)
    warm = models.encode_chat(target, config.prompts[0].text)
    for d in config.decodings:
        pair.warm_up([PLAIN, *drafts], warm, max(config.ks), d)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, disable=not console.is_terminal) as progress:
        task = progress.add_task(f"sweep {sweep_id}", total=len(cells))
        for cell in cells:
            progress.update(task, description=f"{cell.prompt.id} {cell.draft.text} k={cell.k} {cell.decoding.mode}")
            recorder.record(cell)
            progress.advance(task)
    flush_pending(config.db)
    return sweep_id, recorder
