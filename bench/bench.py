"""`make bench`: our decode loop against transformers' `generate` on one target, side by side.

For every prompt, the two engines alternate (which goes first flips each time) after a warm-up:
(a) plain decoding: our tokens/s over `generate(do_sample=False)`'s;
(b) speculative decoding: ours over transformers' assisted generation with the same draft and k
    (prompt lookup: `prompt_lookup_num_tokens`; a layer-skip draft: `assistant_model`, constant k);
(c) overhead: the share of a speculative run's wall time spent outside the forward passes of the target
    and the draft, and the share that recording its rounds (write_run) adds;
(d) our measured speedup over our plain decoding next to the formula's, at the run's own α and c.
And the verify curve: one target pass over k+1 tokens at a ~200-token context, k = 0..8.

Every value is the median over repeats with its min–max; each printed row is also a row of
`bench_results` in the database. Run from the repository root: `python bench/bench.py --help`.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `python bench/bench.py` puts bench/, not the repository, on the path

import torch  # noqa: E402
from torch import nn  # noqa: E402
from transformers import DynamicCache  # noqa: E402

from runner.engine import models  # noqa: E402
from runner.engine.decode import Clock  # noqa: E402
from runner.engine.drafters import crop_to  # noqa: E402
from runner.engine.pair import BASELINE, DraftSpec, Pair, parse_draft  # noqa: E402
from runner.engine.sampling import Decoding  # noqa: E402
from runner.records import Generation, RunRecord  # noqa: E402
from runner.stats import theoretical_speedup  # noqa: E402
from runner.store.bench_rows import (  # noqa: E402
    ABOUT,
    GOALS,
    UNITS,
    write_bench,  # noqa: E402
)
from runner.store.connect import init_db  # noqa: E402
from runner.store.runs import write_run  # noqa: E402
from runner.store.schema import StoreError  # noqa: E402
from runner.sweep.prompts import Prompt, PromptError, load_prompts, select_prompts  # noqa: E402
from runner.sweep.run import provenance  # noqa: E402

GREEDY = Decoding("greedy", 0.0, 1.0)
PLAIN = parse_draft(BASELINE)
VERIFY_KS = range(9)  # the verify curve: one target pass over k+1 tokens, k = 0..8
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
    threads: int | None  # CPU threads for torch; None: torch's default (one per core)
    command: str  # as typed, for the record


@dataclass(frozen=True)
class Cell:
    """One configuration both engines run: plain decoding (PLAIN, k=0) or a draft at k."""

    draft: DraftSpec
    k: int


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
    record_s: float | None = None  # ours only: building and writing its RunRecord


@dataclass(frozen=True)
class Row:
    """One printed line of the table and one row of `bench_results`: medians with min–max over repeats."""

    metric: str
    draft: str
    k: int
    category: str
    ours: list[float]  # one value per repeat
    theirs: list[float] | None = None  # one value per repeat, the same repeat as `ours`; None: no counterpart
    mismatches: int | None = None  # outputs that differ from the engine's own plain greedy output
    alpha: float | None = None
    c: float | None = None
    ratios: list[float] | None = field(init=False)

    def __post_init__(self) -> None:
        ratios = None if self.theirs is None else [o / t for o, t in zip(self.ours, self.theirs, strict=True)]
        object.__setattr__(self, "ratios", ratios)

    def goal(self) -> tuple[str | None, bool | None]:
        if self.metric not in GOALS:
            return None, None
        value, op, bound = GOALS[self.metric]
        median = statistics.median(self.ratios if value == "ratio" else self.ours)
        return f"{value} {op} {bound:g}", median >= bound if op == ">=" else median <= bound


class ForwardTimer:
    """Time inside each wrapped model's forward, set on the instances only: runner code is untouched.

    CPU: perf_counter around the call. CUDA: events around it, read once per sample, so the timer adds
    no synchronisation of its own. Wrapping costs ~1 µs a call, against milliseconds of forward.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.spans: dict[str, list] = {}

    def _mark(self) -> float | torch.cuda.Event:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def wrap(self, label: str, model: nn.Module) -> None:
        inner = model.forward
        spans = self.spans.setdefault(label, [])

        @functools.wraps(inner)  # transformers reads forward's signature (logits_to_keep support)
        def timed(*args, **kwargs):
            start = self._mark()
            out = inner(*args, **kwargs)
            spans.append((start, self._mark()))
            return out

        model.forward = timed

    def take(self) -> dict[str, tuple[float, int]]:
        """(seconds, calls) per label since the last take."""
        if self.cuda:
            torch.cuda.synchronize()
        inside = {label: (sum(self._span(s, e) for s, e in spans), len(spans)) for label, spans in self.spans.items()}
        for spans in self.spans.values():
            spans.clear()
        return inside

    def _span(self, start, end) -> float:
        return start.elapsed_time(end) / 1000 if self.cuda else end - start


class Engines:
    """The target, its drafts and both engines, loaded once; `run` makes one timed sample."""

    def __init__(self, config: BenchConfig, target: models.Loaded) -> None:
        self.config, self.target = config, target
        self.clock = Clock(target.device)
        specs = [parse_draft(d) for d in config.drafts]
        self.pair = Pair(target, specs)
        self.timer = ForwardTimer(target.device)
        self.timer.wrap("target", target.model)
        for spec, draft in self.pair.draft_models.items():
            self.timer.wrap(spec, draft)
        self.record_dir = tempfile.TemporaryDirectory(prefix="specdash-bench-")
        self.record_db = Path(self.record_dir.name) / "record.duckdb"
        init_db(self.record_db)  # created and migrated now: the first timed write pays no more than the rest
        self.provenance = provenance(target.device)

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
        record_s = None if generation is None else self._record(cell, prompt, generation)
        (target_s, target_calls), (draft_s, draft_calls) = inside["target"], inside.get(cell.draft.text, (0.0, 0))
        return Sample(cell, engine, repeat, prompt, tokens, wall, target_s, draft_s, target_calls, draft_calls,
                      generation, record_s)

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

    def _record(self, cell: Cell, prompt: Prompt, generation: Generation) -> float:
        """The sweep's per-run recording: build the RunRecord (decode the text) and write it with its rounds."""
        start = time.perf_counter()
        target = self.target
        write_run(self.record_db, RunRecord(
            run_id=uuid.uuid4().hex[:16], sweep_id="bench", started_at=datetime.now(UTC).isoformat(),
            target=self.config.target, draft=cell.draft.text, draft_kind=cell.draft.kind,
            category=prompt.category, prompt_id=prompt.id, prompt_text=prompt.text,
            k=cell.k or None, mode="greedy", temperature=0.0, top_p=1.0, seed=0,
            max_new_tokens=self.config.max_new_tokens, device=str(target.device), dtype=_dtype(target),
            status="ok", error=None, generation=generation,
            output_text=target.tokenizer.decode(list(generation.output_tokens)), baseline_run_id=None,
            lossless=None, provenance=self.provenance))
        return time.perf_counter() - start


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


def verify_curve(target: models.Loaded, context: int, repeats: int) -> dict[int, list[float]]:
    """Milliseconds of ONE target pass over k+1 tokens after `context` cached tokens, per repeat, for each k."""
    suite = [t for p in load_prompts() for t in models.encode_chat(target, p.text)]
    ids = torch.tensor((suite * (1 + (context + len(VERIFY_KS)) // len(suite)))[: context + len(VERIFY_KS)],
                       device=target.device)
    clock, cache = Clock(target.device), DynamicCache(config=target.model.config)
    times: dict[int, list[float]] = {k: [] for k in VERIFY_KS}
    with torch.inference_mode():
        target.model(input_ids=ids[None, :context], cache=cache, use_cache=True, logits_to_keep=1)
        for repeat in range(repeats + 1):  # the first round warms every shape up and is not kept
            for k in VERIFY_KS if repeat % 2 else reversed(VERIFY_KS):
                start = clock()
                target.model(input_ids=ids[None, context: context + k + 1], cache=cache, use_cache=True,
                             logits_to_keep=k + 1)
                if repeat:
                    times[k].append((clock() - start) * 1000)
                crop_to(cache, context)
    return times


def _categories(samples: list[Sample]) -> list[str]:
    return ["all", *dict.fromkeys(s.prompt.category for s in samples)]


def _per_repeat(samples: list[Sample], cell: Cell, engine: str, category: str) -> Iterator[list[Sample]]:
    """The samples of one cell and engine, grouped by repeat, limited to a category ('all': every prompt)."""
    chosen = [s for s in samples if s.cell == cell and s.engine == engine
              and category in ("all", s.prompt.category)]
    for repeat in sorted({s.repeat for s in chosen}):
        yield [s for s in chosen if s.repeat == repeat]


def _tokens_per_s(group: list[Sample]) -> float:
    return sum(len(s.tokens) for s in group) / sum(s.wall_s for s in group)


def _mismatches(samples: list[Sample], cell: Cell, category: str, reference: dict) -> int:
    """Samples whose output differs from their engine's plain greedy output (ours for the plain cell)."""
    return sum(s.tokens != reference[("ours" if cell == Cell(PLAIN, 0) else s.engine, s.prompt.id)]
               for s in samples if s.cell == cell and category in ("all", s.prompt.category))


def throughput_rows(samples: list[Sample], cells: list[Cell], reference: dict) -> list[Row]:
    rows = []
    for cell in cells:
        metric = "plain_tokens_per_s" if cell.draft.kind == "baseline" else "spec_tokens_per_s"
        for category in _categories(samples):
            ours = [_tokens_per_s(g) for g in _per_repeat(samples, cell, "ours", category)]
            theirs = [_tokens_per_s(g) for g in _per_repeat(samples, cell, "theirs", category)]
            rows.append(Row(metric, cell.draft.text, cell.k, category, ours, theirs,
                            _mismatches(samples, cell, category, reference)))
    return rows


def pass_rows(samples: list[Sample], cells: list[Cell]) -> list[Row]:
    """Forward passes per run: where the engines differ in work rather than in speed."""
    rows = []
    for cell in cells:
        for metric, calls in (("target_passes", lambda s: s.target_calls), ("draft_passes", lambda s: s.draft_calls)):
            if metric == "draft_passes" and cell.draft.kind in ("baseline", "ngram"):
                continue
            ours, theirs = ([sum(map(calls, g)) / len(g) for g in _per_repeat(samples, cell, engine, "all")]
                            for engine in ("ours", "theirs"))
            rows.append(Row(metric, cell.draft.text, cell.k, "all", ours, theirs))
    return sorted(rows, key=lambda r: list(UNITS).index(r.metric))


def overhead_rows(samples: list[Sample], cells: list[Cell]) -> list[Row]:
    def outside(group: list[Sample]) -> float:
        return 1 - sum(s.target_s + s.draft_s for s in group) / sum(s.wall_s for s in group)

    def loop(group: list[Sample]) -> float:
        gens = [s.generation for s in group]
        return 1 - sum(g.prefill_s + g.draft_s + g.verify_s for g in gens) / sum(g.wall_s for g in gens)

    def recording(group: list[Sample]) -> float:
        return sum(s.record_s for s in group) / sum(s.wall_s for s in group)

    rows = []
    for cell in cells:
        ours = list(_per_repeat(samples, cell, "ours", "all"))
        theirs = [outside(g) for g in _per_repeat(samples, cell, "theirs", "all")]
        rows += [Row("overhead_share", cell.draft.text, cell.k, "all", [outside(g) for g in ours], theirs),
                 Row("loop_overhead_share", cell.draft.text, cell.k, "all", [loop(g) for g in ours]),
                 Row("record_share", cell.draft.text, cell.k, "all", [recording(g) for g in ours]),
                 Row("record_ms", cell.draft.text, cell.k, "all",
                     [1000 * sum(s.record_s for s in g) / len(g) for g in ours])]
    return sorted(rows, key=lambda r: list(UNITS).index(r.metric))


def speedup_rows(samples: list[Sample], cells: list[Cell]) -> list[Row]:
    """Measured speedup over our own plain decoding, and the formula's at the pooled α and c of the same runs."""
    rows = []
    for cell in cells:
        for category in _categories(samples):
            plain = list(_per_repeat(samples, Cell(PLAIN, 0), "ours", category))
            spec = list(_per_repeat(samples, cell, "ours", category))
            rounds = [r for s in spec[0] for r in s.generation.rounds]  # greedy: α is the same every repeat
            accepted, rejected = sum(r.accepted for r in rounds), sum(r.rejected for r in rounds)
            alpha = accepted / (accepted + rejected) if accepted + rejected else 0.0
            measured, predicted, cs = [], [], []
            for base, run in zip(plain, spec, strict=True):
                target_pass = sum(s.generation.verify_s for s in base) / sum(len(s.generation.rounds) for s in base)
                drafted = sum(r.k for s in run for r in s.generation.rounds)
                c = sum(s.generation.draft_s for s in run) / max(drafted, 1) / target_pass
                cs.append(c)
                measured.append(_tokens_per_s(run) / _tokens_per_s(base))
                predicted.append(theoretical_speedup(alpha, cell.k, c))
            rows.append(Row("speedup", cell.draft.text, cell.k, category, measured, predicted,
                            alpha=alpha, c=statistics.median(cs)))
    return rows


def verify_rows(times: dict[int, list[float]]) -> list[Row]:
    return [Row("verify_ms", "none", k, "all", times[k], times[0]) for k in VERIFY_KS]


def _stats(values: list[float] | None) -> tuple[float | None, float | None, float | None]:
    return (None, None, None) if values is None else (statistics.median(values), min(values), max(values))


def db_rows(rows: list[Row], context: dict) -> list[dict]:
    """The `bench_results` rows: the context columns, then each row's medians and min–max."""
    out = []
    for row in rows:
        goal, met = row.goal()
        values = {"draft": row.draft, "k": row.k, "category": row.category, "metric": row.metric,
                  "unit": UNITS[row.metric], "repeats": len(row.ours), "mismatches": row.mismatches,
                  "alpha": row.alpha, "c": row.c, "goal": goal, "goal_met": met}
        for name, series in (("ours", row.ours), ("theirs", row.theirs), ("ratio", row.ratios)):
            values |= dict(zip((name, f"{name}_min", f"{name}_max"), _stats(series), strict=True))
        out.append(context | values)
    return out


def _fmt(record: dict, name: str, unit: str) -> str:
    median, low, high = record[name], record[f"{name}_min"], record[f"{name}_max"]
    if median is None:
        return "—"
    pattern = {"share": "{:.2%}", "ms": "{:.1f}", "passes": "{:.1f}"}.get(unit, "{:.2f}")
    text = pattern.format(median)
    return text if record["repeats"] == 1 else f"{text} ({pattern.format(low)}–{pattern.format(high)})"


HEADER = "| metric | draft | k | category | ours | theirs | ours/theirs | α | c | goal | mismatches |"


def format_line(record: dict) -> str:
    """One table line from one `bench_results` row: what is printed is what is stored."""
    unit = record["unit"]
    alpha, c = ("" if record[n] is None else f"{record[n]:.3f}" for n in ("alpha", "c"))
    goal = "" if record["goal"] is None else f"{record['goal']}: {'met' if record['goal_met'] else 'NOT met'}"
    mismatches = "" if record["mismatches"] is None else record["mismatches"]
    return (f"| {record['metric']} | {record['draft']} | {record['k']} | {record['category']} | "
            f"{_fmt(record, 'ours', unit)} | {_fmt(record, 'theirs', unit)} | {_fmt(record, 'ratio', 'x')} | "
            f"{alpha} | {c} | {goal} | {mismatches} |")


def table(records: list[dict]) -> str:
    """A Markdown table per metric, under the line that says what it compares."""
    parts = []
    for metric in UNITS:
        chosen = [r for r in records if r["metric"] == metric]
        if chosen:
            parts += [f"{ABOUT[metric]} [{UNITS[metric]}]", "", HEADER, "|" + "---|" * 11,
                      *map(format_line, chosen), ""]
    return "\n".join(parts)


def _dtype(target: models.Loaded) -> str:
    return str(target.dtype).removeprefix("torch.")


def mismatch_lines(samples: list[Sample], reference: dict) -> list[str]:
    lines = []
    for s in samples:
        ref = reference[("ours" if s.cell.draft.kind == "baseline" else s.engine, s.prompt.id)]
        if s.tokens != ref:
            pairs = zip(s.tokens, ref, strict=False)
            at = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(s.tokens), len(ref)))
            lines.append(f"{s.engine} {s.cell.draft.text} k={s.cell.k} {s.prompt.id} repeat {s.repeat}: "
                         f"differs from greedy at new token {at} ({len(s.tokens)} vs {len(ref)} tokens)")
    return lines


@dataclass(frozen=True)
class Outcome:
    """What one bench produced: the rows as printed and stored, the text printed, where they went."""

    bench_id: str
    rows: list[Row]
    records: list[dict]  # the rows as written to `bench_results`
    text: str
    mismatches: list[str]


def run_bench(config: BenchConfig, progress: Callable[[str], None]) -> Outcome:
    load_before = os.getloadavg()[0]
    started = datetime.now(UTC)
    init_db(config.db)  # a bad --db fails before the model loads
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    target = models.load(config.target, config.device, config.dtype)
    engines = Engines(config, target)
    cells = [Cell(PLAIN, 0)] + [Cell(parse_draft(d), k) for d in config.drafts for k in config.ks]
    prompts = {p: models.encode_chat(target, p.text) for p in config.prompts}
    progress("warm-up")
    first = next(iter(prompts.values()))
    try:
        for cell in cells:
            for engine in ("ours", "theirs"):
                engines.run(engine, cell, config.prompts[0], first, config.warmup_tokens, -1)
        samples = measure(engines, cells, prompts, config.repeats, config.max_new_tokens, progress)
    finally:
        engines.record_dir.cleanup()
    progress("verify curve")
    curve = verify_curve(target, config.verify_context, config.verify_repeats)
    reference = {(s.engine, s.prompt.id): s.tokens for s in samples if s.cell == Cell(PLAIN, 0) and s.repeat == 0}
    spec_cells = cells[1:]
    rows = (throughput_rows(samples, cells, reference) + pass_rows(samples, cells) + overhead_rows(samples, spec_cells)
            + speedup_rows(samples, spec_cells) + verify_rows(curve))
    bench_id = started.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:4]
    prov = engines.provenance
    context = {"bench_id": bench_id, "started_at": started, "device": str(target.device),
               "device_name": prov.get("device_name") or _cpu_name(), "dtype": _dtype(target),
               "threads": torch.get_num_threads() if target.device.type == "cpu" else None, "target": config.target,
               "prompts": len(config.prompts), "max_new_tokens": config.max_new_tokens,
               "load_before": load_before, "load_after": os.getloadavg()[0], "command": config.command,
               **{k: prov.get(k) for k in ("torch_version", "transformers_version", "host", "git_commit")}}
    records = db_rows(rows, context)
    write_bench(config.db, records)
    return Outcome(bench_id, rows, records, table(records), mismatch_lines(samples, reference))


def markdown_report(config: BenchConfig, outcome: Outcome, seconds: float, loads: tuple) -> str:
    """The results file: command, machine, load, the table, mismatches, goals."""
    first = outcome.records[0]
    goals = [f"- {r['metric']} {r['draft']} k={r['k']}: {r['goal']}: {'met' if r['goal_met'] else 'NOT met'}"
             for r in outcome.records if r["goal"] and r["category"] == "all"]
    return "\n".join([
        f"# make bench: {config.target} on {first['device']} ({first['dtype']})", "",
        f"- command: `{config.command}`", f"- bench_id: {outcome.bench_id}; took {seconds:.0f} s",
        f"- machine: {_cpu_name()}, {os.cpu_count()} cores, {platform.platform()}, torch threads "
        f"{torch.get_num_threads()}, "
        f"torch {torch.__version__}, python {platform.python_version()}",
        f"- load average (1, 5, 15 min) before: {loads[0]}, after: {loads[1]}", "",
        outcome.text, "## Lossless", "",
        *(outcome.mismatches or ["every output equal to its engine's plain greedy output"]), "",
        "## Goals (medians, category all)", "", *goals, ""])


class UsageError(ValueError):
    """Bad command-line input: one line, exit code 2."""


def _cpu_name() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or "unknown CPU"
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown CPU")


def parse_args(argv: list[str]) -> tuple[BenchConfig, Path | None]:
    parser = argparse.ArgumentParser(prog="bench/bench.py", description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=models.DEFAULT_MODEL, help="model spec (default: %(default)s)")
    parser.add_argument("--drafts", default="ngram,layerskip:24", help="comma-separated (default: %(default)s)")
    parser.add_argument("--ks", default="2,4,8", help="comma-separated draft lengths (default: %(default)s)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--prompts-per-category", type=int, default=1)
    parser.add_argument("--verify-repeats", type=int, default=15)
    parser.add_argument("--verify-context", type=int, default=200)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's, one per core); 1 on a crowded machine")
    parser.add_argument("--db", type=Path, default=Path("runs.duckdb"))
    parser.add_argument("--report", type=Path, default=None, help="also write the results as Markdown here")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 1 prompt, k=2, 1 repeat, 8 new tokens, 3 verify repeats")
    args = parser.parse_args(argv)
    try:
        ks = tuple(int(k) for k in args.ks.split(","))
        drafts = tuple(parse_draft(d) for d in args.drafts.split(","))
    except ValueError as error:
        raise UsageError(f"--ks or --drafts: {error}") from None
    per_category, repeats, n, verify, warm = (args.prompts_per_category, args.repeats, args.max_new_tokens,
                                              args.verify_repeats, 8)
    if args.quick:
        ks, per_category, repeats, n, verify, warm = (2,), 1, 1, 8, 3, 2
    if min(ks) < 1 or repeats < 1 or n < 1 or verify < 1 or (args.threads is not None and args.threads < 1):
        raise UsageError("k, --repeats, --max-new-tokens, --verify-repeats and --threads must be >= 1")
    if any(d.kind == "baseline" for d in drafts):
        raise UsageError("--drafts: plain decoding is always measured; name drafts only")
    prompts = tuple(select_prompts(load_prompts(), None, per_category))
    if args.quick:
        prompts = prompts[:1]
    command = " ".join(["python bench/bench.py", *map(shlex.quote, argv)])
    return BenchConfig(
        target=args.target, drafts=tuple(d.text for d in drafts), ks=ks, prompts=prompts, max_new_tokens=n,
        repeats=repeats, verify_repeats=verify, verify_context=args.verify_context, warmup_tokens=warm, db=args.db,
        device=args.device, dtype=args.dtype, threads=args.threads, command=command,
    ), args.report


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    loads = [os.getloadavg()]
    start = time.perf_counter()
    try:
        config, report = parse_args(argv)
        models.pick_device(config.device)  # --device cuda without CUDA: one line, before anything loads
        outcome = run_bench(config, lambda text: print(f"bench: {text}", file=sys.stderr, flush=True))
    except (models.ModelError, PromptError, StoreError, UsageError) as error:
        print(f"bench: error: {error}", file=sys.stderr)
        return 2
    loads.append(os.getloadavg())
    print(outcome.text)
    print("\n".join(outcome.mismatches) or "lossless: every output equal to its engine's plain greedy output")
    print(f"recorded as bench {outcome.bench_id} in {config.db}")
    if report is not None:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(markdown_report(config, outcome, time.perf_counter() - start, tuple(loads)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
