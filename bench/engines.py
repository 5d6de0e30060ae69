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

from runner.cells import Cell as SweepCell
from runner.cells import RunContext, judge, provenance
from runner.engine import models
from runner.engine.clock import Clock
from runner.engine.pair import PLAIN, DraftSpec, Pair, parse_draft
from runner.engine.policies import FIXED, PolicySpec
from runner.engine.sampling import Decoding
from runner.prompts import Prompt
from runner.records import Generation, RunRecord
from runner.store.connect import init_db
from runner.store.runs import write_run

GREEDY = Decoding("greedy", 0.0, 1.0)


@dataclass(frozen=True)
class BenchConfig:
    """What one bench measures; the command line only parses into this."""

    target: str  # model spec of the target
    drafts: tuple[str, ...]  # drafter specs, each at every k, against transformers' equivalent
    ks: tuple[int, ...]  # draft lengths
    policies: tuple[str, ...]  # draft-length policies other than fixed, each from policy_k, for every draft it fits
    policy_k: int  # the k those policies start from
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
    batch: int = 4  # sequences decoded together in the batched comparison (bench/batched.py)


@dataclass(frozen=True)
class Cell:
    """One configuration: plain decoding (PLAIN, k None) or a draft at k, drafting under a policy from k."""

    draft: DraftSpec
    k: int | None
    policy: PolicySpec = FIXED

    @property
    def engines(self) -> tuple[str, ...]:
        """Who runs it. At a fixed k: ours and transformers' equivalent ('theirs'). Under our heuristic, a model
        draft is also run by transformers' heuristic schedule from the same k ('theirs': as an assistant model;
        'theirs_exit': a layer-skip draft as transformers' early exit). Our other policies are set against that
        same run, and prompt lookup against transformers' best fixed k: it has no adaptive schedule there."""
        if self.policy == FIXED:
            return ("ours", "theirs")
        if self.policy.kind != "heuristic" or self.draft.kind not in ("layerskip", "model"):
            return ("ours",)
        return ("ours", "theirs", "theirs_exit") if self.draft.kind == "layerskip" else ("ours", "theirs")


PLAIN_CELL = Cell(PLAIN, None)


@dataclass(frozen=True)
class Sample:
    """One timed generation by one engine."""

    cell: Cell
    engine: str  # 'ours' | 'theirs' | 'theirs_exit' (Cell.engines)
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
    device (not GPU 0's), read once per sample, so the timer adds no synchronisation of its own. Wrapping adds
    a Python call to each forward, small beside the forward itself.
    """

    def __init__(self, device: torch.device) -> None:
        self.clock = Clock(device)
        self.spans: dict[str, list] = {}
        self.wrapped: list[nn.Module] = []

    def wrap(self, label: str, model: nn.Module) -> None:
        inner = model.forward
        spans = self.spans.setdefault(label, [])
        self.wrapped.append(model)

        @functools.wraps(inner)  # transformers reads forward's signature (logits_to_keep support)
        def timed(*args, **kwargs):
            start = self.clock.mark()
            out = inner(*args, **kwargs)
            spans.append((start, self.clock.mark()))
            return out

        model.forward = timed

    def unwrap(self) -> None:
        """The models' own forward back: a model the caller keeps (a copy of it, a layer-skip draft) must not run
        through this timer later."""
        for model in self.wrapped:
            del model.forward  # the instance attribute `wrap` set; the class's forward shows through again
        self.wrapped.clear()

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

    def close(self) -> None:
        """The models unwrapped and the recording's folder removed."""
        self.timer.unwrap()
        self.record_dir.cleanup()

    def run(self, engine: str, cell: Cell, prompt: Prompt, ids: list[int], n: int, repeat: int) -> Sample:
        self.timer.take()
        start = self.clock()
        if engine == "ours":
            generation = self.pair.run(cell.draft, ids, cell.k, GREEDY, n, seed=0, policy=cell.policy)
            tokens = generation.output_tokens
        else:
            generation, tokens = None, self._theirs(cell, ids, n, early_exit=engine == "theirs_exit")
        wall = self.clock() - start
        inside = self.timer.take()
        record, record_s = (None, None) if generation is None else self._record(cell, prompt, generation, repeat)
        (target_s, target_calls), (draft_s, draft_calls) = inside["target"], inside.get(cell.draft.text, (0.0, 0))
        return Sample(cell, engine, repeat, prompt, tokens, wall, target_s, draft_s, target_calls, draft_calls,
                      generation, record, record_s)

    def _theirs(self, cell: Cell, ids: list[int], n: int, early_exit: bool) -> tuple[int, ...]:
        """transformers' own greedy generate, assisted the way closest to our draft at this k and policy.

        What transformers 5.24 honours where (generation/candidate_generator.py, utils.py): the assistant's draft
        length, its schedule ('constant' or 'heuristic': +2 after a round whose drafts were all accepted, -1
        otherwise, never below 1) and its confidence stop are read from the ASSISTANT's own generation_config, not
        from generate's kwargs; for early exit the assistant is the target itself. 'heuristic' carries the last
        draft length over to the next call, so it is set to k before each call (as ours starts each generation
        at k). Prompt lookup (PromptLookupCandidateGenerator) keeps `prompt_lookup_num_tokens` fixed: no schedule."""
        device = self.target.device
        prompt = torch.tensor([ids], dtype=torch.long, device=device)
        kwargs: dict = {"attention_mask": torch.ones_like(prompt), "do_sample": False, "max_new_tokens": n}
        if cell.draft.kind == "ngram":
            # transformers' default is 2 (`max_matching_ngram_size or 2`); ours looks up DEFAULT_NGRAM.
            kwargs |= {"prompt_lookup_num_tokens": cell.k, "max_matching_ngram_size": int(cell.draft.arg)}
        elif cell.draft.kind != "baseline":
            assistant = self.target.model if early_exit else self.pair.draft_models[cell.draft.text]
            config = assistant.generation_config
            config.num_assistant_tokens = cell.k
            if cell.policy == FIXED:  # exactly k drafts a round: no confidence stop (0 leaves ConfidenceCriteria out)
                config.num_assistant_tokens_schedule, config.assistant_confidence_threshold = "constant", 0.0
            else:  # their heuristic as it comes: with their default confidence stop (0.4, held fixed without sklearn)
                config.num_assistant_tokens_schedule, config.assistant_confidence_threshold = "heuristic", None
            kwargs |= {"assistant_early_exit": int(cell.draft.arg)} if early_exit else {"assistant_model": assistant}
        out = self.target.model.generate(prompt, **kwargs)
        return tuple(out[0, len(ids):].tolist())

    def _record(self, cell: Cell, prompt: Prompt, generation: Generation, repeat: int) -> tuple[RunRecord, float]:
        """The sweep's per-run recording, timed: build the RunRecord (decode the text) and write it with its rounds.
        Each repeat is its own sweep, so the run_stats of a repeat's runs compare them with that repeat's plain run."""
        start, started = time.perf_counter(), datetime.now(UTC).isoformat()
        baseline = None if cell.k is None else self.plain[(prompt.id, repeat)]
        context = RunContext(self.pair, self.config.target, f"repeat-{repeat}", 0, self.config.max_new_tokens,
                             self.provenance)
        record = context.record(SweepCell(prompt, GREEDY, cell.draft, cell.k, cell.policy), generation, None, started)
        record = judge(record, baseline, context.classify)
        write_run(self.record_db, record)
        if cell.k is None:
            self.plain[(prompt.id, repeat)] = (record.run_id, generation.output_tokens)
        return record, time.perf_counter() - start


def measure(engines: Engines, cells: list[Cell], prompts: dict[Prompt, list[int]], repeats: int, n: int,
            progress: Callable[[str], None]) -> list[Sample]:
    """Every prompt × cell × repeat, the cell's engines back to back; which goes first rotates."""
    samples = []
    for repeat in range(repeats):
        for i, (prompt, ids) in enumerate(prompts.items()):
            progress(f"repeat {repeat + 1}/{repeats}, prompt {prompt.id}")
            for j, cell in enumerate(cells):
                turn = (repeat + i + j) % len(cell.engines)
                order = cell.engines[turn:] + cell.engines[:turn]
                samples += [engines.run(engine, cell, prompt, ids, n, repeat) for engine in order]
    return samples


def dtype_name(target: models.Loaded) -> str:
    return str(target.dtype).removeprefix("torch.")


