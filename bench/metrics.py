"""What each row of `bench_results` measures: its unit, its goal and a one-line description.

Shared by `bench/bench.py`, which prints and records the rows, and the dashboard's Benchmark page.
"""

# The goals on the medians: (metric, the value judged, comparison, bound).
GOALS = {"plain_tokens_per_s": ("ratio", ">=", 1.0), "spec_tokens_per_s": ("ratio", ">=", 1.15),
         "overhead_share": ("ours", "<=", 0.05), "record_share": ("ours", "<=", 0.02)}
UNITS = {"plain_tokens_per_s": "tokens/s", "spec_tokens_per_s": "tokens/s", "target_passes": "passes",
         "draft_passes": "passes", "overhead_share": "share",
         "loop_overhead_share": "share", "record_share": "share", "record_ms": "ms", "speedup": "x",
         "verify_ms": "ms"}
ABOUT = {
    "plain_tokens_per_s": "(a) plain decoding, tokens/s: ours | transformers generate(do_sample=False)",
    "spec_tokens_per_s": "(b) speculative decoding, tokens/s: ours | transformers assisted generation",
    "target_passes": "(a, b) the target's forward passes per run, prefill included: ours | transformers",
    "draft_passes": "(b) the draft model's forward passes per run: ours | transformers",
    "overhead_share": "(c) wall time outside the target's and the draft's forward passes: ours | transformers",
    "loop_overhead_share": "(c) ours: wall − prefill − Σdraft_s − Σverify_s (the round loop's own time), of wall",
    "record_share": "(c) ours: store.write_run of the run's RunRecord into a DuckDB file, of the run's wall time",
    "record_ms": "(c) ours: the same recording, milliseconds per run",
    "speedup": "(d) ours over our plain decoding: measured | the formula at the run's α and c",
    "verify_ms": "verify curve: one target pass over k+1 tokens at the context length | the same at k=0",
}
