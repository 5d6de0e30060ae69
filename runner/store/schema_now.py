"""The schema of runs.duckdb as it is now: every table, metric macro and view after the last migration.

A new, empty file is made from this in one step (`create`). A file of an older specdash reaches the same catalog
through `migrations.py`, and tests/store/test_schema_now.py holds the two to each other, so a change to the schema
is made twice: here, and as a new migration for the files that already exist. Each table's columns are in the order
the migrations added them, so that `SELECT *` reads alike from old and new files. `schema_migrations`, which both
paths record, is schema.py's. Column names are the public SQL contract (docs/reference.md says what each holds).
"""

from __future__ import annotations

import duckdb

from runner.store.comparable import comparable_runs_sql
from runner.store.metrics import Filters

# One generation of one prompt: what ran, what it produced and took, whether it was lossless, where and on what.
RUNS = """CREATE TABLE runs (
    run_id TEXT PRIMARY KEY, sweep_id TEXT NOT NULL, started_at TIMESTAMP, target TEXT, draft TEXT, draft_kind TEXT,
    category TEXT, prompt_id TEXT, prompt_text TEXT, k INTEGER, mode TEXT, temperature DOUBLE, top_p DOUBLE,
    seed BIGINT, max_new_tokens INTEGER, device TEXT, dtype TEXT, new_tokens INTEGER, n_rounds INTEGER,
    target_passes INTEGER, draft_calls INTEGER, wall_s DOUBLE, prefill_s DOUBLE, draft_s DOUBLE, verify_s DOUBLE,
    prompt_tokens INTEGER[], output_tokens INTEGER[], output_text TEXT, stop_reason TEXT, baseline_run_id TEXT,
    lossless BOOLEAN, status TEXT, error TEXT, torch_version TEXT, transformers_version TEXT, python_version TEXT,
    host TEXT, git_commit TEXT, device_name TEXT, divergence_at INTEGER, divergence_gap DOUBLE,
    divergence_tolerance DOUBLE, divergence TEXT, kernels TEXT, threads INTEGER, concurrent_workers INTEGER,
    k_policy TEXT, turn INTEGER, conversation TEXT, batch_size INTEGER DEFAULT 1, batch_slot INTEGER DEFAULT 0,
    batch_id TEXT, tree_nodes INTEGER, engine TEXT, engine_version TEXT, engine_config TEXT, engine_report TEXT,
    ttft_s DOUBLE, repeat INTEGER DEFAULT 0)"""

# One verification round of a run: what was drafted, what the target judged, and for a sampled round the test.
ROUNDS = """CREATE TABLE rounds (
    run_id TEXT, round INTEGER, k INTEGER, accepted INTEGER, rejected INTEGER, thrown INTEGER, bonus BOOLEAN,
    emitted INTEGER, draft_s DOUBLE, verify_s DOUBLE, draft_tokens INTEGER[], target_tokens INTEGER[],
    draft_parents INTEGER[], accepted_path INTEGER[], depth INTEGER, draft_p DOUBLE[], draft_q DOUBLE[],
    draft_u DOUBLE[], from_residual BOOLEAN, batch_seqs INTEGER DEFAULT 1, pass_rows INTEGER,
    PRIMARY KEY (run_id, round))"""

# A run's rounds summed (round_counts.py), written with them, so that run_facts need not read every round. A table
# of its own, so that the columns of rounds JOIN runs stay unambiguous.
RUN_TOTALS = """CREATE TABLE run_totals (
    run_id TEXT PRIMARY KEY, accepted INTEGER, rejected INTEGER, thrown INTEGER, drafted INTEGER, emitted INTEGER)"""

# A run's rounds counted by outcome (round_counts.py), written with them: a few rows per run that the pooled queries
# sum instead of every round. A chain at k has at most k + 1 outcomes (accepted 0..k), a baseline one.
ROUND_COUNTS = """CREATE TABLE round_counts (
    run_id TEXT NOT NULL, k INTEGER, depth INTEGER, accepted INTEGER, rejected INTEGER, tree BOOLEAN NOT NULL,
    rounds INTEGER NOT NULL, verify_s DOUBLE, pass_rows INTEGER)"""

# Every 'ok' run's row of run_stats, then its own times and what it pooled from round_counts, worked out as the run
# is written (run_facts.py, whose `facts_sql` gives these columns in this order).
RUN_FACTS = """CREATE TABLE run_facts (
    run_id TEXT, sweep_id TEXT, target TEXT, draft TEXT, draft_kind TEXT, category TEXT, prompt_id TEXT, k INTEGER,
    mode TEXT, temperature DOUBLE, top_p DOUBLE, seed BIGINT, device TEXT, dtype TEXT, new_tokens INTEGER,
    n_rounds INTEGER, accepted BIGINT, rejected BIGINT, thrown BIGINT, drafted BIGINT, alpha DOUBLE, tau DOUBLE,
    thrown_share DOUBLE, tokens_per_s DOUBLE, baseline_tokens_per_s DOUBLE, measured_speedup DOUBLE,
    target_pass_s DOUBLE, verify_pass_s DOUBLE, draft_token_s DOUBLE, c DOUBLE, theoretical_speedup DOUBLE,
    lossless BOOLEAN, divergence TEXT, kernels TEXT, threads INTEGER, k_policy TEXT, batch_size INTEGER, engine TEXT,
    engine_version TEXT, ttft_s DOUBLE, wall_s DOUBLE, prefill_s DOUBLE, draft_s DOUBLE, verify_s DOUBLE,
    drafting_rounds BIGINT, tree BOOLEAN,
    widths STRUCT(k INTEGER, "rows" INTEGER, rounds BIGINT, verify_s DOUBLE)[],
    outcomes STRUCT(depth INTEGER, accepted INTEGER, rejected INTEGER, rounds BIGINT)[])"""

# `make bench`: one row per printed line of its table, so the dashboard shows exactly what was printed.
# Values are medians over repeats with their min and max; ratio = ours / theirs, per repeat, then the median.
BENCH_RESULTS = """CREATE TABLE bench_results (
    bench_id TEXT NOT NULL, started_at TIMESTAMP, device TEXT, device_name TEXT, dtype TEXT, threads INTEGER,
    target TEXT, draft TEXT NOT NULL, k INTEGER NOT NULL, category TEXT NOT NULL, metric TEXT NOT NULL, unit TEXT,
    ours DOUBLE, ours_min DOUBLE, ours_max DOUBLE, theirs DOUBLE, theirs_min DOUBLE, theirs_max DOUBLE,
    ratio DOUBLE, ratio_min DOUBLE, ratio_max DOUBLE, repeats INTEGER, prompts INTEGER, max_new_tokens INTEGER,
    mismatches INTEGER, alpha DOUBLE, c DOUBLE, goal TEXT, goal_met BOOLEAN, load_before DOUBLE, load_after DOUBLE,
    command TEXT, torch_version TEXT, transformers_version TEXT, host TEXT, git_commit TEXT, kernels TEXT,
    k_policy TEXT NOT NULL, PRIMARY KEY (bench_id, metric, draft, k, category, k_policy))"""

# `runner train-draft`: one row per training of a draft head, its epochs (0: the untrained head) and the held-out
# acceptance of each epoch per category ('all': pooled) and draft position, as counts so that rates pool exactly.
TRAININGS = """CREATE TABLE trainings (
    train_id TEXT PRIMARY KEY, started_at TIMESTAMP, finished_at TIMESTAMP, status TEXT, error TEXT, target TEXT,
    draft TEXT, out_dir TEXT, prompts_file TEXT, train_prompts INTEGER, heldout_prompts INTEGER, train_tokens INTEGER,
    heldout_tokens INTEGER, max_new_tokens INTEGER, epochs INTEGER, draft_vocab INTEGER, vocab_coverage DOUBLE,
    layers INTEGER[], unroll INTEGER, lr DOUBLE, seed BIGINT, saved_epoch INTEGER, head_bytes BIGINT,
    data_cached BOOLEAN, data_s DOUBLE, train_s DOUBLE, wall_s DOUBLE, cpu_s DOUBLE, threads INTEGER,
    load_before DOUBLE, load_after DOUBLE, device TEXT, dtype TEXT, command TEXT, torch_version TEXT,
    transformers_version TEXT, python_version TEXT, host TEXT, git_commit TEXT, resumed_epoch INTEGER,
    learn_context BOOLEAN)"""
TRAINING_EPOCHS = """CREATE TABLE training_epochs (
    train_id TEXT, epoch INTEGER, train_loss DOUBLE, heldout_loss DOUBLE, seconds DOUBLE, lr DOUBLE,
    PRIMARY KEY (train_id, epoch))"""
TRAINING_POSITIONS = """CREATE TABLE training_positions (
    train_id TEXT, epoch INTEGER, position INTEGER, judged BIGINT, accepted BIGINT,
    category TEXT NOT NULL DEFAULT 'all', PRIMARY KEY (train_id, epoch, category, position))"""

TABLES = (RUNS, ROUNDS, RUN_TOTALS, ROUND_COUNTS, RUN_FACTS, BENCH_RESULTS, TRAININGS, TRAINING_EPOCHS,
          TRAINING_POSITIONS)

# The explainer's numbers, each defined once: as SQL macros stored in the file, so run_stats, the dashboard, the
# sweep's summary, the bench and users' own SQL all compute them the same way (docs/reference.md).
METRIC_MACROS = {
    "alpha(accepted, rejected)": "accepted / nullif(accepted + rejected, 0)",  # thrown drafts were never judged
    "tau(emitted, rounds)": "emitted / nullif(rounds, 0)",
    "thrown_share(thrown, drafted)": "thrown / nullif(drafted, 0)",
    # c: one drafted token's time over one one-token target pass
    "draft_cost(draft_token_s, target_pass_s)": "draft_token_s / nullif(target_pass_s, 0)",
    # Leviathan et al.: (1 - α^(k+1)) / ((1 - α)(1 + k·c)), and its limit (k+1) / (1 + k·c) at α = 1
    "formula_speedup(alpha, k, c)": "CASE WHEN alpha = 1 THEN (k + 1) / (1 + k * c) "
                                    "ELSE (1 - pow(alpha, k + 1)) / ((1 - alpha) * (1 + k * c)) END",
    # speedups are ratios, so runs and cells are pooled by the geometric mean
    "geomean(x)": "exp(avg(ln(x)))",
}
MACROS = tuple(f"CREATE OR REPLACE MACRO {signature} AS {body}" for signature, body in METRIC_MACROS.items())

# The views, each made by CREATE OR REPLACE: the migrations that re-create one run the same statement.

# One row per 'ok' run: run_facts without what it adds to run_stats' columns.
RUN_STATS = """CREATE OR REPLACE VIEW run_stats AS
    SELECT * EXCLUDE (wall_s, prefill_s, draft_s, verify_s, drafting_rounds, tree, widths, outcomes) FROM run_facts"""

# Per run and draft position i = 1..depth (a tree's level): how many rounds drafted a token there (`proposed`), how
# often a round reached it (drafts 1..i-1 accepted, so a d_i was judged) and how often a d_i was then accepted. A round
# of depth d with a accepted proposed 1..d, reached 1..a + rejected (a chain: min(a + 1, d); a tree reaches level
# a + 1 only when its last accepted node had children) and accepted 1..a. `outcomes` counts the rounds per (run,
# depth, accepted, rejected) before positions are spread out: a few rows per run, not one per round; they are spread
# per run and position alone, and the run's columns joined after (grouping by all of them cost twice the time).
# The outcomes are those of round_counts (`OUTCOMES_COUNTED`); files before it counted them from the rounds.
POSITION_STATS = """CREATE OR REPLACE VIEW position_stats AS
    WITH outcomes AS ({outcomes}),
    spread AS (
        SELECT o.run_id, p.position, sum(o.n)::BIGINT AS proposed,
               coalesce(sum(o.n) FILTER (p.position <= o.a + o.r), 0)::BIGINT AS reached,
               coalesce(sum(o.n) FILTER (p.position <= o.a), 0)::BIGINT AS accepted
        FROM outcomes o CROSS JOIN LATERAL range(1, o.depth + 1) p(position) GROUP BY ALL)
    SELECT r.run_id, r.sweep_id, r.target, r.draft, r.category, r.mode, r.k, r.k_policy, r.device, r.kernels,
           r.threads, s.position, s.proposed, s.reached, s.accepted, s.reached - s.accepted AS rejected,
           alpha(s.accepted, s.reached - s.accepted) AS rate
    FROM spread s JOIN runs r USING (run_id) WHERE r.status = 'ok'"""
OUTCOMES_COUNTED = """SELECT run_id, depth, accepted AS a, rejected AS r, sum(rounds) AS n FROM round_counts
    WHERE k > 0 GROUP BY ALL"""

# Per run and context bucket: the rounds that started with `context` tokens in the text (the prompt, which holds a
# later turn's earlier turns and answers, + the new tokens committed before the round: the prefill's and every
# earlier round's), in power-of-two buckets [context_from, context_to) after a first one of [0, 128).
CONTEXT_STATS = """CREATE OR REPLACE VIEW context_stats AS
    WITH placed AS (
        SELECT run_id, accepted, rejected, emitted, 1 + coalesce(sum(emitted) OVER (
                   PARTITION BY run_id ORDER BY round ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before
        FROM rounds),
    bucketed AS (
        SELECT r.run_id, r.sweep_id, r.target, r.draft, r.category, r.mode, r.k, r.k_policy, r.device, r.turn,
               len(r.prompt_tokens) + p.before AS context, p.accepted, p.rejected, p.emitted
        FROM placed p JOIN runs r USING (run_id) WHERE r.status = 'ok' AND r.draft <> 'none'),
    buckets AS (
        SELECT * EXCLUDE (context), CASE WHEN context < 128 THEN 0
                                         ELSE pow(2, floor(log2(context)))::BIGINT END AS context_from
        FROM bucketed)
    SELECT run_id, sweep_id, target, draft, category, mode, k, k_policy, device, turn, context_from,
           greatest(128, 2 * context_from) AS context_to, count(*) AS rounds, sum(accepted)::BIGINT AS accepted,
           sum(rejected)::BIGINT AS rejected, sum(emitted)::BIGINT AS emitted,
           alpha(sum(accepted), sum(rejected)) AS alpha, tau(sum(emitted), count(*)) AS tau
    FROM buckets GROUP BY ALL"""

# Per batch size: what a sweep's runs of one draft, k, policy and category gave, decoded B at a time. A batch is
# the runs of one `batch_id` (at batch 1, each run alone); its throughput is its new tokens over its slowest
# member's wall time, every member having started with the batch.
BATCH_STATS = """CREATE OR REPLACE VIEW batch_stats AS
    WITH batches AS (
        SELECT r.sweep_id, r.target, r.draft, r.draft_kind, r.k, r.k_policy, r.category, r.mode, r.temperature,
               r.top_p, r.device, r.dtype, r.kernels, r.threads, r.batch_size, coalesce(r.batch_id, r.run_id) AS batch,
               count(*) AS runs, sum(r.new_tokens) AS new_tokens, max(r.wall_s) AS wall_s,
               sum(s.measured_speedup) AS speedup_sum, count(s.measured_speedup) AS speedups,
               sum(s.tokens_per_s) AS tokens_per_s_sum, sum(s.accepted) AS accepted, sum(s.rejected) AS rejected
        FROM runs r JOIN run_stats s USING (run_id)
        GROUP BY ALL)
    SELECT sweep_id, target, draft, draft_kind, k, k_policy, category, mode, temperature, top_p, device, dtype,
           kernels, threads, batch_size, count(*) AS batches, sum(runs)::BIGINT AS runs,
           sum(speedup_sum) / nullif(sum(speedups), 0) AS measured_speedup,
           sum(tokens_per_s_sum) / sum(runs) AS tokens_per_s_per_seq,
           avg(new_tokens / nullif(wall_s, 0)) AS tokens_per_s_per_batch,
           alpha(sum(accepted), sum(rejected)) AS alpha
    FROM batches GROUP BY ALL"""


def _comparable_runs() -> str:
    """The runs the dashboard's numbers pool, so users' SQL can pool the same ones: `comparable_runs_sql` with nothing
    filtered, every baseline and every kept cell's run on a common prompt of its setup × category. The SQL page's
    placeholder reads it."""
    sql, params = comparable_runs_sql(Filters())
    assert not params  # a view holds no parameters: with no filter there are none
    return f"CREATE OR REPLACE VIEW comparable_runs AS {sql}"


COMPARABLE_RUNS = _comparable_runs()

VIEWS = (RUN_STATS, POSITION_STATS.format(outcomes=OUTCOMES_COUNTED), CONTEXT_STATS, BATCH_STATS, COMPARABLE_RUNS)


def create(con: duckdb.DuckDBPyConnection) -> None:
    """Every table, macro and view of a new, empty file, as they are now (the caller records the version)."""
    for statement in (*TABLES, *MACROS, *VIEWS):  # a view is bound when made: its tables and macros come first
        con.execute(statement)
