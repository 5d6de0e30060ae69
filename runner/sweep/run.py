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

from runner.engine import lossless, models
from runner.engine.pair import PLAIN, DraftSpec, Pair, parse_draft
from runner.engine.policies import FIXED, PolicySpec, parse_policy
from runner.engine.sampling import Decoding
from runner.records import CELL_KEY, Divergence, Generation, RunRecord
from runner.store.connect import check_db
from runner.store.runs import baseline_for, flush_pending, recorded_runs, write_run
from runner.sweep import progress
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
    trust_remote_code: bool = False  # run the model code a checkpoint ships (transformers' trust_remote_code)
    kernels: str = "skinny"  # the linears' path on CPU: 'skinny' (measured per shape) or 'stock' (F.linear)
    threads: int | None = None  # torch CPU threads; None leaves torch's setting as it is
    policies: tuple[str, ...] = (FIXED.text,)  # draft-length policies (--k-policy), each with every draft and k

    def plan_id(self) -> str:
        """What the sweep records, as a short hash: a sweep is resumable by a later one with the same plan."""
        # Policies join the hash only when not the default, so a plan recorded before policies keeps its hash.
        policies = () if self.policies == (FIXED.text,) else (self.policies,)
        return progress.fingerprint(self.target, self.drafts, self.ks, self.decodings, self.prompts,
                                    self.max_new_tokens, self.seed, self.device, self.dtype, *policies)


@dataclass(frozen=True)
class Cell:
    """One run to make."""

    prompt: Prompt
    decoding: Decoding
    draft: DraftSpec
    k: int | None  # None for the baseline
    policy: PolicySpec = FIXED  # how each round's k is chosen from k; recorded as None for the baseline

    @property
    def k_policy(self) -> str | None:
        """The value of `runs.k_policy`."""
        return None if self.k is None else self.policy.text

    def key(self, seed: int) -> tuple:
        """The cell's values of `CELL_KEY`, in its order."""
        d = self.decoding
        values = {"prompt_id": self.prompt.id, "draft": self.draft.text, "k": self.k, "mode": d.mode,
                  "temperature": d.temperature, "top_p": d.top_p, "seed": seed, "k_policy": self.k_policy}
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
    """Baseline first, so each speculative run can be checked against it as soon as it finishes. A policy a draft
    cannot follow (`skipped`) is left out for that draft."""
    drafts = [parse_draft(d) for d in config.drafts]
    policies = [parse_policy(p) for p in config.policies]
    for prompt in interleaved(config.prompts):
        for decoding in config.decodings:
            yield Cell(prompt, decoding, PLAIN, None)
            for draft in drafts:
                for policy in policies:
                    if policy.applies_to(draft.kind):
                        yield from (Cell(prompt, decoding, draft, k, policy) for k in config.ks)


def skipped(config: SweepConfig) -> list[str]:
    """Why some draft × policy pairs are not in the plan, one line each."""
    policies = [parse_policy(p) for p in config.policies]
    return [policy.refusal(draft.text) for draft in map(parse_draft, config.drafts) for policy in policies
            if not policy.applies_to(draft.kind)]


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


def device_error(exc: BaseException) -> bool:
    """An error of the device itself: after it, later cells would fail too (a CUDA error leaves the context
    unusable) or measure a device in trouble."""
    return isinstance(exc, (torch.OutOfMemoryError, torch.AcceleratorError)) or (
        isinstance(exc, RuntimeError) and "CUDA error" in str(exc))


def make_record(cell: Cell, generation: Generation | None, error: str | None, *, started: str, pair: Pair,
                target_spec: str, sweep_id: str, seed: int, max_new_tokens: int,
                baseline: tuple[str, tuple[int, ...]] | None, provenance: dict[str, str]) -> RunRecord:
    """One row of `runs`: a cell's generation (or its error), checked against its baseline's (run_id, output).
    Greedy only: the output must equal plain greedy decoding's token for token, and where it does not, the first
    difference is classified as a numeric tie or a real divergence (`lossless.classify`)."""
    d, target = cell.decoding, pair.target
    checked = generation is not None and d.greedy and baseline is not None
    divergence = lossless.classify(target, generation.prompt_tokens, baseline[1], generation.output_tokens) \
        if checked else None
    return RunRecord(
        run_id=uuid.uuid4().hex[:16], sweep_id=sweep_id, started_at=started, target=target_spec,
        draft=cell.draft.text, draft_kind=cell.draft.kind, category=cell.prompt.category, prompt_id=cell.prompt.id,
        prompt_text=cell.prompt.text, k=cell.k, mode=d.mode, temperature=d.temperature, top_p=d.top_p, seed=seed,
        max_new_tokens=max_new_tokens, device=str(target.device), dtype=lossless.dtype_name(target.dtype),
        k_policy=cell.k_policy,
        status="error" if error else "ok", error=error, generation=generation,
        output_text=None if generation is None else target.tokenizer.decode(list(generation.output_tokens)),
        baseline_run_id=None if baseline is None else baseline[0], lossless=divergence is None if checked else None,
        provenance=provenance, divergence_at=divergence and divergence.at,
        divergence_gap=divergence and divergence.gap, divergence_tolerance=divergence and divergence.tolerance,
        divergence=divergence and divergence.kind, kernels=pair.kernels, threads=torch.get_num_threads(),
    )


class Recorder:
    """Runs cells on a loaded pair and writes each as one run (one transaction with its rounds)."""

    def __init__(self, config: SweepConfig, sweep_id: str, pair: Pair) -> None:
        self.config, self.sweep_id, self.pair = config, sweep_id, pair
        self.provenance = provenance(pair.target.device)
        self.divergences: list[tuple[str, Divergence]] = []  # greedy runs that differ from their baseline
        self.errors: list[str] = []
        self.device_error: str | None = None  # set when a device error stopped the sweep
        self.ids: dict[str, list[int]] = {}  # prompt id -> its token ids, encoded once per sweep
        # (prompt id, decoding, prompt ids) -> the baseline's (run_id, output tokens), kept from this process's runs
        # so a speculative cell need not read them back; a resumed sweep finds earlier ones in the database.
        self.baselines: dict[tuple, tuple[str, tuple[int, ...]]] = {}

    @property
    def lossless_failures(self) -> list[str]:
        """The greedy runs that differ from their baseline, as labels, whatever the class."""
        return [label for label, _ in self.divergences]

    def prompt_ids(self, cell: Cell) -> list[int]:
        if cell.prompt.id not in self.ids:
            self.ids[cell.prompt.id] = models.encode_chat(self.pair.target, cell.prompt.text)
        return self.ids[cell.prompt.id]

    def baseline(self, cell: Cell) -> tuple[str, tuple[int, ...]] | None:
        """The plain run this cell is checked and timed against: same prompt ids, device and dtype, so a
        resumed sweep never compares with a baseline of other prompt tokens (a chat template that stamps the
        date) or of another device or dtype."""
        d, ids, target = cell.decoding, self.prompt_ids(cell), self.pair.target
        key = (cell.prompt.id, d.mode, d.temperature, d.top_p, tuple(ids))
        return self.baselines.get(key) or baseline_for(
            self.config.db, self.sweep_id, cell.prompt.id, d.mode, d.temperature, d.top_p, self.config.seed,
            ids, str(target.device), lossless.dtype_name(target.dtype))

    def _run(self, cell: Cell) -> tuple[Generation | None, str | None]:
        try:
            return self.pair.run(cell.draft, self.prompt_ids(cell), cell.k, cell.decoding, self.config.max_new_tokens,
                                 self.config.seed, cell.policy), None
        except Exception as exc:  # noqa: BLE001 - a failing cell is recorded; the sweep goes on unless the device failed
            first_line = str(exc).splitlines()[0] if str(exc) else ""
            error = f"{type(exc).__name__}: {first_line}"
            self.errors.append(f"{self.label(cell)}: {error}")
            if device_error(exc):
                self.device_error = error
            return None, error

    @staticmethod
    def label(cell: Cell) -> str:
        policy = "" if cell.policy == FIXED else f" {cell.policy.text}"
        return f"{cell.prompt.id} {cell.draft.text} k={cell.k}{policy} {cell.decoding.mode}"

    def record(self, cell: Cell) -> None:
        cfg, d = self.config, cell.decoding
        baseline = None if cell.k is None else self.baseline(cell)
        started = datetime.now(UTC).isoformat()
        generation, error = self._run(cell)
        record = make_record(cell, generation, error, started=started, pair=self.pair,
                             target_spec=cfg.target, sweep_id=self.sweep_id, seed=cfg.seed,
                             max_new_tokens=cfg.max_new_tokens, baseline=baseline, provenance=self.provenance)
        if record.mismatch is not None:
            self.divergences.append((self.label(cell), record.mismatch))
        write_run(cfg.db, record)
        if cell.k is None and generation is not None:
            key = (cell.prompt.id, d.mode, d.temperature, d.top_p, generation.prompt_tokens)
            self.baselines[key] = (record.run_id, generation.output_tokens)


def run_sweep(config: SweepConfig, console: Console) -> tuple[str, Recorder]:
    """Load once, warm up, then record every cell not yet recorded; a device error stops the sweep (what was
    recorded stays). Returns the sweep id and its recorder."""
    sweep_id = config.sweep_id or new_sweep_id()
    check_db(config.db)  # fail on a bad --db before loading any model, creating nothing
    done = recorded_runs(config.db, sweep_id) if config.sweep_id else set()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    target = models.load(config.target, config.device, config.dtype, config.trust_remote_code)
    drafts = [parse_draft(d) for d in config.drafts]
    pair = Pair(target, drafts, config.kernels)
    recorder = Recorder(config, sweep_id, pair)
    for cell in plan(config):
        if len(recorder.prompt_ids(cell)) + config.max_new_tokens > target.max_context:
            raise ValueError(f'prompt "{cell.prompt.id}" + max-new-tokens exceeds the model\'s context of '
                             f"{target.max_context}")
    # A recorded baseline counts only if it matches this run's prompt ids, device and dtype; else it is re-run.
    cells = [c for c in plan(config) if c.key(config.seed) not in done or c.k is None and not recorder.baseline(c)]
    warm = models.encode_chat(target, config.prompts[0].text)
    # A heuristic policy can reach its cap: that verify width is warmed up too.
    caps = {p.cap for p in map(parse_policy, config.policies) if p.cap}
    for d in config.decodings:
        pair.warm_up([PLAIN, *drafts], warm, tuple(sorted({*config.ks, *caps})), d, config.max_new_tokens)
    plan_id, planned = config.plan_id(), sum(1 for _ in plan(config))

    def stand(recorded: int, state: str) -> None:  # beside the file, for the dashboard and `--resume last`
        progress.write(config.db, sweep_id, plan_id, planned - len(cells) + recorded, planned, state)

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    recorded = 0
    with Progress(*columns, console=console, disable=not console.is_terminal) as bar:
        task = bar.add_task(f"sweep {sweep_id}", total=len(cells))
        stand(0, progress.RECORDING)
        try:
            for cell in cells:
                bar.update(task, description=Recorder.label(cell))
                recorder.record(cell)
                recorded += 1
                bar.advance(task)
                stand(recorded, progress.RECORDING)
                if recorder.device_error:
                    break
        except BaseException:  # Ctrl-C: what was recorded stays, and `--resume last` finishes the rest
            stand(recorded, progress.INTERRUPTED)
            raise
    flush_pending(config.db)
    stand(recorded, progress.INTERRUPTED if recorder.device_error else progress.DONE)
    return sweep_id, recorder
