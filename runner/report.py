"""Printing results for people: the round table and the summary, in the explainer's terms."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
from rich.console import Console
from rich.table import Table
from rich.text import Text

from runner.records import Divergence, Generation

if TYPE_CHECKING:  # the tokenizer's type only: `sql` and `list` print tables without importing transformers
    from transformers import PreTrainedTokenizerBase


def _piece(tokenizer: PreTrainedTokenizerBase, token: int) -> str:
    return tokenizer.decode([token]).replace("\n", "⏎")


def round_table(run: Generation, tokenizer: PreTrainedTokenizerBase) -> Table:
    """One line per round: drafts coloured by fate (accepted, rejected, thrown) and the target's token."""
    table = Table(title="rounds", title_justify="left")
    for name in ("round", "k", "acc", "rej", "thrown", "emitted", "draft ms", "verify ms", "drafts", "target adds"):
        table.add_column(name, justify="right" if name not in ("drafts", "target adds") else "left")
    for i, r in enumerate(run.rounds):
        drafts = Text()
        for j, token in enumerate(r.draft_tokens):
            style = "green" if j < r.accepted else "red strike" if j == r.accepted else "dim strike"
            drafts.append(f"[{_piece(tokenizer, token)}]", style=style)
        added = r.target_tokens[r.accepted] if r.accepted < len(r.target_tokens) else None
        label = "" if added is None else f"{'bonus' if r.bonus else 'correction'} [{_piece(tokenizer, added)}]"
        table.add_row(
            str(i), str(r.k), str(r.accepted), str(r.rejected), str(r.thrown), str(r.emitted),
            f"{r.draft_s * 1e3:.1f}", f"{r.verify_s * 1e3:.1f}", drafts, label,
        )
    return table


def _fmt(value: float | None, pattern: str) -> str:
    return "n/a" if value is None else format(value, pattern)


def _fmt(value: object, pattern: str, suffix: str = "") -> str:
    return "n/a" if value is None or pd.isna(value) else format(value, pattern) + suffix


def summary_table(s: pd.Series, run: Generation, baseline: Generation) -> Table:
    """The run's row of run_stats (`s`) in the explainer's terms, with the two wall times behind the speedup."""
    table = Table(title="summary", title_justify="left", show_header=False)
    lossless = "n/a (sampling)" if pd.isna(s["lossless"]) else (
        "✓ identical to plain greedy" if s["lossless"] else "✗ DIFFERS from plain greedy")
    rows = [
        ("rounds", str(s["n_rounds"])),
        ("drafts accepted / rejected / thrown", " / ".join(_fmt(s[n], ".0f") for n in ("accepted", "rejected",
                                                                                         "thrown"))),
        ("α (accepted / judged)", _fmt(s["alpha"], ".3f")),
        ("τ (tokens per round)", _fmt(s["tau"], ".2f")),
        ("time: speculative / baseline", f"{run.wall_s:.2f} s / {baseline.wall_s:.2f} s"),
        ("tokens: speculative / baseline", f"{len(run.output_tokens)} / {len(baseline.output_tokens)}"),
        ("c (draft token / target pass)", _fmt(s["c"], ".3f")),
        ("measured speedup", _fmt(s["measured_speedup"], ".2f", "×")),
        ("formula's prediction", _fmt(s["theoretical_speedup"], ".2f", "×")),
        ("lossless", lossless),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def print_generation(console: Console, text: str, run: Generation, baseline: Generation, summary: pd.Series,
                     tokenizer: PreTrainedTokenizerBase) -> None:
    console.print(text, markup=False, highlight=False)
    console.print(round_table(run, tokenizer))
    console.print(summary_table(summary, run, baseline))


def print_divergences(console: Console, found: list[tuple[str, Divergence]], dtype: str) -> None:
    """Greedy runs that differ from plain greedy, real divergences first: those say something is wrong; a numeric
    tie says only that two logits were within the dtype's rounding of each other."""
    def line(runs: list[tuple[str, Divergence]]) -> str:
        return "; ".join(f"{label} at token {d.at} (top-2 gap {d.gap:.3g}, tolerance {d.tolerance:.3g})"
                         for label, d in runs)
    real = [(label, d) for label, d in found if d.kind == "real"]
    ties = [(label, d) for label, d in found if d.kind == "tie"]
    if real:
        console.print(f"[bold red]LOSSLESS CHECK FAILED, a real divergence from plain greedy in {len(real)} "
                      "run(s):[/] " + line(real), highlight=False, soft_wrap=True)
    if ties:
        console.print(f"[yellow]{len(ties)} run(s) differ from plain greedy at a numeric tie[/] (the contested "
                      f"logits within {dtype} rounding of each other): " + line(ties), highlight=False,
                      soft_wrap=True)
    unjudged = [label for label, d in found if d.kind not in ("real", "tie")]
    if unjudged:  # vLLM's runs: no logits come back to tell a tie from a real divergence
        console.print(f"[yellow]{len(unjudged)} run(s) differ from the engine's plain greedy, unclassified[/] (the "
                      "engine returns no logits): " + "; ".join(unjudged), highlight=False, soft_wrap=True)


def frame_table(frame: pd.DataFrame, title: str | None = None) -> Table:
    table = Table(title=title, title_justify="left")
    for column in frame.columns:
        numeric = pd.api.types.is_numeric_dtype(frame[column])
        table.add_column(str(column), justify="right" if numeric else "left")
    for row in frame.itertuples(index=False):
        table.add_row(*("" if v is None or (isinstance(v, float) and pd.isna(v)) else
                        format(v, ".3g") if isinstance(v, float) else str(v) for v in row))
    return table


def sweep_table(summary: pd.DataFrame, sweep_id: str) -> Table:
    """The end-of-sweep table: per category × draft × k, α, τ, thrown share and the two speedups."""
    return frame_table(summary, title=f"sweep {sweep_id}")
