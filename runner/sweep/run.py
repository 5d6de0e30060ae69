"""A sweep: every prompt × mode × (baseline, then each draft × k), one recorded run per cell."""

from __future__ import annotations

import functools
import platform
import socket
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import torch
import transformers
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from runner.engine import lossless, models
from runner.engine.pair import PLAIN, DraftSpec, Pair, check_drafts, parse_draft
from runner.engine.policies import FIXED, PolicySpec, parse_policy, warm_ks
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
                for policy in (p for p in policies if p.applies_to(draft.kind)):
                    yield from (Cell(prompt, decoding, draft, k, policy) for k in config.ks)


def skipped(config: SweepConfig) -> list[str]:
    """Why some draft × policy pairs are not in the plan, one line each."""
    return [policy.refusal(draft.text) for draft in map(parse_draft, config.drafts)
            for policy in map(parse_policy, config.policies) if not policy.applies_to(draft.kind)]


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
    """One row of `runs`: a cell's generation (or its error), `judge`d against its baseline's (run_id, output)."""
    d, target = cell.decoding, pair.target
    record = RunRecord(
        run_id=uuid.uuid4().hex[:16], sweep_id=sweep_id, started_at=started, target=target_spec,
        draft=cell.draft.text, draft_kind=cell.draft.kind, category=cell.prompt.category, prompt_id=cell.prompt.id,
        prompt_text=cell.prompt.text, k=cell.k, mode=d.mode, temperature=d.temperature, top_p=d.top_p, seed=seed,
        max_new_tokens=max_new_tokens, device=str(target.device), dtype=lossless.dtype_name(target.dtype),
        k_policy=cell.k_policy, status="error" if error else "ok", error=error, generation=generation,
        output_text=None if generation is None else target.tokenizer.decode(list(generation.output_tokens)),
        baseline_run_id=None, lossless=None, provenance=provenance, kernels=pair.kernels,
        threads=torch.get_num_threads(),
    )
    return judge(record, baseline, functools.partial(lossless.classify, target))


Classify = Callable[[tuple[int, ...], tuple[int, ...], tuple[int, ...]], Divergence | None]


def judge(record: RunRecord, baseline: tuple[str, tuple[int, ...]] | None, classify: Classify) -> RunRecord:
    """The record linked to its baseline (run_id, output). Greedy only: the output must equal plain greedy
    decoding's token for token, and where it does not, `classify(prompt, baseline's, ours)` (a target pass:
    `lossless.classify`) says whether the first difference is a numeric tie or a real divergence."""
    gen = record.generation
    if baseline is None or gen is None:
        return record
    if record.mode != "greedy":
        return replace(record, baseline_run_id=baseline[0])
    divergence = None if gen.output_tokens == baseline[1] else classify(
        gen.prompt_tokens, baseline[1], gen.output_tokens)
    return replace(record, baseline_run_id=baseline[0], lossless=divergence is None,
                   divergence_at=divergence and divergence.at, divergence_gap=divergence and divergence.gap,
                   divergence_tolerance=divergence and divergence.tolerance,
                   divergence=divergence and divergence.kind)


def label(cell: Cell | RunRecord) -> str:
    """A cell or run as progress and reports name it."""
    policy = "" if cell.k_policy in (None, FIXED.text) else f" {cell.k_policy}"
    if isinstance(cell, RunRecord):
        return f"{cell.prompt_id} {cell.draft} k={cell.k}{policy} {cell.mode}"
    return f"{cell.prompt.id} {cell.draft.text} k={cell.k}{policy} {cell.decoding.mode}"


class CellRunner:
    """Runs cells on a loaded pair, each into a `RunRecord` not yet judged against its baseline (the `Recorder`
    does that): in the sweep's own process, or on a Ray actor."""

    def __init__(self, config: SweepConfig, sweep_id: str, pair: Pair) -> None:
        self.config, self.sweep_id, self.pair = config, sweep_id, pair
        self.provenance = provenance(pair.target.device)
        self.device_error: str | None = None  # set when a device error makes later cells pointless
        self.ids: dict[str, list[int]] = {}  # prompt id -> its token ids, encoded once per sweep

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        if prompt.id not in self.ids:
            self.ids[prompt.id] = models.encode_chat(self.pair.target, prompt.text)
        return self.ids[prompt.id]

    def run(self, cell: Cell) -> RunRecord:
        cfg, started = self.config, datetime.now(UTC).isoformat()
        try:
            generation, error = self.pair.run(cell.draft, self.prompt_ids(cell.prompt), cell.k, cell.decoding,
                                              cfg.max_new_tokens, cfg.seed, cell.policy), None
        except Exception as exc:  # noqa: BLE001 - a failing cell is recorded; the sweep goes on unless the device failed
            first_line = str(exc).splitlines()[0] if str(exc) else ""
            generation, error = None, f"{type(exc).__name__}: {first_line}"
            if device_error(exc):
                self.device_error = error
        return make_record(cell, generation, error, started=started, pair=self.pair, target_spec=cfg.target,
                           sweep_id=self.sweep_id, seed=cfg.seed, max_new_tokens=cfg.max_new_tokens, baseline=None,
                           provenance=self.provenance)

    def classify(self, prompt: tuple[int, ...], baseline: tuple[int, ...], ours: tuple[int, ...]) -> Divergence | None:
        return lossless.classify(self.pair.target, prompt, baseline, ours)


class Recorder:
    """Writes runs, each as one transaction with its rounds, after judging each against its baseline."""

    def __init__(self, config: SweepConfig, sweep_id: str) -> None:
        self.config, self.sweep_id = config, sweep_id
        self.divergences: list[tuple[str, Divergence]] = []  # greedy runs that differ from their baseline
        self.errors: list[str] = []
        self.device_error: str | None = None  # set when a device error stopped the sweep
        self.dtype: str | None = None  # of the runs written (one per sweep)
        # (prompt id, decoding, prompt ids) -> the baseline's (run_id, output tokens), kept from this process's runs
        # so a speculative run need not read them back; a resumed sweep finds earlier ones in the database.
        self.baselines: dict[tuple, tuple[str, tuple[int, ...]]] = {}

    @property
    def lossless_failures(self) -> list[str]:
        """The greedy runs that differ from their baseline, as labels, whatever the class."""
        return [name for name, _ in self.divergences]

    def baseline(self, prompt_id: str, d: Decoding, ids: tuple[int, ...], device: str,
                 dtype: str) -> tuple[str, tuple[int, ...]] | None:
        """The plain run a run is checked and timed against: same prompt ids, device and dtype, so a resumed sweep
        never compares with a baseline of other prompt tokens (a chat template that stamps the date) or of another
        device or dtype."""
        return self.baselines.get((prompt_id, d.mode, d.temperature, d.top_p, tuple(ids))) or baseline_for(
            self.config.db, self.sweep_id, prompt_id, d.mode, d.temperature, d.top_p, self.config.seed, list(ids),
            device, dtype)

    def write(self, record: RunRecord, classify: Classify) -> None:
        gen, d = record.generation, Decoding(record.mode, record.temperature, record.top_p)
        self.dtype = record.dtype
        if record.k is not None and gen is not None:
            baseline = self.baseline(record.prompt_id, d, gen.prompt_tokens, record.device, record.dtype)
            record = judge(record, baseline, classify)
        if record.mismatch is not None:
            self.divergences.append((label(record), record.mismatch))
        if record.status == "error":
            self.errors.append(f"{label(record)}: {record.error}")
        write_run(self.config.db, record)
        if record.k is None and gen is not None:
            key = (record.prompt_id, d.mode, d.temperature, d.top_p, gen.prompt_tokens)
            self.baselines[key] = (record.run_id, gen.output_tokens)


def cells_to_run(config: SweepConfig) -> tuple[str, list[Cell]]:
    """The sweep id, and the cells of the plan not yet recorded (all of them for a new sweep). Refuses a bad --db
    or a draft head that cannot fit the target before any model is loaded."""
    sweep_id = config.sweep_id or new_sweep_id()
    check_db(config.db)
    check_drafts(config.target, [parse_draft(d) for d in config.drafts], config.trust_remote_code)
    done = recorded_runs(config.db, sweep_id) if config.sweep_id else set()
    return sweep_id, [c for c in plan(config) if c.key(config.seed) not in done]


def load_pair(config: SweepConfig, sweep_id: str) -> CellRunner:
    """The target and every draft, loaded once and warmed up at every k; ValueError for a prompt that does not fit."""
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    target = models.load(config.target, config.device, config.dtype, config.trust_remote_code)
    drafts = [parse_draft(d) for d in config.drafts]
    runner = CellRunner(config, sweep_id, Pair(target, drafts, config.kernels))
    for prompt in config.prompts:
        if len(runner.prompt_ids(prompt)) + config.max_new_tokens > target.max_context:
            raise ValueError(f'prompt "{prompt.id}" + max-new-tokens exceeds the model\'s context of '
                             f"{target.max_context}")
    ks = warm_ks(config.ks, map(parse_policy, config.policies))
    for d in config.decodings:
        runner.pair.warm_up([PLAIN, *drafts], runner.prompt_ids(config.prompts[0]), ks, d, config.max_new_tokens)
    return runner


def standing(config: SweepConfig, sweep_id: str, to_record: int) -> Callable[[int, str], None]:
    """`stand(recorded, state)`: where the sweep stands, beside the file, for the dashboard and `--resume last`."""
    plan_id, planned = config.plan_id(), sum(1 for _ in plan(config))
    return lambda recorded, state: progress.write(config.db, sweep_id, plan_id, planned - to_record + recorded,
                                                  planned, state)


def run_sweep(config: SweepConfig, console: Console) -> tuple[str, Recorder]:
    """Load once, warm up, then record every cell not yet recorded; a device error stops the sweep (what was
    recorded stays). Returns the sweep id and its recorder."""
    sweep_id, todo = cells_to_run(config)
    runner, recorder = load_pair(config, sweep_id), Recorder(config, sweep_id)
    target = runner.pair.target
    device, dtype = str(target.device), lossless.dtype_name(target.dtype)
    # A recorded baseline counts only if it matches this run's prompt ids, device and dtype; else it is re-run.
    cells = [c for c in plan(config) if c in todo or c.k is None and not recorder.baseline(
        c.prompt.id, c.decoding, tuple(runner.prompt_ids(c.prompt)), device, dtype)]
    stand = standing(config, sweep_id, len(cells))
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    recorded = 0
    with Progress(*columns, console=console, disable=not console.is_terminal) as bar:
        task = bar.add_task(f"sweep {sweep_id}", total=len(cells))
        stand(0, progress.RECORDING)
        try:
            for cell in cells:
                bar.update(task, description=label(cell))
                recorder.write(runner.run(cell), runner.classify)
                recorded += 1
                bar.advance(task)
                stand(recorded, progress.RECORDING)
                if runner.device_error:
                    recorder.device_error = runner.device_error
                    break
        except BaseException:  # Ctrl-C: what was recorded stays, and `--resume last` finishes the rest
            stand(recorded, progress.INTERRUPTED)
            raise
    flush_pending(config.db)
    stand(recorded, progress.INTERRUPTED if recorder.device_error else progress.DONE)
    return sweep_id, recorder
