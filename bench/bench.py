"""`make bench`: our decode loop against transformers' `generate` on one target, side by side.

For every prompt, the two engines alternate (which goes first flips each time) after a warm-up:
(a) plain decoding: our tokens/s over `generate(do_sample=False)`'s;
(b) speculative decoding: ours over transformers' assisted generation with the same draft and k
    (prompt lookup: `prompt_lookup_num_tokens`; a layer-skip draft: `assistant_model`, constant k);
(c) overhead: the share of a speculative run's wall time spent outside the forward passes of the target
    and the draft, and the share that recording its rounds (write_run) adds;
(d) our measured speedup over our plain decoding next to the formula's, at the run's own α and c;
(e) our draft-length policies (`--policies`, from `--policy-k`) against transformers' adaptive schedules: its
    heuristic schedule for an assistant model and for early exit (a layer-skip draft), and, for prompt lookup, which
    transformers does not adapt, its best fixed `prompt_lookup_num_tokens` of the bench's k.
(f) batches: B prompts decoded together, ours (plain and each chain draft at --policy-k) against transformers'
    plain batched generate on the same prompts, tokens/s.
And the verify curve: one target pass over 1-64 rows at a ~200-token context (a chain of k+1 tokens, a tree under
its mask, a batch of sequences of 5 tokens each), on stock F.linear and on our skinny kernels, at 1 thread and at
the bench's; and the roofline: the weight bytes a one-token pass reads over its time, against the bandwidth of a
STREAM-style copy timed among those passes, at the same thread count.

Every value is the median over repeats with its min–max; each printed row is also a row of
`bench_results` in the database. Run from the repository root: `python bench/bench.py --help`.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `python bench/bench.py` puts bench/, not the repository, on the path

import torch  # noqa: E402

from bench.batched import batch_rows  # noqa: E402
from bench.passes import at_each, verify_curves, weight_bytes  # noqa: E402
from bench.rows import (  # noqa: E402
    Row,
    adaptive_rows,
    db_rows,
    overhead_rows,
    pass_rows,
    roofline_rows,
    speedup_rows,
    throughput_rows,
    verify_rows,
)
from bench.side_by_side import PLAIN_CELL, BenchConfig, Cell, Engines, dtype_name, measure  # noqa: E402
from bench.tables import markdown_report, mismatch_lines, table  # noqa: E402
from runner.engine.drafters.registry import applies, parse_draft  # noqa: E402
from runner.engine.round.policies import FIXED, parse_policy  # noqa: E402
from runner.engine.weights import kernels, models  # noqa: E402
from runner.engine.weights.kernels import (  # noqa: E402
    SKINNY,
    all_cores,
    parse_kernels,  # noqa: E402
)
from runner.prompts import PromptError, load_prompts, select_prompts  # noqa: E402
from runner.store.bench_rows import write_bench  # noqa: E402
from runner.store.connect import init_db  # noqa: E402
from runner.store.schema import StoreError  # noqa: E402


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
    torch.set_num_threads(config.threads)
    target = models.load(config.target, config.device, config.dtype)
    if target.device.type == "cpu":
        progress("kernels: timing the candidates on this machine now")
        remeasure_kernels(target, sorted({1, config.threads}))
    engines = Engines(config, target)
    drafts, policies = [parse_draft(d) for d in config.drafts], [parse_policy(p) for p in config.policies]
    cells = ([PLAIN_CELL] + [Cell(d, k) for d in drafts for k in config.ks]
             + [Cell(d, config.policy_k, p) for d in drafts for p in policies if applies(p, d.kind)])
    prompts = {p: models.encode_chat(target, p.text) for p in config.prompts}
    progress("warm-up")
    first = next(iter(prompts.values()))
    try:
        for cell in cells:
            for engine in cell.engines:
                engines.run(engine, cell, config.prompts[0], first, config.warmup_tokens, -1)
        samples = measure(engines, cells, prompts, config.repeats, config.max_new_tokens, progress)
    finally:
        engines.close()
    progress(f"batches of {config.batch}: ours against transformers' batched generate")
    reference = {(s.engine, s.prompt.id): s.tokens for s in samples if s.cell == PLAIN_CELL and s.repeat == 0}
    batch_cells = [PLAIN_CELL] + [Cell(d, config.policy_k) for d in drafts]
    rows_batched = batched(engines, batch_cells, prompts, reference, config)
    progress("verify curves and the copy bandwidth")
    thread_counts = sorted({1, config.threads})
    curves, copy_gbs = verify_curves(target, config.verify_context, config.verify_repeats, thread_counts)
    fixed = [cell for cell in cells if cell.policy == FIXED]
    rows = (throughput_rows(samples, fixed, reference) + adaptive_rows(samples, cells, reference)
            + pass_rows(samples, fixed) + overhead_rows(samples, fixed[1:]) + speedup_rows(samples, fixed[1:])
            + rows_batched + verify_rows(curves, config.threads)
            + roofline_rows(curves, config.threads, weight_bytes(target.model), copy_gbs))
    bench_id = started.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:4]
    prov = engines.provenance
    context = {"bench_id": bench_id, "started_at": started, "device": str(target.device),
               "device_name": prov["device_name"], "dtype": dtype_name(target),
               "threads": config.threads, "kernels": engines.engine.kernels, "target": config.target,
               "prompts": len(config.prompts), "max_new_tokens": config.max_new_tokens,
               "load_before": load_before, "load_after": os.getloadavg()[0], "command": config.command,
               **{k: prov.get(k) for k in ("torch_version", "transformers_version", "host", "git_commit")}}
    records = db_rows(rows, context)
    write_bench(config.db, records)
    return Outcome(bench_id, rows, records, table(records), mismatch_lines(samples, reference))



def batched(engines: Engines, cells: list[Cell], prompts: dict, reference: dict, config: BenchConfig) -> list[Row]:
    """The batch rows: the prompts reused in turn to fill whole batches of `config.batch`, warmed up once."""
    chosen = list(prompts.items())
    filled = [chosen[i % len(chosen)] for i in range(max(len(chosen), config.batch) // config.batch * config.batch)]
    ids, ref = [i for _, i in filled], [reference[("ours", p.id)] for p, _ in filled]
    batch_rows(engines, cells, ids[: config.batch], ref[: config.batch], config.batch, 1, config.warmup_tokens)
    return batch_rows(engines, cells, ids, ref, config.batch, config.repeats, config.max_new_tokens)


def remeasure_kernels(target: models.Loaded, thread_counts: list[int]) -> None:
    """The skinny kernels' choices measured in this run, at each thread count, rather than read from a cache that a
    busier machine may have written."""
    switch = kernels.attach(target.model)
    for _ in at_each(thread_counts):
        switch.table(remeasure=True)


class UsageError(ValueError):
    """Bad command-line input: one line, exit code 2."""



def parse_args(argv: list[str]) -> tuple[BenchConfig, Path | None]:
    parser = argparse.ArgumentParser(prog="bench/bench.py", description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=models.DEFAULT_MODEL, help="model spec (default: %(default)s)")
    parser.add_argument("--drafts", default="ngram,layerskip:24", help="comma-separated (default: %(default)s)")
    parser.add_argument("--ks", default="2,4,8", help="comma-separated draft lengths (default: %(default)s)")
    parser.add_argument("--policies", default="heuristic,auto,confidence:0.4",
                        help="comma-separated draft-length policies timed from --policy-k against transformers' "
                             "adaptive schedules (fixed k is always timed; '' for none; default: %(default)s)")
    parser.add_argument("--policy-k", type=int, default=4, help="the k the policies start from (default: 4)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--prompts-per-category", type=int, default=1)
    parser.add_argument("--batch", type=int, default=4,
                        help="sequences decoded together in the batched comparison (default: %(default)s)")
    parser.add_argument("--verify-repeats", type=int, default=9)
    parser.add_argument("--verify-context", type=int, default=200)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: OMP_NUM_THREADS, else every core); the verify curve is "
                             "also timed at 1")
    parser.add_argument("--kernels", default=SKINNY,
                        help="our engine's linears on CPU: skinny or stock (default: %(default)s); transformers' "
                             "generate and the stock verify curve always run stock")
    parser.add_argument("--db", type=Path, default=Path("runs.duckdb"))
    parser.add_argument("--report", type=Path, default=None, help="also write the results as Markdown here")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 1 prompt, k=2, 1 repeat, 8 new tokens, 3 verify repeats")
    args = parser.parse_args(argv)
    try:
        ks = tuple(int(k) for k in args.ks.split(","))
        drafts = tuple(parse_draft(d) for d in args.drafts.split(","))
        policies = tuple(parse_policy(p) for p in args.policies.split(",") if p)
        parse_kernels(args.kernels)
    except ValueError as error:
        raise UsageError(f"--ks, --drafts, --policies or --kernels: {error}") from None
    if FIXED in policies:
        raise UsageError("--policies: fixed k is always measured; name the other policies only")
    per_category, repeats, n, verify = args.prompts_per_category, args.repeats, args.max_new_tokens, args.verify_repeats
    policy_k = args.policy_k
    if args.quick:
        ks, policy_k, per_category, repeats, n, verify = (2,), 2, 1, 1, 8, 3
    warm = max(ks) + 2  # the prefill's token and one full round at the largest k: every verify width is warm
    if (min(ks + (policy_k,)) < 1 or repeats < 1 or n < 1 or verify < 1
            or (args.threads is not None and args.threads < 1) or args.batch < 1):
        raise UsageError("k, --policy-k, --repeats, --max-new-tokens, --verify-repeats, --threads and --batch must "
                         "be >= 1")
    if any(d.kind == "baseline" for d in drafts):
        raise UsageError("--drafts: plain decoding is always measured; name drafts only")
    prompts = tuple(select_prompts(load_prompts(), None, per_category))
    if args.quick:
        prompts = prompts[:1]
    command = " ".join(["python bench/bench.py", *map(shlex.quote, argv)])
    return BenchConfig(
        target=args.target, drafts=tuple(d.text for d in drafts), ks=ks, policies=tuple(p.text for p in policies),
        policy_k=policy_k, prompts=prompts, max_new_tokens=n,
        repeats=repeats, verify_repeats=verify, verify_context=args.verify_context, warmup_tokens=warm, db=args.db,
        device=args.device, dtype=args.dtype, threads=all_cores() if args.threads is None else args.threads,
        kernels=args.kernels, command=command, batch=args.batch,
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
