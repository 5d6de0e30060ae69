"""`python -m runner …`: the command line only parses into configs and calls one function."""

from __future__ import annotations

import dataclasses
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import pandas as pd
import torch
import typer
from rich.console import Console

from runner.engine import models
from runner.engine.kernels import SKINNY, all_cores
from runner.engine.pair import PLAIN, Pair, check_drafts, parse_draft, parse_kernels
from runner.engine.policies import FIXED, parse_policy, warm_ks
from runner.engine.sampling import Decoding
from runner.records import Generation, RunRecord
from runner.report import frame_table, print_divergences, print_generation, sweep_table
from runner.serve import ServeError, serve
from runner.store.merge import merge as merge_databases
from runner.store.runs import in_scratch, list_sweeps, sweep_summary
from runner.store.schema import StoreError
from runner.store.sql import QueryError, run_query
from runner.sweep import progress
from runner.sweep.prompts import Prompt, load_prompts, select_prompts
from runner.sweep.run import Cell, SweepConfig, make_record, run_sweep, skipped
from runner.train.fit import TrainConfig
from runner.train.run import default_prompts, epoch_table, train_draft

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
TrustRemoteCode = Annotated[bool, typer.Option(help="run the model code a checkpoint ships (read it first)")]
Kernels = Annotated[str, typer.Option(help="the linears on CPU: skinny (the fastest product measured per weight "
                                      "shape and row count) or stock (torch's F.linear); CUDA always runs stock")]
Threads = Annotated[int | None, typer.Option(help="torch CPU threads (default: OMP_NUM_THREADS, else every core)")]
POLICY_HELP = "fixed, heuristic[:<cap>], auto[:<cap>] or confidence:<t> (README, \"Draft-length policies\")"


def check_threads(threads: int | None) -> int:
    """The thread count to run with: every core unless given."""
    if threads is not None and threads < 1:
        raise UsageError(f"threads must be >= 1, got {threads}")
    return all_cores() if threads is None else threads


@app.command()
def generate(
    prompt: Annotated[str, typer.Option(help="the user message")],
    target: Target = models.DEFAULT_MODEL,
    draft: Annotated[str, typer.Option(help="ngram[:n[:match]], layerskip:<L>, model:<spec>, eagle:<head>")] = "ngram",
    k: Annotated[int, typer.Option(help="drafts per round (where a policy starts)")] = 4,
    k_policy: Annotated[str, typer.Option(help=POLICY_HELP)] = FIXED.text,
    mode: Mode = "greedy",
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    max_new_tokens: int = 64,
    device: Device = None,
    dtype: Dtype = None,
    trust_remote_code: TrustRemoteCode = False,
    kernels: Kernels = SKINNY,
    threads: Threads = None,
) -> None:
    """Decode one prompt speculatively and plainly; print the text, every round and the summary."""
    try:
        parse_kernels(kernels)
        torch.set_num_threads(check_threads(threads))
        spec = parse_draft(draft)
        if spec.kind == "baseline":
            raise UsageError("generate compares a draft against plain decoding: give a draft, not none")
        check_k(k)
        policy = parse_policy(k_policy)
        if not policy.applies_to(spec.kind):
            raise UsageError(policy.refusal(spec.text))
        decoding = decoding_for(mode, temperature, top_p)
        if max_new_tokens < 1:
            raise UsageError(f"max-new-tokens must be >= 1, got {max_new_tokens}")
        if not prompt.strip():
            raise UsageError("the prompt is empty")
        check_drafts(target, [spec], trust_remote_code)
        loaded = models.load(target, device, dtype, trust_remote_code)
        pair = Pair(loaded, [spec], kernels)
        ids = models.encode_chat(loaded, prompt)
        if len(ids) + max_new_tokens > loaded.max_context:
            raise UsageError(
                f"prompt ({len(ids)} tokens) + max-new-tokens ({max_new_tokens}) exceeds the model's "
                f"context of {loaded.max_context} tokens"
            )
        pair.warm_up([PLAIN, spec], ids, warm_ks([k], [policy]), decoding, max_new_tokens)
        baseline = pair.run(PLAIN, ids, None, decoding, max_new_tokens, seed)
        run = pair.run(spec, ids, k, decoding, max_new_tokens, seed, policy)
    except ValueError as exc:  # ModelError, UsageError and the engine's checks are all ValueErrors
        fail(str(exc))
    cell = Cell(Prompt("prompt", "", prompt), decoding, spec, k, policy)
    record, summary = _summary(pair, target, cell, seed, max_new_tokens, baseline, run)
    text = loaded.tokenizer.decode(list(run.output_tokens), skip_special_tokens=True)
    print_generation(stdout, text, run, baseline, summary, loaded.tokenizer)
    if record.mismatch is not None:
        print_divergences(stderr, [("this run", record.mismatch)], record.dtype)


def _summary(pair: Pair, target: str, cell: Cell, seed: int, max_new_tokens: int, baseline: Generation,
             run: Generation) -> tuple[RunRecord, pd.Series]:
    """The run as a sweep would record it, and its row of run_stats against its baseline."""
    common = {"pair": pair, "target_spec": target, "sweep_id": "generate", "seed": seed,
              "max_new_tokens": max_new_tokens, "provenance": {}, "started": datetime.now(UTC).isoformat()}
    base = make_record(Cell(cell.prompt, cell.decoding, PLAIN, None), baseline, None, baseline=None, **common)
    spec_run = make_record(cell, run, None, baseline=(base.run_id, baseline.output_tokens), **common)
    return spec_run, in_scratch([base, spec_run], lambda con: con.execute(
        "SELECT * FROM run_stats WHERE run_id = ?", [spec_run.run_id]).df()).iloc[0]


def _csv(value: str, name: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise UsageError(f"--{name} is empty")
    return items


def _ints(value: str, name: str) -> list[int]:
    items = _csv(value, name)
    if not all(v.lstrip("-").isdigit() for v in items):
        raise UsageError(f"--{name} must be comma-separated integers, got {value}")
    return [int(v) for v in items]


@app.command()
def sweep(
    draft: Annotated[list[str], typer.Option(help="a drafter to compare; repeat for several")],
    target: Target = models.DEFAULT_MODEL,
    k: Annotated[str, typer.Option(help="draft lengths, comma-separated (where a policy starts)")] = "1,2,4,8",
    k_policy: Annotated[list[str], typer.Option(help=POLICY_HELP + "; repeat for several")] = [FIXED.text],  # noqa: B006
    categories: Annotated[str | None, typer.Option(help="comma-separated; default: all")] = None,
    prompts: Annotated[Path | None, typer.Option(help="a JSONL file of {id, category, prompt}")] = None,
    prompts_per_category: Annotated[int | None, typer.Option(help="the first N prompts of each category")] = None,
    mode: Annotated[list[str], typer.Option(help="greedy and/or sample; repeat for both")] = ["greedy"],  # noqa: B006
    temperature: Annotated[float, typer.Option(help="for sample mode")] = 0.7,
    top_p: Annotated[float, typer.Option(help="for sample mode")] = 1.0,
    seed: int = 0,
    max_new_tokens: int = 64,
    db: Annotated[Path, typer.Option(help="the DuckDB file to record into")] = Path("runs.duckdb"),
    resume: Annotated[str | None, typer.Option(
        help="a sweep id: record only its missing cells; 'last': finish the last sweep if it was interrupted and "
             "had this plan, else start a new one")] = None,
    device: Device = None,
    dtype: Dtype = None,
    trust_remote_code: TrustRemoteCode = False,
    kernels: Kernels = SKINNY,
    threads: Threads = None,
    ray: Annotated[str | None, typer.Option(
        help="run the cells on Ray actors: auto (the cluster this machine is in), local (a new one here) or the "
             "cluster's address")] = None,
    workers: Annotated[int | None, typer.Option(help="with --ray: actors (default: one per GPU, else one per node)")]
    = None,
) -> None:
    """Record baseline and speculative runs for every prompt × draft × k into the database."""
    try:
        parse_kernels(kernels)
        if workers is not None and (ray is None or workers < 1):
            raise UsageError("--workers needs --ray and must be >= 1")
        ks = _ints(k, "k")
        for value in ks:
            check_k(value)
        specs = [parse_draft(d) for d in draft]
        if any(s.kind == "baseline" for s in specs):
            raise UsageError("every sweep records its baselines; give only drafts")
        policies = [parse_policy(p) for p in dict.fromkeys(k_policy)]
        if not any(p.applies_to(s.kind) for p in policies for s in specs):
            raise UsageError(policies[0].refusal(specs[0].text))
        if max_new_tokens < 1:
            raise UsageError(f"max-new-tokens must be >= 1, got {max_new_tokens}")
        chosen = select_prompts(load_prompts(prompts), _csv(categories, "categories") if categories else None,
                                prompts_per_category)
        config = SweepConfig(
            target=target, drafts=tuple(draft), ks=tuple(ks),
            decodings=tuple(dict.fromkeys(decoding_for(m, temperature, top_p) for m in mode)),
            prompts=tuple(chosen), max_new_tokens=max_new_tokens, seed=seed, db=db, device=device, dtype=dtype,
            sweep_id=resume, trust_remote_code=trust_remote_code, kernels=kernels, threads=check_threads(threads),
            policies=tuple(p.text for p in policies),
        )
        for line in skipped(config):
            stderr.print(f"skipped: {line}", markup=False, highlight=False, soft_wrap=True)
        if resume == "last":
            config = dataclasses.replace(config, sweep_id=progress.resumable(db, config.plan_id()))
        elif resume and resume not in set(list_sweeps(db)["sweep_id"]):
            raise UsageError(f'no sweep "{resume}" in {db}')
        if ray:
            from runner.sweep.ray_cells import run_sweep_on_ray  # only here: a local sweep never imports Ray

            sweep_id, recorder, _ = run_sweep_on_ray(config, stderr, ray, workers)
        else:
            sweep_id, recorder = run_sweep(config, stderr)
    except (ValueError, StoreError, ConnectionError) as exc:  # ConnectionError: no Ray cluster at --ray
        fail(str(exc))
    stdout.print(sweep_table(sweep_summary(db, sweep_id), sweep_id))
    for problem in recorder.errors:
        stderr.print(f"[red]error run:[/] {problem}", highlight=False)
    print_divergences(stderr, recorder.divergences, recorder.dtype)
    if recorder.device_error:
        stderr.print(f"[bold red]sweep stopped by a device error[/] ({recorder.device_error}): the runs recorded "
                     f"before it are kept; record the rest with --resume {sweep_id}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)


@app.command()
def merge(
    sources: Annotated[list[Path], typer.Argument(help="databases recorded elsewhere")],
    into: Annotated[Path, typer.Option(help="the database to merge into; created if absent")],
) -> None:
    """Bring the runs and benchmarks of other databases into one; those it already has are skipped."""
    try:
        added = merge_databases(sources, into)
    except StoreError as exc:
        fail(str(exc))
    for source in added:
        stdout.print(source.line(), highlight=False, soft_wrap=True)


@app.command("sql")
def sql_command(
    query: Annotated[str, typer.Argument(help="one read-only statement")],
    db: Annotated[Path, typer.Option(help="the DuckDB file")] = Path("runs.duckdb"),
    max_rows: int = 200,
) -> None:
    """Run one read-only SQL statement, sandboxed: no file access, no writes, bounded time and memory."""
    try:
        result = run_query(db, query, max_rows=max_rows)
    except QueryError as exc:
        fail(str(exc))
    stdout.print(frame_table(result.frame), highlight=False)
    note = f"{len(result.frame)} row(s) in {result.elapsed_s * 1000:.0f} ms"
    stderr.print(note + (f" (truncated at {max_rows})" if result.truncated else ""), highlight=False)


@app.command("list")
def list_command(db: Annotated[Path, typer.Option(help="the DuckDB file")] = Path("runs.duckdb")) -> None:
    """List the recorded sweeps, newest first."""
    try:
        sweeps = list_sweeps(db)
    except StoreError as exc:
        fail(str(exc))
    stdout.print(frame_table(sweeps), highlight=False)


@app.command("train-draft")
def train_draft_command(
    out: Annotated[Path, typer.Option(help="the head's directory (config.json + model.safetensors), written last")],
    target: Target = models.DEFAULT_MODEL,
    prompts: Annotated[Path | None, typer.Option(help="JSONL of {id, category, prompt}; default: the shipped "
                                                      "training prompts")] = None,
    max_tokens: Annotated[int, typer.Option(help="answer tokens of training data the target writes")] = 60_000,
    epochs: int = 6,
    draft_vocab: Annotated[int, typer.Option(help="the head's vocabulary: the most frequent answer tokens")] = 8192,
    unroll: Annotated[int, typer.Option(help="draft positions trained on the head's own outputs")] = 3,
    lr: Annotated[float, typer.Option(help="AdamW's peak learning rate")] = 2e-3,
    max_new_tokens: Annotated[int, typer.Option(help="the longest answer per training prompt")] = 192,
    seed: int = 0,
    db: Annotated[Path, typer.Option(help="the DuckDB file the training and its epochs go to")] = Path("runs.duckdb"),
    device: Device = None,
    threads: Annotated[int | None, typer.Option(help="torch threads (default: one per core); 1 is faster on a "
                                                     "machine other jobs keep busy")] = None,
) -> None:
    """Train an EAGLE-style draft head for a target on its own answers; record every epoch."""
    config = TrainConfig(
        target=target, out=out, prompts=prompts or default_prompts(), max_tokens=max_tokens, epochs=epochs,
        draft_vocab=draft_vocab, seed=seed, db=db, unroll=unroll, lr=lr, max_new_tokens=max_new_tokens,
        device=device, threads=threads, command=" ".join(["python -m runner", *sys.argv[1:]]),
    )
    try:
        trained = train_draft(config, stderr)
    except (ValueError, StoreError) as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        stderr.print(f"interrupted: {out} was not written")
        raise typer.Exit(130) from None
    stdout.print(epoch_table(trained), highlight=False)
    stdout.print(f"saved epoch {trained.saved_epoch} to {out}; compare it: python -m runner sweep --draft eagle:{out}",
                 highlight=False, soft_wrap=True)


@app.command("serve")
def serve_command(
    db: Annotated[Path, typer.Option(help="the DuckDB file")] = Path("runs.duckdb"),
    port: Annotated[int, typer.Option(help="the dashboard's port")] = 8501,
    sweep: Annotated[str | None, typer.Option(
        help="also record a sweep into --db meanwhile: the options of `runner sweep`, quoted as one string; "
             "a sweep of the same plan interrupted earlier is finished")] = None,
) -> None:
    """Serve the dashboard on --db at once, and optionally record a sweep into it meanwhile; Ctrl-C stops both."""
    try:
        code = serve(db, port, sweep)
    except ServeError as exc:
        fail(str(exc))
    raise typer.Exit(code)


def main() -> None:
    app(prog_name=f"{sys.executable.rsplit('/', 1)[-1]} -m runner")
