"""The bench's rows: medians with min–max over repeats, one per printed line and per `bench_results` row."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field

import pandas as pd

from bench.passes import CHAIN, Curves
from bench.side_by_side import PLAIN_CELL, Cell, Sample
from runner.engine.round.policies import FIXED
from runner.engine.weights.kernels import SKINNY, STOCK
from runner.store import metrics
from runner.store.bench_rows import UNITS, goal_for
from runner.store.runs import in_scratch


@dataclass(frozen=True)
class Row:
    """One printed line of the table and one row of `bench_results`: medians with min–max over repeats."""

    metric: str
    draft: str
    k: int | None  # None for plain decoding
    category: str
    ours: list[float]  # one value per repeat
    theirs: list[float] | None = None  # one value per repeat, the same repeat as `ours`; None: no counterpart
    mismatches: int | None = None  # outputs that differ from the engine's own plain greedy output
    alpha: float | None = None
    c: float | None = None
    threads: int | None = None  # the row's own CPU thread count, where it is not the bench's
    judged: bool = True  # False: shown for comparison, not held to the metric's goal
    k_policy: str = "fixed"  # how ours chose each round's k from k (engine/round/policies.py); 'best: …' see below
    ratios: list[float] | None = field(init=False)

    def __post_init__(self) -> None:
        ratios = None if self.theirs is None else [o / t for o, t in zip(self.ours, self.theirs, strict=True)]
        object.__setattr__(self, "ratios", ratios)

    def goal(self) -> tuple[str | None, bool | None]:
        goal = goal_for(self.metric, self.draft, self.k, self.category, self.judged)
        if goal is None:
            return None, None
        median = statistics.median(self.ratios if goal.value == "ratio" else self.ours)
        return goal.text, median >= goal.bound if goal.op == ">=" else median <= goal.bound



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


def reference_of(sample: Sample) -> tuple[str, str]:
    """The key of the plain greedy output a sample must equal: its engine's (ours, for the plain cell itself)."""
    engine = "ours" if sample.cell == PLAIN_CELL or sample.engine == "ours" else "theirs"
    return engine, sample.prompt.id


def _mismatches(samples: list[Sample], cell: Cell, category: str, reference: dict) -> int:
    """Samples whose output differs from their engine's plain greedy output (ours for the plain cell)."""
    return sum(s.tokens != reference[reference_of(s)]
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


def adaptive_rows(samples: list[Sample], cells: list[Cell], reference: dict) -> list[Row]:
    """(e) tokens/s of each of our policies against transformers' adaptive counterpart on the same prompts and
    repeats (`Cell.engines`): its heuristic schedule from the same k, as an assistant model
    (`adaptive_tokens_per_s`) and, for a layer-skip draft, as early exit (`early_exit_tokens_per_s`); for prompt
    lookup, transformers' best fixed k of the bench in that category. Then per draft and category a row
    `best: <policy>`: our policy with the highest median, the one the goal judges."""
    rows = []
    for cell in [c for c in cells if c.policy != FIXED]:
        for category in _categories(samples):
            ours = [_tokens_per_s(g) for g in _per_repeat(samples, cell, "ours", category)]
            for metric, theirs in _counterparts(samples, cells, cell, category):
                rows.append(Row(metric, cell.draft.text, cell.k, category, ours, theirs,
                                _mismatches(samples, cell, category, reference), judged=False,
                                k_policy=cell.policy.text))
    best = []
    for key in dict.fromkeys((r.metric, r.draft, r.k, r.category) for r in rows):
        rivals = [r for r in rows if (r.metric, r.draft, r.k, r.category) == key]
        top = max(rivals, key=lambda r: statistics.median(r.ours))
        best.append(Row(*key, top.ours, top.theirs, top.mismatches, k_policy=f"best: {top.k_policy}"))
    return sorted(rows + best, key=lambda r: list(UNITS).index(r.metric))


def _counterparts(samples: list[Sample], cells: list[Cell], cell: Cell, category: str) -> list[tuple[str, list]]:
    """(metric, transformers' tokens/s per repeat) for each counterpart of an adaptive cell that was run."""
    if cell.draft.kind == "ngram":
        fixed = [[_tokens_per_s(g) for g in _per_repeat(samples, c, "theirs", category)]
                 for c in cells if c.draft == cell.draft and c.policy == FIXED]
        return [("adaptive_tokens_per_s", max(fixed, key=statistics.median))] if fixed else []
    heuristic = next((c for c in cells if (c.draft, c.k) == (cell.draft, cell.k) and c.policy.kind == "heuristic"),
                     None)
    if heuristic is None:
        return []
    metrics = (("adaptive_tokens_per_s", "theirs"), ("early_exit_tokens_per_s", "theirs_exit"))
    return [(metric, [_tokens_per_s(g) for g in _per_repeat(samples, heuristic, engine, category)])
            for metric, engine in metrics if engine in heuristic.engines]


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
    """Per repeat, as a sweep reports a cell (`metrics.cells_sql` over the runs' own run_stats): the geometric mean
    of the measured speedups over our plain decoding, and of the formula's at each run's α and c; pooled α, mean c."""
    records = [s.record for s in samples if s.record is not None and s.repeat >= 0
               and s.cell in (PLAIN_CELL, *cells)]
    by_category, overall = in_scratch(records, lambda con: (
        metrics.cells(con, metrics.Filters(), ("draft", "k", "category", "sweep_id")),
        metrics.cells(con, metrics.Filters(), ("draft", "k", "sweep_id")).assign(category="all")))
    table = pd.concat([by_category, overall], ignore_index=True)
    rows = []
    for cell in cells:
        for category in _categories(samples):
            picked = table[(table["draft"] == cell.draft.text) & (table["k"] == cell.k)
                           & (table["category"] == category)].sort_values("sweep_id")
            rows.append(Row("speedup", cell.draft.text, cell.k, category, picked["measured_speedup"].tolist(),
                            picked["predicted_speedup"].tolist(), alpha=picked["alpha"].iloc[0],  # greedy: α repeats
                            c=statistics.median(picked["c"])))
    return rows


def _metric(name: str, path: str) -> str:
    return name if path == SKINNY else f"{name}_stock"


def verify_rows(curves: Curves, threads: int) -> list[Row]:
    """Each path's curve at each thread count, per shape (`draft`) and rows (k = rows - 1), over the same path's
    one-token pass; then ours over stock at the same shape, rows and threads. Judged at the bench's threads, and
    at one thread where a goal says so."""
    rows = [Row(_metric("verify_ms", path), shape, width - 1, f"threads={n}", times[(shape, width)],
                times[(CHAIN, 1)], threads=n, judged=n == threads)
            for (path, n), times in curves.items() for shape, width in times]
    rows += [Row("verify_vs_stock", shape, width - 1, f"threads={n}", times[(shape, width)],
                 curves[(STOCK, n)][(shape, width)], threads=n, judged=n == threads)
             for (path, n), times in curves.items() if path == SKINNY for shape, width in times]
    return sorted(rows, key=lambda r: list(UNITS).index(r.metric))


def roofline_rows(curves: Curves, threads: int, weight_bytes: int, copy_gbs: dict[int, list[float]]) -> list[Row]:
    """Weight bytes over the one-token pass time of each path at each thread count, against the copy's GB/s at
    that thread count; judged at the bench's."""
    rows = [Row(_metric("roofline", path), "none", 0, f"threads={n}",
                [weight_bytes / (ms / 1000) / 1e9 for ms in times[(CHAIN, 1)]], copy_gbs[n], threads=n,
                judged=n == threads) for (path, n), times in curves.items()]
    return sorted(rows, key=lambda r: list(UNITS).index(r.metric))


def _stats(values: list[float] | None) -> tuple[float | None, float | None, float | None]:
    return (None, None, None) if values is None else (statistics.median(values), min(values), max(values))


def db_rows(rows: list[Row], context: dict) -> list[dict]:
    """The `bench_results` rows: the context columns, then each row's medians and min–max."""
    out = []
    for row in rows:
        goal, met = row.goal()
        # bench_results keys rows by k (NOT NULL): plain decoding's rows are stored at k = 0, as its verify pass is.
        values = {"draft": row.draft, "k": 0 if row.k is None else row.k, "k_policy": row.k_policy,
                  "category": row.category,
                  **({} if row.threads is None else {"threads": row.threads}),
                  "metric": row.metric, "unit": UNITS[row.metric], "repeats": len(row.ours),
                  "mismatches": row.mismatches, "alpha": row.alpha, "c": row.c, "goal": goal, "goal_met": met}
        for name, series in (("ours", row.ours), ("theirs", row.theirs), ("ratio", row.ratios)):
            values |= dict(zip((name, f"{name}_min", f"{name}_max"), _stats(series), strict=True))
        out.append(context | values)
    return out


