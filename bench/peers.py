"""`make bench`'s comparison with the peers a user would pick instead: our engine against vLLM's CPU engine and
transformers' own `generate`, plain decoding, prompt lookup and the shipped head at k = 4, side by side in one run, and
each pass's fraction of the machine's limits.

The same prompt ids (first turns of prompts the project never trained on), the same thread count, greedy, float32, the
same new-token budget. Per repeat every prompt runs on every engine, the engines taking turns in an order that turns
round each time, after one warm-up generation each. Prompt lookup: ours `ngram:3:earliest` at k = 4 (vLLM's match rule:
the longest n-gram of 3 down to 1 ending the text, at its earliest occurrence), vLLM's `ngram` method with 4 speculative
tokens and n-grams of 3 down to 1, transformers' `prompt_lookup_num_tokens=4` with `max_matching_ngram_size=3`. The
shipped EAGLE-3 head at k = 4 in ours and in vLLM (`eagle3`, given the head with its layer ids in vLLM's convention:
runner/vllm/head_ids.py); transformers has no EAGLE. vLLM runs from its own environment as sweeps run it
(runner/vllm/process.py), one process per mode, its engine in that process (idle between requests), compiled as a
deployment runs it.

Rows (`bench_results`, per repeat the mean over prompts of tokens/s, as Spec-Bench's speed.py does): vllm_tokens_per_s
and hf_tokens_per_s (ours | theirs, draft none, ngram and, against vLLM, the head at k 4), lookup_speedup_vllm,
lookup_speedup_hf and head_speedup_vllm (the draft over plain decoding: ours | theirs), accepted_vllm (drafts accepted
per request, prompt lookup and the head: ours | vLLM's own per-step report), prefill_ms_vllm and
decode_ms_vllm (plain decoding's request split where the time goes: the prompt's pass, then each later token; ours |
vLLM's, each by its own clock), pass_bandwidth (a one-token pass's weight bytes per second | a large copy's) and
pass_flops (a 64-row pass's FLOP/s | a large product's).

`python bench/peers.py [--prompts 4] [--max-new-tokens 64] [--repeats 3] [--db runs.duckdb] [--report FILE]`
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `python bench/peers.py` puts bench/, not the repository, on the path

import torch  # noqa: E402

from bench.limits import ONE, WIDE, Passes, interleaved, limits_from, linear_flops, machine_jobs  # noqa: E402
from bench.passes import weight_bytes  # noqa: E402
from bench.rows import Row, db_rows  # noqa: E402
from bench.tables import table  # noqa: E402
from runner.engine.drafters.registry import parse_draft  # noqa: E402
from runner.engine.drafters.spec import PLAIN  # noqa: E402
from runner.engine.pair import Pair  # noqa: E402
from runner.engine.round import lossless  # noqa: E402
from runner.engine.round.decoding_rule import Decoding  # noqa: E402
from runner.engine.weights import models  # noqa: E402
from runner.engine.weights.kernels import SKINNY, all_cores  # noqa: E402
from runner.pair_engine import provenance  # noqa: E402
from runner.prompts import PromptError, load_prompts  # noqa: E402
from runner.store.bench_rows import write_bench  # noqa: E402
from runner.store.connect import init_db  # noqa: E402
from runner.store.schema import StoreError  # noqa: E402
from runner.vllm.client import reply_of  # noqa: E402
from runner.vllm.drafts import parse as parse_vllm  # noqa: E402
from runner.vllm.drafts import speculative_config  # noqa: E402
from runner.vllm.engine import REQUEST_TIMEOUT_S  # noqa: E402
from runner.vllm.process import Settings, VllmProcess  # noqa: E402

GREEDY = Decoding("greedy", 0.0, 1.0)
K = 4
LOOKUP = parse_draft("ngram:3:earliest")
HEAD_DIR = ROOT / "heads" / "smollm2-135m"
HEAD = parse_draft(f"eagle:{HEAD_DIR}")
PROMPTS = ROOT / "tests" / "data" / "spec_bench_sample.jsonl"
PLAIN_MODE, LOOKUP_MODE, HEAD_MODE = "plain", "ngram", "eagle"
# What each engine runs: transformers has no EAGLE head.
MODES = {"ours": (PLAIN_MODE, LOOKUP_MODE, HEAD_MODE), "transformers": (PLAIN_MODE, LOOKUP_MODE),
         "vllm": (PLAIN_MODE, LOOKUP_MODE, HEAD_MODE)}
DRAFTS = {PLAIN_MODE: ("none", None), LOOKUP_MODE: ("ngram", K), HEAD_MODE: ("eagle:heads/smollm2-135m", K)}


class UsageError(ValueError):
    """Bad command-line input: one line, exit code 2."""


@dataclass(frozen=True)
class Sample:
    engine: str  # 'ours' | 'transformers' | 'vllm'
    mode: str  # PLAIN_MODE | LOOKUP_MODE | HEAD_MODE
    prompt: int  # index into the prompts
    repeat: int
    tokens: tuple[int, ...]
    seconds: float
    split: tuple[float, float] | None = None  # (first token, first token to last) in s, by the engine's own clock
    accepted: int | None = None  # drafts accepted over the request: ours from its rounds, vLLM's from its per-step
    # report (none drafted: 0); None for transformers, which reports none

    @property
    def rate(self) -> float:
        return len(self.tokens) / self.seconds


class Engines:
    """The three engines on one target: `run` decodes a prompt on one (a mode, new tokens) and gives its Sample."""

    def __init__(self, target: models.Loaded, vllm_python: Path | None, threads: int, max_len: int) -> None:
        # Ours first: its kernel table is timed as it loads, and vLLM's engines loading beside it would time every
        # threaded product at a multiple of its idle time (measured: a 576x576 product at 16 ms instead of 0.1 ms on
        # 2 threads), so the table would keep stock where another product is twice as fast.
        self.target, self.pair = target, Pair(target, [LOOKUP, HEAD], SKINNY)
        self.vllm: dict[str, VllmProcess] = {}
        if vllm_python is not None:
            settings = Settings(models._source(target.spec), threads, max_model_len=max_len, eager=False)
            # started together: their imports run side by side
            self.vllm = {mode: VllmProcess(settings, vllm_python) for mode in MODES["vllm"]}
            configs = {PLAIN_MODE: None, LOOKUP_MODE: speculative_config(parse_vllm("ngram:3"), K),
                       HEAD_MODE: speculative_config(parse_vllm(f"eagle:{HEAD_DIR}"), K)}  # as `--engine vllm` has them
            for mode, process in self.vllm.items():
                process.load(configs[mode])

    @property
    def names(self) -> list[str]:
        return ["ours", "transformers", *(["vllm"] if self.vllm else [])]

    def run(self, engine: str, mode: str, prompt: list[int], n: int, repeat: int = 0, index: int = 0) -> Sample:
        if engine == "vllm":  # the whole request, as ours is timed
            start = time.perf_counter()
            [answer] = self.vllm[mode].generate([prompt], n, [{"temperature": 0.0}], REQUEST_TIMEOUT_S)
            reply = reply_of(answer)
            return Sample(engine, mode, index, repeat, reply.output_ids, time.perf_counter() - start,
                          (reply.ttft_s, reply.generation_s), sum(reply.steps.accepted) if reply.steps else 0)
        if engine == "ours":
            spec, k = {PLAIN_MODE: (PLAIN, None), LOOKUP_MODE: (LOOKUP, K), HEAD_MODE: (HEAD, K)}[mode]
            generation = self.pair.run(spec, prompt, k, GREEDY, n, seed=0)
            split = (generation.prefill_s, generation.wall_s - generation.prefill_s)
            return Sample(engine, mode, index, repeat, generation.output_tokens, generation.wall_s, split,
                          sum(r.accepted for r in generation.rounds))
        options = {} if mode == PLAIN_MODE else {"prompt_lookup_num_tokens": K, "max_matching_ngram_size": 3}
        ids = torch.tensor([prompt])
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.target.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                             max_new_tokens=n, **options)
        return Sample(engine, mode, index, repeat, tuple(out[0, len(prompt):].tolist()), time.perf_counter() - start)

    def close(self) -> None:
        """Every vLLM process gone (and whatever they started) before the passes are timed."""
        for process in self.vllm.values():
            process.stop()


def measure(engines: Engines, prompts: list[list[int]], repeats: int, n: int) -> list[Sample]:
    """Every engine and mode on every prompt, per repeat, the turn order rotating each time; one warm-up each."""
    jobs = [(e, m) for e in engines.names for m in MODES[e]]
    for engine, mode in jobs:
        engines.run(engine, mode, prompts[0], K + 2)
    samples, turn = [], 0
    for repeat in range(repeats):
        for index, prompt in enumerate(prompts):
            for engine, mode in jobs[turn % len(jobs):] + jobs[: turn % len(jobs)]:
                sample = engines.run(engine, mode, prompt, n, repeat, index)
                samples.append(sample)
                print(f"peers: repeat {repeat} prompt {index} {engine} {mode}: {len(sample.tokens)} tokens in "
                      f"{sample.seconds:.2f} s", file=sys.stderr, flush=True)
            turn += 1
    return samples


def per_repeat(samples: list[Sample], engine: str, mode: str, value: Callable[[Sample], float]) -> list[float]:
    """Per repeat, the mean over prompts of `value`."""
    chosen = [s for s in samples if s.engine == engine and s.mode == mode]
    return [statistics.mean(value(s) for s in chosen if s.repeat == r) for r in sorted({s.repeat for s in chosen})]


def rates(samples: list[Sample], engine: str, mode: str) -> list[float]:
    """Per repeat, the mean over prompts of tokens/s."""
    return per_repeat(samples, engine, mode, lambda s: s.rate)


def split_rows(samples: list[Sample]) -> list[Row]:
    """Where plain decoding's request time goes, ours against vLLM's: the first token (the prompt's pass), then the
    time per later token. A request of one token has no later ones and is left out of the second."""
    def prefill_ms(s: Sample) -> float:
        return s.split[0] * 1000

    def decode_ms(s: Sample) -> float:
        return s.split[1] * 1000 / (len(s.tokens) - 1)

    if not any(s.engine == "vllm" for s in samples):
        return []
    rows = [Row("prefill_ms_vllm", "none", None, "all", *(per_repeat(samples, e, PLAIN_MODE, prefill_ms)
                                                            for e in ("ours", "vllm")))]
    longer = [s for s in samples if len(s.tokens) > 1]
    if any(s.engine == "vllm" and s.mode == PLAIN_MODE for s in longer):
        rows.append(Row("decode_ms_vllm", "none", None, "all", *(per_repeat(longer, e, PLAIN_MODE, decode_ms)
                                                                   for e in ("ours", "vllm"))))
    return rows


def accepted_rows(samples: list[Sample]) -> list[Row]:
    """Drafts accepted per request, ours against vLLM's, prompt lookup and the head: a speedup over plain decoding
    compares the drafts only where these agree; where they do, the speedups differ by what a step with drafts costs."""
    rows = []
    for mode in (LOOKUP_MODE, HEAD_MODE):
        if any(s.engine == "vllm" and s.mode == mode for s in samples):
            rows.append(Row("accepted_vllm", *DRAFTS[mode], "all",
                            *(per_repeat(samples, e, mode, lambda s: s.accepted) for e in ("ours", "vllm"))))
    return rows


def throughput_rows(samples: list[Sample], peers: list[str], mismatches: dict[str, int]) -> list[Row]:
    rows = []
    for peer in peers:
        name = "vllm" if peer == "vllm" else "hf"
        both = [m for m in MODES[peer] if any(s.engine == peer and s.mode == m for s in samples)]
        for mode in both:
            rows.append(Row(f"{name}_tokens_per_s", *DRAFTS[mode], "all", rates(samples, "ours", mode),
                            rates(samples, peer, mode),
                            mismatches=mismatches.get(f"ours/{mode}", 0) + mismatches.get(f"{peer}/{mode}", 0)))
        for mode, metric in ((LOOKUP_MODE, "lookup"), (HEAD_MODE, "head")):
            if mode in both:
                speedup = [[a / b for a, b in zip(rates(samples, e, mode), rates(samples, e, PLAIN_MODE), strict=True)]
                           for e in ("ours", peer)]
                rows.append(Row(f"{metric}_speedup_{name}", *DRAFTS[mode], "all", *speedup))
    return rows


def mismatch_counts(target: models.Loaded, prompts: list[list[int]], samples: list[Sample]) -> tuple[dict, list]:
    """Per engine and mode, the outputs not equal to transformers' plain greedy output on the same prompt (numeric
    ties, `lossless.classify`, counted apart in the lines), and a line per difference."""
    reference = {s.prompt: s.tokens for s in samples if s.engine == "transformers" and s.mode == PLAIN_MODE}
    counts, lines = {}, []
    for s in samples:
        divergence = lossless.classify(target, tuple(prompts[s.prompt]), reference[s.prompt], s.tokens)
        key = f"{s.engine}/{s.mode}"
        counts[key] = counts.get(key, 0) + (divergence is not None and divergence.kind == "real")
        if divergence is not None:
            lines.append(f"{key} prompt {s.prompt} repeat {s.repeat}: differs at {divergence.at} ({divergence.kind}, "
                         f"gap {divergence.gap:.3g}, tolerance {divergence.tolerance:.3g})")
    return counts, lines


def limit_rows(target: models.Loaded, repeats: int, context: int) -> list[Row]:
    """The one-token pass's bytes/s against the copy's, the 64-row pass's FLOP/s against the product's, per repeat,
    on our engine's path (the compact forward on the skinny kernels where it applies), the four taking turns."""
    passes = Passes(target, context)
    path = "compact" if passes.switch.compact else "skinny"
    times = interleaved({ONE: lambda: passes.run(path, ONE), WIDE: lambda: passes.run(path, WIDE), **machine_jobs()},
                        repeats)
    limits = limits_from(times)
    read, flops = weight_bytes(target.model), linear_flops(target.model, WIDE)
    return [Row("pass_bandwidth", "none", 0, f"context={context}", [read / ms / 1e6 for ms in times[ONE]],
                limits.copy_gbs),
            Row("pass_flops", "none", WIDE - 1, f"context={context}", [flops / ms / 1e6 for ms in times[WIDE]],
                limits.product_gflops)]


def run_peers(args: argparse.Namespace, command: str) -> tuple[list[dict], list[str]]:
    """Measure, record in `bench_results`, and return the records and the difference lines."""
    started, load_before = datetime.now(UTC), os.getloadavg()[0]
    init_db(args.db)  # a bad --db fails before the model loads
    torch.set_num_threads(args.threads)
    target = models.load(args.target, "cpu", "float32")
    chosen = [p for p in load_prompts(args.prompts_file) if p.turn == 1][: args.prompts]
    prompts = [models.encode_chat(target, p.text) for p in chosen]
    max_len = max(map(len, prompts)) + args.max_new_tokens + 8
    print("peers: loading our engine (its kernel table) and vLLM's", file=sys.stderr, flush=True)
    engines = Engines(target, args.vllm_python, args.threads, max_len)
    try:
        samples = measure(engines, prompts, args.repeats, args.max_new_tokens)
    finally:
        engines.close()
    counts, lines = mismatch_counts(target, prompts, samples)
    rows = (throughput_rows(samples, engines.names[1:], counts) + accepted_rows(samples) + split_rows(samples)
            + limit_rows(target, args.pass_repeats, 200))
    prov = provenance(target.device)
    context = {"bench_id": started.strftime("%Y%m%d-%H%M%S-peers-") + uuid.uuid4().hex[:4], "started_at": started,
               "device": "cpu", "device_name": prov["device_name"], "dtype": "float32", "threads": args.threads,
               "kernels": engines.pair.kernels, "target": args.target, "prompts": len(prompts),
               "max_new_tokens": args.max_new_tokens, "load_before": load_before, "load_after": os.getloadavg()[0],
               "command": command,
               **{k: prov.get(k) for k in ("torch_version", "transformers_version", "host", "git_commit")}}
    records = db_rows(rows, context)
    write_bench(args.db, records)
    return records, lines


def markdown(records: list[dict], lines: list[str], seconds: float) -> str:
    first = records[0]
    return "\n".join([
        "# make bench: our engine, vLLM and transformers side by side", "",
        f"- command: `{first['command']}`", f"- bench_id: {first['bench_id']}; took {seconds:.0f} s",
        f"- machine: {first['device_name']}, {os.cpu_count()} cores, threads {first['threads']}, torch "
        f"{first['torch_version']}, transformers {first['transformers_version']}, commit {first['git_commit'][:10]}",
        f"- load average (1 min) before: {first['load_before']:.2f}, after: {first['load_after']:.2f}"
        + (" (under load: only the ratios, measured side by side, compare)" if first["load_before"] > 0.5 else ""),
        "", table(records), "Outputs against transformers' plain greedy output:", "",
        *([f"- {line}" for line in lines] or ["- every output equal"]),
        *([] if any(r["metric"].startswith("vllm") for r in records) else
          ["", "vLLM was left out (--vllm-python none): no environment of it here."]), ""])


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/peers.py", description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=models.DEFAULT_MODEL)
    parser.add_argument("--prompts-file", type=Path, default=PROMPTS)
    parser.add_argument("--prompts", type=int, default=4, help="first turns taken from the file (default: 4)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pass-repeats", type=int, default=9, help="timed passes for the limits' rows")
    parser.add_argument("--threads", type=int, default=None, help="every engine's (default: every core)")
    parser.add_argument("--vllm-python", type=Path, default=ROOT / ".venv-vllm" / "bin" / "python",
                        help="vLLM's environment (default: %(default)s); 'none' leaves vLLM out")
    parser.add_argument("--db", type=Path, default=Path("runs.duckdb"))
    parser.add_argument("--report", type=Path, default=None, help="also write the results as Markdown here")
    args = parser.parse_args(argv)
    if min(args.prompts, args.max_new_tokens, args.repeats, args.pass_repeats, args.threads or 1) < 1:
        raise UsageError("--prompts, --max-new-tokens, --repeats, --pass-repeats and --threads must be >= 1")
    if str(args.vllm_python) == "none":
        args.vllm_python = None
    elif not args.vllm_python.is_file():
        raise UsageError(f"no vLLM environment at {args.vllm_python} (make it, or pass --vllm-python none)")
    args.threads = args.threads or all_cores()
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    start = time.perf_counter()
    try:
        args = parse_args(argv)
        records, lines = run_peers(args, " ".join(["python bench/peers.py", *map(shlex.quote, argv)]))
    except (models.ModelError, PromptError, StoreError, UsageError) as error:
        print(f"peers: error: {error}", file=sys.stderr)
        return 2
    text = markdown(records, lines, time.perf_counter() - start)
    print(text)
    if args.report is not None:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(text)
    return 0


if __name__ == "__main__":
    # Terminated, it still stops vLLM's processes (Engines.close): they run in sessions of their own.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
