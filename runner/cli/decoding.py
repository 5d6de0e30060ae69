"""`generate` (one prompt, speculative against plain) and `sweep` (every prompt × draft × k, recorded)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import torch
import typer

from runner.cells import Cell, check_fit, judge
from runner.cli.engine_inputs import OURS, Engine, check_engine, vllm_drafts_for
from runner.cli.inputs import batch_sizes, check_run, csv, decoding_for, ints, parse_drafts
from runner.cli.shared import (
    POLICY_HELP,
    Device,
    Dtype,
    Kernels,
    Mode,
    Target,
    Threads,
    TrustRemoteCode,
    UsageError,
    app,
    fail,
    stderr,
    stdout,
)
from runner.engine import tree_size
from runner.engine.drafters import registry
from runner.engine.drafters.registry import check_drafts
from runner.engine.round.policies import FIXED, warm_ks
from runner.engine.weights import models
from runner.engine.weights.kernels import SKINNY
from runner.engines import RunContext, Workload
from runner.pair_engine import PairEngine
from runner.prompts import Prompt, load_prompts, select_prompts
from runner.records import Generation, RunRecord
from runner.report import print_divergences, print_generation, sweep_table
from runner.store.runs import in_scratch, list_sweeps, sweep_summary
from runner.store.schema import StoreError
from runner.sweep import progress
from runner.sweep.loop import run_sweep
from runner.sweep.plan import SweepConfig, skipped
from runner.sweep.recorder import Recorder


@app.command()
def generate(
    prompt: Annotated[str | None, typer.Option(help="the user message (or --prompt-id)")] = None,
    prompt_id: Annotated[str | None, typer.Option(
        help="a prompt of --prompts by id (a Spec-Bench turn: <question_id>-<turn>, asked after the earlier turns; "
             "a SPEED-Bench prompt: <split>-<line>, e.g. throughput_2k-3)")]
    = None,
    prompts: Annotated[Path | None, typer.Option(help="where --prompt-id is read from (default: the built-in "
                                                      "suite): the project's JSONL, Spec-Bench's question.jsonl, or "
                                                      "a SPEED-Bench directory or one of its files")]
    = None,
    target: Target = models.DEFAULT_MODEL,
    draft: Annotated[str, typer.Option(help=registry.usage())] = "ngram",
    k: Annotated[int, typer.Option(help="drafts per round (where a policy starts; a tree's depth)")] = 4,
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
    batch: Annotated[int, typer.Option(help="decode B copies of the prompt together (each its own sequence), "
                                            "speculatively and plainly")] = 1,
    engine: Engine = OURS,
) -> None:
    """Decode one prompt speculatively and plainly; print the text, every round and the summary."""
    if check_engine(engine) != OURS:
        _generate_on_vllm(engine, prompt, prompt_id, prompts, target, draft, k, k_policy, mode, temperature, top_p,
                          seed, max_new_tokens, threads, batch)
        return
    try:
        torch.set_num_threads(check_run(kernels, threads, max_new_tokens))
        (spec,), (policy,) = parse_drafts([draft], [k], [k_policy], "generate compares a draft against plain "
                                          "decoding: give a draft, not none")
        decoding = decoding_for(mode, temperature, top_p)
        chosen = _chosen_prompt(prompt, prompt_id, prompts)
        check_drafts(target, [spec], trust_remote_code)
        engine = PairEngine.load(target, [spec], kernels, max_new_tokens, seed, device, dtype, trust_remote_code)
        (size,) = batch_sizes(str(batch))
        cell = Cell(chosen, decoding, spec, k, policy, batch=(chosen,) * size if size > 1 else ())
        records = _generate(engine, target, cell, seed, max_new_tokens)
    except ValueError as exc:  # ModelError, UsageError and the engine's checks are all ValueErrors
        fail(str(exc))
    baseline, run = records
    summary = in_scratch(list(records), lambda con: con.execute(
        "SELECT * FROM run_stats WHERE run_id = ?", [run.run_id]).df()).iloc[0]
    tokenizer = engine.pair.target.tokenizer
    text = tokenizer.decode(list(run.generation.output_tokens), skip_special_tokens=True)
    print_generation(stdout, text, run.generation, baseline.generation, summary, tokenizer)
    if run.mismatch is not None:
        print_divergences(stderr, [("this run", run.mismatch)], run.dtype)


def _generate_on_vllm(engine: str, prompt: str | None, prompt_id: str | None, prompts: Path | None, target: str,
                      draft: str, k: int, k_policy: str, mode: str, temperature: float, top_p: float, seed: int,
                      max_new_tokens: int, threads: int | None, batch: int) -> None:
    """`generate` on vLLM: the same checks, then the cell and its baseline on vLLM (runner/cli/generate_vllm.py)."""
    from runner.cli.generate_vllm import generate_on_vllm  # only here: our engine's runs never import vLLM's side

    try:
        check_run(SKINNY, threads, max_new_tokens)
        (spec,), _ = vllm_drafts_for([draft], [k_policy])
        parse_drafts(["ngram"], [k], [FIXED.text], "")  # k's bounds
        (size,) = batch_sizes(str(batch))
        generate_on_vllm(engine, target, _chosen_prompt(prompt, prompt_id, prompts), spec, k,
                         decoding_for(mode, temperature, top_p), seed, max_new_tokens, threads or 1, size)
    except ValueError as exc:
        fail(str(exc))


def _chosen_prompt(prompt: str | None, prompt_id: str | None, prompts: Path | None) -> Prompt:
    """The message given, or the prompt of that id in the file (the built-in suite by default)."""
    if (prompt is None) == (prompt_id is None):
        raise UsageError("give either --prompt or --prompt-id")
    if prompt is not None:
        if prompts is not None:
            raise UsageError("--prompts goes with --prompt-id, not --prompt")
        if not prompt.strip():
            raise UsageError("the prompt is empty")
        return Prompt("prompt", "", prompt)
    found = {p.id: p for p in load_prompts(prompts)}
    if prompt_id not in found:
        raise UsageError(f'no prompt "{prompt_id}" in {prompts.name if prompts else "the built-in suite"}')
    return found[prompt_id]


def _generate(engine: PairEngine, target: str, cell: Cell, seed: int,
              max_new_tokens: int) -> tuple[RunRecord, RunRecord]:
    """The cell and its baseline, warmed up, run and recorded as a sweep would (in no file): (baseline, run). A later
    turn is asked after the target's answers to the earlier ones, as in a sweep."""
    ids, context_size = engine.prompt_ids(cell.prompt), engine.pair.target.max_context
    check_fit([(cell.prompt.id, len(ids))], max_new_tokens, context_size)
    engine.prepare(Workload((cell.prompt,), (cell.draft,), warm_ks([cell.k], [cell.policy]), (cell.decoding,),
                            (cell.batch_size,)))
    for (text, k, size), trials in engine.pair.tree_trials.items():
        if trials:
            stderr.print(tree_size.line(text, k, size, trials), markup=False, highlight=False, soft_wrap=True)
    context = RunContext(engine, target, "generate", seed, max_new_tokens)
    started = datetime.now(UTC).isoformat()

    def first(one: Cell) -> Generation:
        """Alone, or the first sequence of its batch; a batch's throughput is said on stdout."""
        if not one.batch:
            return engine.run(one, ids)
        batch = engine.run_batch([one.mate(slot) for slot in range(one.batch_size)], [ids] * one.batch_size)
        rate = sum(len(g.output_tokens) for g in batch) / max(g.wall_s for g in batch)
        stdout.print(f"{one.draft.text}, {one.batch_size} sequences together: {rate:.1f} tokens/s in all",
                     highlight=False)
        return batch[0]
    baseline = context.make_record(cell.baseline, first(cell.baseline), None, started)
    run = context.make_record(cell, first(cell), None, started)
    return baseline, judge(run, (baseline.run_id, baseline.generation.output_tokens), engine.classify)


@app.command()
def sweep(
    draft: Annotated[list[str], typer.Option(help="a drafter to compare; repeat for several")],
    target: Target = models.DEFAULT_MODEL,
    k: Annotated[str, typer.Option(help="draft lengths, comma-separated (where a policy starts)")] = "1,2,4,8",
    k_policy: Annotated[list[str], typer.Option(help=POLICY_HELP + "; repeat for several")] = [FIXED.text],  # noqa: B006
    categories: Annotated[str | None, typer.Option(help="comma-separated; default: all")] = None,
    prompts: Annotated[Path | None, typer.Option(
        help="a JSONL file of {id, category, prompt}, Spec-Bench's question.jsonl (every turn of a question), or a "
             "SPEED-Bench directory (qualitative.jsonl, throughput_<n>k.jsonl) or one of its files")]
    = None,
    splits: Annotated[str | None, typer.Option(
        help="of a SPEED-Bench directory, comma-separated: qualitative, throughput_1k, throughput_2k, ... "
             "(vLLM's --speed-bench-dataset-subset); default: every split in it")] = None,
    prompts_per_category: Annotated[int | None, typer.Option(
        help="the first N prompts (a question's turns count as one) of each category (of each SPEED-Bench split)")]
    = None,
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
    batch: Annotated[str, typer.Option(help="batch sizes, comma-separated: B > 1 decodes B prompts of a category "
                                            "together, against plain decoding at B")] = "1",
    repeats: Annotated[int, typer.Option(help="record every cell N times, its baseline again before each "
                                              "repetition, so each speedup's spread is measured")] = 1,
    engine: Engine = OURS,
) -> None:
    """Record baseline and speculative runs for every prompt × draft × k into the database."""
    try:
        all_threads = check_run(kernels, threads, max_new_tokens)
        if repeats < 1:
            raise UsageError("--repeats must be >= 1")
        if workers is not None and (ray is None or workers < 1):
            raise UsageError("--workers needs --ray and must be >= 1")
        ks = ints(k, "k")
        if check_engine(engine) == OURS:
            specs, policies = parse_drafts(draft, ks, k_policy, "every sweep records its baselines; give only drafts")
        else:
            parse_drafts(["ngram"], ks, [FIXED.text], "")  # the ks' bounds
            specs, policies = vllm_drafts_for(draft, k_policy)
            all_threads = threads or 1  # vLLM binds its threads to cores 0..threads-1
        if splits is not None and prompts is None:
            raise UsageError("--splits chooses files of a SPEED-Bench directory: give it as --prompts")
        chosen = select_prompts(load_prompts(prompts, csv(splits, "splits") if splits is not None else None),
                                csv(categories, "categories") if categories else None, prompts_per_category)
        config = SweepConfig(
            target=target, drafts=specs, ks=tuple(ks),
            decodings=tuple(dict.fromkeys(decoding_for(m, temperature, top_p) for m in mode)),
            prompts=tuple(chosen), max_new_tokens=max_new_tokens, seed=seed, db=db, device=device, dtype=dtype,
            sweep_id=resume, trust_remote_code=trust_remote_code, kernels=kernels, threads=all_threads,
            policies=policies, batches=batch_sizes(batch), repeats=repeats, engine=engine,
        )
        if ray and engine != OURS:
            raise UsageError("vLLM runs its own servers: drop --ray with --engine vllm")
        if ray and config.batches != (1,):
            raise UsageError("--batch above 1 runs in this process only: drop --ray, or sweep --batch 1 on Ray")
        sweep_id, recorder = _record(config, resume, ray, workers)
    except (ValueError, StoreError, ConnectionError) as exc:  # ConnectionError: no Ray cluster at --ray
        fail(str(exc))
    _report(config.db, sweep_id, recorder)


def _record(config: SweepConfig, resume: str | None, ray: str | None, workers: int | None) -> tuple[str, Recorder]:
    """The sweep recorded, here or on Ray, after saying which draft × policy pairs it leaves out."""
    for line in skipped(config):
        stderr.print(f"skipped: {line}", markup=False, highlight=False, soft_wrap=True)
    if resume == "last":
        config = dataclasses.replace(config, sweep_id=progress.resumable(config.db, config.plan_id()))
    elif resume and resume not in set(list_sweeps(config.db)["sweep_id"]):
        raise UsageError(f'no sweep "{resume}" in {config.db}')
    if not ray:
        return run_sweep(config, stderr)
    from runner.sweep.ray_cells import run_sweep_on_ray  # only here: a local sweep never imports Ray

    sweep_id, recorder, _ = run_sweep_on_ray(config, stderr, ray, workers)
    return sweep_id, recorder


def _report(db: Path, sweep_id: str, recorder: Recorder) -> None:
    """The sweep's summary on stdout; its errors, lossless failures and a device error's stop on stderr."""
    stdout.print(sweep_table(sweep_summary(db, sweep_id), sweep_id))
    for problem in recorder.errors:
        stderr.print(f"[red]error run:[/] {problem}", highlight=False)
    print_divergences(stderr, recorder.divergences, recorder.dtype)
    if recorder.device_error:
        stderr.print(f"[bold red]sweep stopped by a device error[/] ({recorder.device_error}): the runs recorded "
                     f"before it are kept; record the rest with --resume {sweep_id}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)

