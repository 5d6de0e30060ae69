"""The bench printed: a Markdown table per metric, the lossless check, and the results file."""

from __future__ import annotations

import os
import platform

import torch

from bench.rows import reference_of
from bench.side_by_side import Sample
from runner.engine.weights.kernels import cpu_name
from runner.store.bench_rows import ABOUT, UNITS


def _fmt(record: dict, name: str, unit: str) -> str:
    median, low, high = record[name], record[f"{name}_min"], record[f"{name}_max"]
    if median is None:
        return "—"
    pattern = {"share": "{:.2%}", "ms": "{:.1f}", "passes": "{:.1f}"}.get(unit, "{:.2f}")
    text = pattern.format(median)
    return text if record["repeats"] == 1 else f"{text} ({pattern.format(low)}–{pattern.format(high)})"


HEADER = "| metric | draft | k | policy | category | ours | theirs | ours/theirs | α | c | goal | mismatches |"


def format_line(record: dict) -> str:
    """One table line from one `bench_results` row: what is printed is what is stored."""
    unit = record["unit"]
    alpha, c = ("" if record[n] is None else f"{record[n]:.3f}" for n in ("alpha", "c"))
    goal = "" if record["goal"] is None else f"{record['goal']}: {'met' if record['goal_met'] else 'NOT met'}"
    mismatches = "" if record["mismatches"] is None else record["mismatches"]
    return (f"| {record['metric']} | {record['draft']} | {record['k']} | {record['k_policy']} | {record['category']} | "
            f"{_fmt(record, 'ours', unit)} | {_fmt(record, 'theirs', unit)} | {_fmt(record, 'ratio', 'x')} | "
            f"{alpha} | {c} | {goal} | {mismatches} |")


def table(records: list[dict]) -> str:
    """A Markdown table per metric, under the line that says what it compares."""
    parts = []
    for metric in UNITS:
        chosen = [r for r in records if r["metric"] == metric]
        if chosen:
            parts += [f"{ABOUT[metric]} [{UNITS[metric]}]", "", HEADER, "|" + "---|" * 12,
                      *map(format_line, chosen), ""]
    return "\n".join(parts)



def mismatch_lines(samples: list[Sample], reference: dict) -> list[str]:
    lines = []
    for s in samples:
        ref = reference[reference_of(s)]
        if s.tokens != ref:
            pairs = zip(s.tokens, ref, strict=False)
            at = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(s.tokens), len(ref)))
            lines.append(f"{s.engine} {s.cell.draft.text} k={s.cell.k} {s.cell.policy.text} {s.prompt.id} "
                         f"repeat {s.repeat}: "
                         f"differs from greedy at new token {at} ({len(s.tokens)} vs {len(ref)} tokens)")
    return lines



def markdown_report(config, outcome, seconds: float, loads: tuple) -> str:
    """The results file: command, machine, load, the table, mismatches, goals."""
    first = outcome.records[0]
    goals = [f"- {r['metric']} {r['draft']} k={r['k']} {r['category']}: {r['goal']}: "
             f"{'met' if r['goal_met'] else 'NOT met'}" for r in outcome.records if r["goal"]]
    return "\n".join([
        f"# make bench: {config.target} on {first['device']} ({first['dtype']})", "",
        f"- command: `{config.command}`", f"- bench_id: {outcome.bench_id}; took {seconds:.0f} s",
        f"- machine: {cpu_name()}, {os.cpu_count()} cores, {platform.platform()}, torch threads "
        f"{torch.get_num_threads()}, "
        f"torch {torch.__version__}, python {platform.python_version()}",
        f"- load average (1, 5, 15 min) before: {loads[0]}, after: {loads[1]}", "",
        outcome.text, "## Lossless", "",
        *(outcome.mismatches or ["every output equal to its engine's plain greedy output"]), "",
        "## Goals (medians)", "", *goals, ""])


