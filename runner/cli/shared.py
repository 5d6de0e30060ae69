"""What every command shares: the app, the consoles, the options both decoding commands take, and bad input as one
line with exit code 2."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console

app = typer.Typer(
    add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
    help="Run speculative decoding on real models and record every round.",
)
stdout = Console(width=None if sys.stdout.isatty() else 200)  # piped: the summary's 14 columns whole
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
POLICY_HELP = "fixed, heuristic[:<cap>], auto[:<cap>] or confidence:<t> (docs/policies.md)"
