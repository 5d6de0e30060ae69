"""`make bench` results: the `bench_results` rows, and what each metric measures (its unit, its goal and a
one-line description), shared by `bench/bench.py`, which prints and records them, and the dashboard's
Benchmark page."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pandas as pd

from runner.store.connect import open_for_write, read
from runner.store.schema import StoreError


@dataclass(frozen=True)
class Goal:
    """A bound on the median of one metric's rows, for some drafts, k and categories (None: all of them)."""

    metric: str
    value: str  # the value judged: 'ours' or 'ratio'
    op: str  # '>=' or '<='
    bound: float
    draft: str | None = None
    ks: tuple[int, ...] | None = None
    category: str | None = None
    one_thread: bool = False  # judged on a row timed at one thread, shown beside the bench's thread count


    @property
    def text(self) -> str:
        return f"{self.value} {self.op} {self.bound:g}"

    def applies(self, metric: str, draft: str, k: int | None, category: str) -> bool:
        return (metric == self.metric and self.draft in (None, draft) and (self.ks is None or k in self.ks)
                and self.category in (None, category))


def _by_rows(top: int) -> tuple[int, ...]:
    """The k (rows - 1) of the verify passes a bound on `top` rows covers: those above the previous bound."""
    bounds = (1, 5, 16, 32, 64)
    return tuple(range(bounds[bounds.index(top) - 1], top))


GOALS = (
    Goal("plain_tokens_per_s", "ratio", ">=", 1.10),
    Goal("batch_tokens_per_s", "ratio", ">=", 1.10, draft="none"),  # plain decoding at batch B, ours | theirs
    Goal("spec_tokens_per_s", "ratio", ">=", 1.30, draft="ngram", ks=(4,), category="summary"),
    Goal("spec_tokens_per_s", "ratio", ">=", 1.15, draft="ngram", ks=(4,), category="all"),
    # Ours under our best draft-length policy against transformers' adaptive schedule (prompt lookup: its best k).
    Goal("adaptive_tokens_per_s", "ratio", ">=", 1.15, category="all"),
    Goal("early_exit_tokens_per_s", "ratio", ">=", 1.15, category="all"),
    Goal("overhead_share", "ours", "<=", 0.05),
    Goal("record_share", "ours", "<=", 0.02),
    # The explainer's flat verify pass, on our kernels at the default thread count, by the rows of the pass (chain,
    # tree or batch; k = rows - 1): up to 5 rows, 16, 32 and 64; and at 16 rows on the row timed at one thread
    # beside them (where the bench itself runs one thread, the stricter bound above judges).
    Goal("verify_ms", "ratio", "<=", 1.10, ks=_by_rows(5)),
    Goal("verify_ms", "ratio", "<=", 1.35, ks=_by_rows(16)),
    Goal("verify_ms", "ratio", "<=", 1.8, ks=_by_rows(32)),
    Goal("verify_ms", "ratio", "<=", 3.0, ks=_by_rows(64)),
    Goal("verify_ms", "ratio", "<=", 1.5, ks=(15,), category="threads=1", one_thread=True),
    Goal("verify_vs_stock", "ratio", "<=", 1.0),  # never slower than stock, at any shape and width
    Goal("roofline", "ratio", ">=", 0.80),
    # bench/peers.py: against the engines a user would pick instead, and against the machine's limits
    Goal("vllm_tokens_per_s", "ratio", ">=", 1.10, draft="none"),
    Goal("hf_tokens_per_s", "ratio", ">=", 1.30, draft="none"),
    Goal("lookup_speedup_vllm", "ratio", ">=", 1.0),
    Goal("pass_bandwidth", "ratio", ">=", 0.70),
    Goal("pass_flops", "ratio", ">=", 0.70),
)


def goal_for(metric: str, draft: str, k: int | None, category: str, judged: bool = True) -> Goal | None:
    """The goal a row is held to: at the bench's thread count (`judged`) the first that applies; on a row shown
    beside it, only a one-thread goal."""
    return next((goal for goal in GOALS if goal.applies(metric, draft, k, category)
                 and (judged or goal.one_thread)), None)


UNITS = {"plain_tokens_per_s": "tokens/s", "spec_tokens_per_s": "tokens/s", "adaptive_tokens_per_s": "tokens/s",
         "early_exit_tokens_per_s": "tokens/s", "target_passes": "passes",
         "draft_passes": "passes", "overhead_share": "share",
         "loop_overhead_share": "share", "record_share": "share", "record_ms": "ms", "speedup": "x",
         "batch_tokens_per_s": "tokens/s",
         "verify_ms": "ms", "verify_ms_stock": "ms", "verify_vs_stock": "ms", "roofline": "GB/s",
         "roofline_stock": "GB/s", "vllm_tokens_per_s": "tokens/s", "hf_tokens_per_s": "tokens/s",
         "lookup_speedup_vllm": "x", "lookup_speedup_hf": "x", "head_speedup_vllm": "x", "accepted_vllm": "drafts",
         "pass_bandwidth": "GB/s", "pass_flops": "GFLOP/s", "prefill_ms_vllm": "ms", "decode_ms_vllm": "ms"}
ABOUT = {
    "plain_tokens_per_s": "(a) plain decoding, tokens/s: ours | transformers generate(do_sample=False)",
    "spec_tokens_per_s": "(b) speculative decoding, tokens/s: ours | transformers assisted generation",
    "adaptive_tokens_per_s": "(e) adaptive draft length, tokens/s: ours under the policy, from k | transformers "
                             "assisted generation with num_assistant_tokens_schedule='heuristic' from k (prompt "
                             "lookup: its best fixed prompt_lookup_num_tokens of the bench's k)",
    "early_exit_tokens_per_s": "(e) adaptive draft length with a layer-skip draft, tokens/s: ours under the policy, "
                               "from k | transformers early exit (assistant_early_exit = the draft's layers), "
                               "heuristic schedule from k",
    "batch_tokens_per_s": "(f) B prompts decoded together, tokens/s of the batch (category batch=B): ours, plain or "
                          "with the draft | transformers' plain batched generate(do_sample=False) on the same prompts",
    "target_passes": "(a, b) the target's forward passes per run, prefill included: ours | transformers",
    "draft_passes": "(b) the draft model's forward passes per run: ours | transformers",
    "overhead_share": "(c) wall time outside the target's and the draft's forward passes: ours | transformers",
    "loop_overhead_share": "(c) ours: wall − prefill − Σdraft_s − Σverify_s (the round loop's own time), of wall",
    "record_share": "(c) ours: store.write_run of the run's RunRecord into a DuckDB file, of the run's wall time",
    "record_ms": "(c) ours: the same recording, milliseconds per run",
    "speedup": "(d) ours over our plain decoding: measured | the formula at the run's α and c",
    "verify_ms": "verify curve, skinny kernels: one target pass over k+1 rows at the context length (draft: a chain, "
                 "a tree under its mask, or a batch of sequences of 5 rows) | the same path's one-token pass, per "
                 "thread count",
    "verify_ms_stock": "verify curve, stock F.linear: the same passes | stock's one-token pass",
    "verify_vs_stock": "verify curve, skinny kernels | stock F.linear, the same pass at the same thread count",
    "roofline": "roofline, skinny kernels: weight bytes read by a one-token pass / its time | the memory bandwidth "
                "of a STREAM-style copy (bytes read + written / time) at the same thread count, same run",
    "roofline_stock": "roofline, stock F.linear: the same, on torch's own linears",
    "vllm_tokens_per_s": "(peers) tokens/s, the mean over prompts per repeat: ours | vLLM's CPU engine, plain (draft "
                         "none), prompt lookup (ngram, k 4) and the shipped EAGLE-3 head (k 4)",
    "hf_tokens_per_s": "(peers) tokens/s: ours | transformers' generate, plain and prompt_lookup_num_tokens=4",
    "lookup_speedup_vllm": "(peers) prompt lookup's tokens/s over the same engine's plain decoding: ours | vLLM's",
    "lookup_speedup_hf": "(peers) prompt lookup's tokens/s over plain decoding: ours | transformers'",
    "head_speedup_vllm": "(peers) the shipped EAGLE-3 head's tokens/s over the same engine's plain decoding: ours | "
                         "vLLM's",
    "accepted_vllm": "(peers) drafts accepted per request, the mean over prompts per repeat: ours | vLLM's (its own "
                     "per-step report); where they agree, the speedups differ by what a step with drafts costs",
    "pass_bandwidth": "(peers) our one-token pass: weight bytes read / its time | a large copy's bytes/s, same run",
    "pass_flops": "(peers) our 64-row pass: the linears' FLOP / its time | a large matrix product's FLOP/s, same run",
    "prefill_ms_vllm": "(peers) plain decoding's first token, the prompt's pass: ours | vLLM's (its own clock, "
                       "scheduled to first token), the mean over prompts per repeat",
    "decode_ms_vllm": "(peers) plain decoding's time per token after the first: ours | vLLM's (its own clock), the "
                      "mean over prompts per repeat",
}

# What each metric's `ours` and `theirs` are, as the Benchmark page heads their columns (None: no `theirs`).
COLUMNS = {
    "plain_tokens_per_s": ("ours", "transformers"),
    "spec_tokens_per_s": ("ours", "transformers assisted"),
    "adaptive_tokens_per_s": ("ours, policy", "transformers heuristic"),
    "early_exit_tokens_per_s": ("ours, policy", "transformers early exit"),
    "batch_tokens_per_s": ("ours", "transformers batched"),
    "target_passes": ("ours", "transformers"),
    "draft_passes": ("ours", "transformers"),
    "overhead_share": ("ours", "transformers"),
    "loop_overhead_share": ("ours", None),
    "record_share": ("ours", None),
    "record_ms": ("ours", None),
    "speedup": ("measured", "formula"),
    "verify_ms": ("pass", "one-token pass"),
    "verify_ms_stock": ("pass", "one-token pass"),
    "verify_vs_stock": ("skinny", "stock"),
    "roofline": ("weights read", "copy"),
    "roofline_stock": ("weights read", "copy"),
    "vllm_tokens_per_s": ("ours", "vLLM"),
    "hf_tokens_per_s": ("ours", "transformers"),
    "lookup_speedup_vllm": ("ours", "vLLM"),
    "lookup_speedup_hf": ("ours", "transformers"),
    "head_speedup_vllm": ("ours", "vLLM"),
    "accepted_vllm": ("ours", "vLLM"),
    "pass_bandwidth": ("one-token pass", "copy"),
    "pass_flops": ("64-row pass", "product"),
    "prefill_ms_vllm": ("ours", "vLLM"),
    "decode_ms_vllm": ("ours", "vLLM"),
}

BENCH_COLUMNS = (
    "bench_id", "started_at", "device", "device_name", "dtype", "threads", "target", "draft", "k", "k_policy",
    "category", "metric",
    "unit",
    "ours", "ours_min", "ours_max", "theirs", "theirs_min", "theirs_max", "ratio", "ratio_min", "ratio_max",
    "repeats", "prompts", "max_new_tokens", "mismatches", "alpha", "c", "goal", "goal_met", "load_before",
    "load_after", "command", "torch_version", "transformers_version", "host", "git_commit", "kernels",
)
_INSERT_BENCH = (f"INSERT INTO bench_results ({', '.join(BENCH_COLUMNS)}) "
                 f"VALUES ({', '.join('?' * len(BENCH_COLUMNS))})")


def write_bench(db_path: str | os.PathLike, rows: list[dict], lock_timeout_s: float = 30.0) -> None:
    """Record one `make bench` table (each dict holds every BENCH_COLUMNS key) in one transaction."""
    path = Path(db_path)
    con, _ = open_for_write(path, lock_timeout_s)
    try:
        con.begin()
        try:
            con.executemany(_INSERT_BENCH, [[row[c] for c in BENCH_COLUMNS] for row in rows])
            con.commit()
        except duckdb.Error as error:
            con.rollback()
            raise StoreError(f"could not record the bench: {str(error).splitlines()[0]}") from None
    finally:
        con.close()


def bench_results(db_path: str | os.PathLike, bench_id: str, lock_timeout_s: float = 30.0) -> pd.DataFrame:
    """The rows of one bench, in the order they were printed (metric, draft, k, k_policy, category as written)."""
    rows = read(Path(db_path), f"SELECT {', '.join(BENCH_COLUMNS)} FROM bench_results WHERE bench_id = ? "
                                "ORDER BY rowid", [bench_id], lock_timeout_s)
    return pd.DataFrame(rows, columns=list(BENCH_COLUMNS))
