"""The two engines `make bench` times side by side: ours (the runner's decode loop) and transformers'
`generate`, on one loaded target, with the time inside each model's forward."""

from __future__ import annotations

import functools
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch
from torch import nn

from runner.engine import models
from runner.engine.decode import Clock
from runner.engine.pair import PLAIN, DraftSpec, Pair, parse_draft
from runner.engine.sampling import Decoding
from runner.records import Generation, RunRecord
from runner.store.connect import init_db
from runner.store.runs import write_run
from runner.sweep.prompts import Prompt
from runner.sweep.run import Cell as SweepCell
from runner.sweep.run import make_record, provenance

GREEDY = Decoding("greedy", 0.0, 1.0)


@dataclass(frozen=True)
class BenchConfig:
    """What one bench measures; the command line only parses into this."""

    target: str  # model spec of the target
    drafts: tuple[str, ...]  # drafter specs, each at every k, against transformers' equivalent
    ks: tuple[int, ...]  # draft lengths
    prompts: tuple[Prompt, ...]  # the built-in suite's first prompts of each category
    max_new_tokens: int
    repeats: int  # each prompt × cell × engine runs this often; rows give medians over repeats
    verify_repeats: int  # timed passes per k for the verify curve
    verify_context: int  # committed tokens in the cache when the verify curve is timed
    warmup_tokens: int  # one short generation per engine and cell before anything is timed
    db: Path
    device: str | None  # None: cuda when present
    dtype: str | None  # None: bf16 on cuda, fp32 on cpu
    threads: int  # CPU threads for torch (the verify curve is also timed at 1)
    kernels: str  # our engine's linears on CPU: 'skinny' or 'stock'; transformers' generate always runs stock
    command: str  # as typed, for the record


@dataclass(frozen=True)
class Cell:
    """One configuration both engines run: plain decoding (PLAIN, k None) or a draft at k."""

    draft: DraftSpec
    k: int | None


PLAIN_CELL = Cell(PLAIN, None)


@dataclass(frozen=True)
class Sample:
    """One timed generation by one engine."""

    cell: Cell
    engine: str  # 'ours' | 'theirs'
    repeat: int
    prompt: Prompt
    tokens: tuple[int, ...]  # the new tokens
    wall_s: float  # around the whole call, on a synchronising clock
    target_s: float  # inside the target's forward (prefill included)
    draft_s: float  # inside the draft model's forward (0 for prompt lookup)
    target_calls: int  # the target's forward passes (prefill included)
    draft_calls: int  # the draft model's forward passes (0 for prompt lookup)
    generation: Generation | None = None  # ours only: its rounds
    record: RunRecord | None = None  # ours only: its row of `runs`, against the plain run of its prompt and repeat
    record_s: float | None = None  # ours only: building and writing that record




class ForwardTimer:
    """Time inside each wrapped model's forward, set on the instances only: runner code is untouched.

    The decode loop's Clock marks: perf_counter on a CPU; on CUDA, events on the current stream of the model's own
    device (not GPU 0's), read once per sample, so the timer adds no synchronisation of its own. Wrapping costs
    ~1 µs a call, against milliseconds of forward.
    """

    def __init__(self, device: torch.device) -> None:
        self.clock = Clock(device)
        self.spans: dict[str, list] = {}

    def wrap(self, label: str, model: nn.Module) -> None:
        inner = model.forward
        spans = self.spans.setdefault(label, [])

        @functools.wraps(inner)  # transformers reads forward's signature (logits_to_keep support)
        def timed(*args, **kwargs):
            start = self.clock.mark()
            out = inner(*args, **kwargs)
            spans.append((start, self.clock.mark()))
            return out

        model.forward = timed

    def take(self) -> dict[str, tuple[float, int]]:
        """(seconds, calls) per label since the last take."""
        self.clock.settle()
        inside = {label: (sum(self.clock.seconds(s, e) for s, e in spans), len(spans))
                  for label, spans in self.spans.items()}
        for spans in self.spans.values():
            spans.clear()
        return inside


class Engines:
    """The target, its drafts and both engines, loaded once; `run` makes one timed sample."""

    def __init__(self, config: BenchConfig, target: models.Loaded) -> None:
        self.config, self.target = config, target
        self.clock = Clock(target.device)
        specs = [parse_draft(d) for d in config.drafts]
        self.pair = Pair(target, specs, config.kernels)
        self.timer = ForwardTimer(target.device)
        self.timer.wrap("target", target.model)
        for spec, draft in self.pair.draft_models.items():
            self.timer.wrap(spec, draft)
        self.record_dir = tempfile.TemporaryDirectory(prefix="specdash-bench-")
        self.record_db = Path(self.record_dir.name) / "record.duckdb"
        init_db(self.record_db)  # created and migrated now: the first timed write pays no more than the rest
        self.provenance = provenance(target.device)
        self.plain: dict[tuple[str, int], tuple[str, tuple[int, ...]]] = {}  # (prompt, repeat) -> (run_id, tokens)

    def run(self, engine: str, cell: Cell, prompt: Prompt, ids: list[int], n: int, repeat: int) -> Sample:
        self.timer.take()
        start = self.clock()
        if engine == "ours":
            generation = self.pair.run(cell.draft, ids, cell.k, GREEDY, n, seed=0)
            tokens = generation.output_tokens
        else:
            generation, tokens = None, self._theirs(cell, ids, n)
        wall = self.clock() - start
        inside = self.timer.take()
        record, record_s = (None, None) if generation is None else self._record(cell, prompt, generation, repeat)
        (target_s, target_calls), (draft_s, draft_calls) = inside["target"], inside.get(cell.draft.text, (0.0, 0))
        return Sample(cell, engine, repeat, prompt, tokens, wall, target_s, draft_s, target_calls, draft_calls,
                      generation, record, record_s)

    def _theirs(self, cell: Cell, ids: list[int], n: int) -> tuple[int, ...]:
        """transformers' own greedy generate, assisted the way closest to our draft at this k."""
        device = self.target.device
        prompt = torch.tensor([ids], dtype=torch.long, device=device)
        kwargs: dict = {"attention_mask": torch.ones_like(prompt), "do_sample": False, "max_new_tokens": n}
        if cell.draft.kind == "ngram":
            # transformers' default is 2 (`max_matching_ngram_size or 2`); ours looks up DEFAULT_NGRAM.
            kwargs |= {"prompt_lookup_num_tokens": cell.k, "max_matching_ngram_size": int(cell.draft.arg)}
        elif cell.draft.kind != "baseline":
            assistant = self.pair.draft_models[cell.draft.text]
            # AssistedCandidateGenerator reads these from the ASSISTANT's generation_config (5.24), not from
            # generate's kwargs: exactly k drafts a round, and no confidence stop (0 leaves ConfidenceCriteria out).
            assistant.generation_config.num_assistant_tokens = cell.k
            assistant.generation_config.num_assistant_tokens_schedule = "constant"
            assistant.generation_config.assistant_confidence_threshold = 0.0
            kwargs["assistant_model"] = assistant
        out = self.target.model.generate(prompt, **kwargs)
        return tuple(out[0, len(ids):].tolist())

    def _record(self, cell: Cell, prompt: Prompt, generation: Generation, repeat: int) -> tuple[RunRecord, float]:
        """The sweep's per-run recording, timed: build the RunRecord (decode the text) and write it with its rounds.
        Each repeat is its own sweep, so the run_stats of a repeat's runs compare them with that repeat's plain run."""
        start, started = time.perf_counter(), datetime.now(UTC).isoformat()
        baseline = None if cell.k is None else self.plain[(prompt.id, repeat)]
        record = make_record(SweepCell(prompt, GREEDY, cell.draft, cell.k), generation, None, started=started,
                             pair=self.pair, target_spec=self.config.target, sweep_id=f"repeat-{repeat}", seed=0,
                             max_new_tokens=self.config.max_new_tokens, baseline=baseline, provenance=self.provenance)
        write_run(self.record_db, record)
        if cell.k is None:
            self.plain[(prompt.id, repeat)] = (record.run_id, generation.output_tokens)
        return record, time.perf_counter() - start


def measure(engines: Engines, cells: list[Cell], prompts: dict[Prompt, list[int]], repeats: int, n: int,
            progress: Callable[[str], None]) -> list[Sample]:
    """Every prompt × cell × repeat, both engines back to back; who goes first alternates."""
    samples = []
    for repeat in range(repeats):
        for i, (prompt, ids) in enumerate(prompts.items()):
            progress(f"repeat {repeat + 1}/{repeats}, prompt {prompt.id}")
            for j, cell in enumerate(cells):
                order = ("ours", "theirs") if (repeat + i + j) % 2 == 0 else ("theirs", "ours")
                samples += [engines.run(engine, cell, prompt, ids, n, repeat) for engine in order]
    return samples


def dtype_name(target: models.Loaded) -> str:
    return str(target.dtype).removeprefix("torch.")


