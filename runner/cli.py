"""`python -m runner …`: the command line only parses into configs and calls one function."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console

from runner import models
from runner.engine import Bench, DraftSpec, parse_draft
from runner.report import print_generation
from runner.sampling import Decoding
from runner.stats import summarize

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


def check_k(k: int) -> None:
    if not 1 <= k <= K_MAX:
        raise UsageError(f"k must be between 1 and {K_MAX}, got {k}")


def decoding_for(mode: str, temperature: float, top_p: float) -> Decoding:
    """Validate the sampling knobs; greedy runs record temperature 0 and top-p 1, which they use."""
    decoding = Decoding(mode, temperature, top_p)
    return Decoding("greedy", 0.0, 1.0) if decoding.greedy else decoding


@app.callback()
def _commands() -> None:
    """Run speculative decoding on real models and record every round."""


Target = Annotated[str, typer.Option(help="smollm2-135m, a .gguf file, a local directory or a repo id")]
Mode = Annotated[str, typer.Option(help="greedy or sample")]
Device = Annotated[str | None, typer.Option(help="cpu or cuda (default: cuda when present)")]
Dtype = Annotated[str | None, typer.Option(help="float32, bfloat16 or float16 (default: bf16 on cuda, fp32 on cpu)")]


@app.command()
def generate(
    prompt: Annotated[str, typer.Option(help="the user message")],
    target: Target = models.DEFAULT_MODEL,
    draft: Annotated[str, typer.Option(help="ngram[:n], layerskip:<L> or model:<spec>")] = "ngram",
    k: Annotated[int, typer.Option(help="drafts per round")] = 4,
    mode: Mode = "greedy",
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    max_new_tokens: int = 64,
    device: Device = None,
    dtype: Dtype = None,
) -> None:
    """Decode one prompt speculatively and plainly; print the text, every round and the summary."""
    try:
        spec = parse_draft(draft)
        if spec.kind == "baseline":
            raise UsageError("generate compares a draft against plain decoding: give a draft, not none")
        check_k(k)
        decoding = decoding_for(mode, temperature, top_p)
        if max_new_tokens < 1:
            raise UsageError(f"max-new-tokens must be >= 1, got {max_new_tokens}")
        if not prompt.strip():
            raise UsageError("the prompt is empty")
        loaded = models.load(target, device, dtype)
        bench = Bench(loaded, [spec])
        ids = models.encode_chat(loaded, prompt)
        if len(ids) + max_new_tokens > loaded.max_context:
            raise UsageError(
                f"prompt ({len(ids)} tokens) + max-new-tokens ({max_new_tokens}) exceeds the model's "
                f"context of {loaded.max_context} tokens"
            )
        baseline_spec = DraftSpec("none", "baseline", None)
        bench.warm_up([baseline_spec, spec], ids, k, decoding)
        baseline = bench.run(baseline_spec, ids, k, decoding, max_new_tokens, seed)
        run = bench.run(spec, ids, k, decoding, max_new_tokens, seed)
    except ValueError as exc:  # ModelError, UsageError and the engine's checks are all ValueErrors
        fail(str(exc))
    text = loaded.tokenizer.decode(list(run.output_tokens), skip_special_tokens=True)
    summary = summarize(run, baseline, k, decoding.greedy)
    print_generation(stdout, text, run, baseline, summary, loaded.tokenizer)
    if summary.lossless is False:
        stderr.print("[bold red]LOSSLESS CHECK FAILED: speculative output differs from plain greedy[/]")


def main() -> None:
    app(prog_name=f"{sys.executable.rsplit('/', 1)[-1]} -m runner")
