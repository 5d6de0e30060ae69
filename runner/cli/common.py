"""What every command shares: the app, the consoles, the options both decoding commands take, and bad input as one
line with exit code 2."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console

from runner.engine.kernels import all_cores
from runner.engine.pair import DraftSpec, parse_draft, parse_kernels
from runner.engine.policies import PolicySpec, parse_policy
from runner.engine.sampling import Decoding

K_MAX = 64  # more drafts than this per round only burns draft calls
app = typer.Typer(
    add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
    help="Run speculative decoding on real models and record every round.",
)
stdout = Console(width=None if sys.stdout.isatty() else 160)
stderr = Console(stderr=True)


class UsageError(ValueError):
    """Bad input from the user: printed as one line, exit code 2."""


def fail(message: str) -> None:
    stderr.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(2)


@app.callback()
def _commands() -> None:
    """Run speculative decoding on real models and record every round."""


Target = Annotated[str, typer.Option(help="smollm2-135m, a .gguf file, a local directory or a repo id")]
Mode = Annotated[str, typer.Option(help="greedy or sample")]
Device = Annotated[str | None, typer.Option(help="cpu or cuda (default: cuda when present)")]
Dtype = Annotated[str | None, typer.Option(help="float32, bfloat16 or float16 (default: bf16 on cuda, fp32 on cpu)")]
TrustRemoteCode = Annotated[bool, typer.Option(help="run the model code a checkpoint ships (read it first)")]
Kernels = Annotated[str, typer.Option(help="the linears on CPU: skinny (the fastest product measured per weight "
                                      "shape and row count) or stock (torch's F.linear); CUDA always runs stock")]
Threads = Annotated[int | None, typer.Option(help="torch CPU threads (default: OMP_NUM_THREADS, else every core)")]
POLICY_HELP = "fixed, heuristic[:<cap>], auto[:<cap>] or confidence:<t> (README, \"Draft-length policies\")"


def decoding_for(mode: str, temperature: float, top_p: float) -> Decoding:
    """Validate the sampling knobs; greedy runs record temperature 0 and top-p 1, which they use."""
    decoding = Decoding(mode, temperature, top_p)
    return Decoding("greedy", 0.0, 1.0) if decoding.greedy else decoding


def check_run(kernels: str, threads: int | None, max_new_tokens: int) -> int:
    """The knobs every decoding command takes; returns the thread count to run with (every core unless given)."""
    parse_kernels(kernels)
    if threads is not None and threads < 1:
        raise UsageError(f"threads must be >= 1, got {threads}")
    if max_new_tokens < 1:
        raise UsageError(f"max-new-tokens must be >= 1, got {max_new_tokens}")
    return all_cores() if threads is None else threads


def parse_drafts(drafts: list[str], ks: list[int], policies: list[str],
                 baseline_refusal: str) -> tuple[tuple[DraftSpec, ...], tuple[PolicySpec, ...]]:
    """The drafts and policies, parsed once; refuses `none` as a draft, k outside 1..K_MAX and a set of policies
    that none of the drafts can follow."""
    specs = tuple(parse_draft(d) for d in drafts)
    if any(s.baseline for s in specs):
        raise UsageError(baseline_refusal)
    for k in ks:
        if not 1 <= k <= K_MAX:
            raise UsageError(f"k must be between 1 and {K_MAX}, got {k}")
    parsed = tuple(parse_policy(p) for p in dict.fromkeys(policies))
    if not any(p.applies_to(s.kind) for p in parsed for s in specs):
        raise UsageError(parsed[0].refusal(specs[0].text))
    return specs, parsed


def csv(value: str, name: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise UsageError(f"--{name} is empty")
    return items


def ints(value: str, name: str) -> list[int]:
    items = csv(value, name)
    if not all(v.lstrip("-").isdigit() for v in items):
        raise UsageError(f"--{name} must be comma-separated integers, got {value}")
    return [int(v) for v in items]


MAX_BATCH = 64  # sequences decoded together


def batch_sizes(value: str) -> tuple[int, ...]:
    """A `--batch` list: each size from 1 to MAX_BATCH, ascending, once."""
    sizes = ints(value, "batch")
    if not all(1 <= b <= MAX_BATCH for b in sizes):
        raise UsageError(f"--batch sizes must be between 1 and {MAX_BATCH}, got {value}")
    return tuple(sorted(set(sizes)))


def main() -> None:
    app(prog_name=f"{sys.executable.rsplit('/', 1)[-1]} -m runner")
