"""The migrations of runs.duckdb, in order: how a file of an older specdash reaches the schema of `schema_now.py`.

A new file is made from schema_now.py directly; these run on the files that already exist, each in its own transaction,
recorded in `schema_migrations` under its number (its place in MIGRATIONS, from 1) and its function's name
(schema.py). Append new migrations; never edit one that has shipped.

A migration's tables are its own SQL, as they were when it shipped: later migrations change them. A macro or a view is
re-created whole whenever it changes, so a migration that makes one takes today's SQL (schema_now.py's, and run_stats'
rows from `run_facts.RUN_STATS_SELECT`), and the newest wins: a change to a view needs a new migration that re-creates
it, and serves the migrations before it as well (`RUN_STATS_SELECT`: migrations 8, 11, 19). run_facts holds run_stats'
rows worked out as runs are written: a change to `RUN_STATS_SELECT` needs a migration that works the table out again.
"""

from __future__ import annotations

from collections.abc import Callable

import duckdb

from runner.records import tree_depth
from runner.store import run_facts, schema_now
from runner.store.round_counts import FILL_RUN_TOTALS


def create_runs_and_rounds(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("""CREATE TABLE runs (
        run_id TEXT PRIMARY KEY, sweep_id TEXT NOT NULL, started_at TIMESTAMP, target TEXT,
        draft TEXT, draft_kind TEXT, category TEXT, prompt_id TEXT, prompt_text TEXT, k INTEGER,
        mode TEXT, temperature DOUBLE, top_p DOUBLE, seed BIGINT, max_new_tokens INTEGER,
        device TEXT, dtype TEXT, new_tokens INTEGER, n_rounds INTEGER, target_passes INTEGER,
        draft_calls INTEGER, wall_s DOUBLE, prefill_s DOUBLE, draft_s DOUBLE, verify_s DOUBLE,
        prompt_tokens INTEGER[], output_tokens INTEGER[], output_text TEXT, stop_reason TEXT,
        baseline_run_id TEXT, lossless BOOLEAN, status TEXT, error TEXT, torch_version TEXT,
        transformers_version TEXT, python_version TEXT, host TEXT, git_commit TEXT)""")
    con.execute("""CREATE TABLE rounds (
        run_id TEXT, round INTEGER, k INTEGER, accepted INTEGER, rejected INTEGER,
        thrown INTEGER, bonus BOOLEAN, emitted INTEGER, draft_s DOUBLE, verify_s DOUBLE,
        draft_tokens INTEGER[], target_tokens INTEGER[], PRIMARY KEY (run_id, round))""")


def create_run_stats(con: duckdb.DuckDBPyConnection) -> None:
    """Superseded: the view it made is defined by `define_metrics`, which every file reaches, so no file keeps it."""


def add_device_name(con: duckdb.DuckDBPyConnection) -> None:
    # "cuda" alone does not say which GPU; throughput comparisons need the model of the chip.
    con.execute("ALTER TABLE runs ADD COLUMN device_name TEXT")


# bench_results before and after its key gained k_policy (`add_bench_k_policy`).
_BENCH_RESULTS = """CREATE TABLE bench_results (
        bench_id TEXT NOT NULL, started_at TIMESTAMP, device TEXT, device_name TEXT, dtype TEXT, threads INTEGER,
        target TEXT, draft TEXT NOT NULL, k INTEGER NOT NULL, category TEXT NOT NULL, metric TEXT NOT NULL, unit TEXT,
        ours DOUBLE, ours_min DOUBLE, ours_max DOUBLE, theirs DOUBLE, theirs_min DOUBLE, theirs_max DOUBLE,
        ratio DOUBLE, ratio_min DOUBLE, ratio_max DOUBLE, repeats INTEGER, prompts INTEGER,
        max_new_tokens INTEGER, mismatches INTEGER, alpha DOUBLE, c DOUBLE, goal TEXT, goal_met BOOLEAN,
        load_before DOUBLE, load_after DOUBLE, command TEXT, torch_version TEXT, transformers_version TEXT,
        host TEXT, git_commit TEXT{more}, PRIMARY KEY (bench_id, metric, draft, k, category{key}))"""


def create_bench_results(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(_BENCH_RESULTS.format(more="", key=""))


def create_run_totals(con: duckdb.DuckDBPyConnection) -> None:
    # Per-run sums of the rounds, so run_stats need not aggregate every round on every query.
    con.execute("""CREATE TABLE run_totals (
        run_id TEXT PRIMARY KEY, accepted INTEGER, rejected INTEGER, thrown INTEGER, drafted INTEGER,
        emitted INTEGER)""")
    con.execute(FILL_RUN_TOTALS)


def add_divergence(con: duckdb.DuckDBPyConnection) -> None:
    # A greedy mismatch is either a numeric tie (two logits within rounding of each other swapped between passes
    # of different widths) or a real divergence: where it happened and how close the target's choice was.
    for column, kind in (("divergence_at", "INTEGER"), ("divergence_gap", "DOUBLE"),
                         ("divergence_tolerance", "DOUBLE"), ("divergence", "TEXT")):
        con.execute(f"ALTER TABLE runs ADD COLUMN {column} {kind}")


def add_kernels_and_threads(con: duckdb.DuckDBPyConnection) -> None:
    # The linears' path and the CPU thread count change a run's speed, so a run says which it had.
    # Every run recorded before ran torch's stock F.linear; their thread count is unknown (NULL).
    con.execute("ALTER TABLE runs ADD COLUMN kernels TEXT")
    con.execute("ALTER TABLE runs ADD COLUMN threads INTEGER")
    con.execute("UPDATE runs SET kernels = 'stock'")
    # A bench's own engine too: its plain and speculative rows ran on these kernels (transformers' on stock).
    con.execute("ALTER TABLE bench_results ADD COLUMN kernels TEXT")
    con.execute("UPDATE bench_results SET kernels = 'stock'")


# run_stats as a view over runs, before its rows became the table run_facts (`add_pass_rows`); `more`: the columns
# after the runs' own that it had then.
_RUN_STATS_OVER_RUNS = "CREATE OR REPLACE VIEW run_stats AS" + run_facts.RUN_STATS_SELECT


def define_metrics(con: duckdb.DuckDBPyConnection) -> None:
    for macro in schema_now.MACROS:
        con.execute(macro)
    con.execute(_RUN_STATS_OVER_RUNS.format(more=""))


def create_trainings(con: duckdb.DuckDBPyConnection) -> None:
    # `runner train-draft`: one row per training of a draft head, its epochs (0: the untrained head) and the
    # held-out acceptance of each epoch at each draft position, as counts so that rates pool exactly.
    con.execute("""CREATE TABLE trainings (
        train_id TEXT PRIMARY KEY, started_at TIMESTAMP, finished_at TIMESTAMP, status TEXT, error TEXT,
        target TEXT, draft TEXT, out_dir TEXT, prompts_file TEXT, train_prompts INTEGER, heldout_prompts INTEGER,
        train_tokens INTEGER, heldout_tokens INTEGER, max_new_tokens INTEGER, epochs INTEGER, draft_vocab INTEGER,
        vocab_coverage DOUBLE, layers INTEGER[], unroll INTEGER, lr DOUBLE, seed BIGINT, saved_epoch INTEGER,
        head_bytes BIGINT, data_cached BOOLEAN, data_s DOUBLE, train_s DOUBLE, wall_s DOUBLE, cpu_s DOUBLE,
        threads INTEGER, load_before DOUBLE, load_after DOUBLE, device TEXT, dtype TEXT, command TEXT,
        torch_version TEXT, transformers_version TEXT, python_version TEXT, host TEXT, git_commit TEXT)""")
    con.execute("""CREATE TABLE training_epochs (
        train_id TEXT, epoch INTEGER, train_loss DOUBLE, heldout_loss DOUBLE, seconds DOUBLE, lr DOUBLE,
        PRIMARY KEY (train_id, epoch))""")
    con.execute("""CREATE TABLE training_positions (
        train_id TEXT, epoch INTEGER, position INTEGER, judged BIGINT, accepted BIGINT,
        PRIMARY KEY (train_id, epoch, position))""")


def add_concurrent_workers(con: duckdb.DuckDBPyConnection) -> None:
    # Workers that share a machine share its memory bandwidth, so their timings can differ from a process alone.
    # Every run recorded before this column was recorded by one process alone.
    con.execute("ALTER TABLE runs ADD COLUMN concurrent_workers INTEGER")
    con.execute("UPDATE runs SET concurrent_workers = 1")


def add_k_policy(con: duckdb.DuckDBPyConnection) -> None:
    # How each round's k was chosen (runner/engine/round/policies.py); every run before policies drafted a fixed k.
    con.execute("ALTER TABLE runs ADD COLUMN k_policy TEXT")
    con.execute("UPDATE runs SET k_policy = 'fixed' WHERE draft <> 'none'")
    con.execute(_RUN_STATS_OVER_RUNS.format(more=", k_policy"))


# `outcomes` of position_stats from the rounds themselves, before `round_counts` (depth: `k` before rounds had a
# depth of their own).
_OUTCOMES_OF_ROUNDS = """SELECT run_id, {depth} AS depth, accepted AS a, rejected AS r, count(*) AS n FROM rounds
    WHERE k > 0 GROUP BY ALL"""


def create_position_stats(con: duckdb.DuckDBPyConnection) -> None:
    outcomes = _OUTCOMES_OF_ROUNDS.format(depth="k")  # every round was a chain then
    con.execute(schema_now.POSITION_STATS.format(outcomes=outcomes))


def add_bench_k_policy(con: duckdb.DuckDBPyConnection) -> None:
    # A bench also times our draft-length policies against transformers' adaptive schedules, so a row says which
    # policy ours ran (part of the key: the same draft and start k under two policies are two rows). Every row
    # before drafted a fixed k. The key changes, so the table is rebuilt, in its printed order.
    con.execute("ALTER TABLE bench_results RENAME TO bench_results_old")
    con.execute(_BENCH_RESULTS.format(more=", kernels TEXT, k_policy TEXT NOT NULL", key=", k_policy"))
    con.execute("INSERT INTO bench_results BY NAME "
                "SELECT *, 'fixed' AS k_policy FROM bench_results_old ORDER BY rowid")
    con.execute("DROP TABLE bench_results_old")


def add_tree_columns(con: duckdb.DuckDBPyConnection) -> None:
    # A tree draft's shape and the branch the target accepted (docs/drafters.md, "Tree drafts"); every round
    # recorded before drafted a chain, for which both stay NULL.
    con.execute("ALTER TABLE rounds ADD COLUMN draft_parents INTEGER[]")
    con.execute("ALTER TABLE rounds ADD COLUMN accepted_path INTEGER[]")


def add_depth(con: duckdb.DuckDBPyConnection) -> None:
    # How deep each round drafted, which `position_stats` spreads it over: k for a chain (every round before trees),
    # the longest branch for a tree (`Round.depth`).
    con.execute("ALTER TABLE rounds ADD COLUMN depth INTEGER")
    con.execute("UPDATE rounds SET depth = k WHERE draft_parents IS NULL")
    trees = con.execute("SELECT rowid, draft_parents FROM rounds WHERE draft_parents IS NOT NULL").fetchall()
    for rowid, parents in trees:
        con.execute("UPDATE rounds SET depth = ? WHERE rowid = ?", [tree_depth(parents), rowid])
    con.execute(schema_now.POSITION_STATS.format(outcomes=_OUTCOMES_OF_ROUNDS.format(depth="depth")))


def add_turns(con: duckdb.DuckDBPyConnection) -> None:
    # A multi-turn question is one run per turn: which, and the question they share; every run before was one turn.
    con.execute("ALTER TABLE runs ADD COLUMN turn INTEGER")
    con.execute("ALTER TABLE runs ADD COLUMN conversation TEXT")
    con.execute("UPDATE runs SET turn = 1, conversation = prompt_id")
    con.execute(schema_now.CONTEXT_STATS)  # acceptance by the round's place in the text, which a later turn extends


def add_training_categories(con: duckdb.DuckDBPyConnection) -> None:
    # A training scores its held-out prompts per category as well as pooled, so a head that learns only some kinds
    # of text shows it while it trains. The pooled rows are category 'all' (a name data files may not use); every
    # row before this was pooled. The key changes, so the table is rebuilt.
    con.execute("ALTER TABLE training_positions RENAME TO training_positions_old")
    con.execute("""CREATE TABLE training_positions (
        train_id TEXT, epoch INTEGER, position INTEGER, judged BIGINT, accepted BIGINT,
        category TEXT NOT NULL DEFAULT 'all', PRIMARY KEY (train_id, epoch, category, position))""")
    con.execute("INSERT INTO training_positions BY NAME SELECT *, 'all' AS category FROM training_positions_old")
    con.execute("DROP TABLE training_positions_old")
    # A training interrupted after an epoch continues from it when its command is run again; the row says after
    # which epoch it last did. Every training before this ran straight through (NULL).
    con.execute("ALTER TABLE trainings ADD COLUMN resumed_epoch INTEGER")


def add_sampling_test(con: duckdb.DuckDBPyConnection) -> None:
    # Sampled rounds: the min(1, p/q) test of every judged draft (p(x), q(x), the uniform draw), and whether the
    # round's own token came from the residual; NULL for greedy rounds and for rounds recorded before.
    for column, kind in (("draft_p", "DOUBLE[]"), ("draft_q", "DOUBLE[]"), ("draft_u", "DOUBLE[]"),
                         ("from_residual", "BOOLEAN")):
        con.execute(f"ALTER TABLE rounds ADD COLUMN {column} {kind}")


def add_batches(con: duckdb.DuckDBPyConnection) -> None:
    # Runs decoded together (runner/engine/batch.py): how many (1 for every run before), the batch they share and
    # each one's place in it; per round, the sequences still in its shared pass.
    con.execute("ALTER TABLE runs ADD COLUMN batch_size INTEGER DEFAULT 1")
    con.execute("ALTER TABLE runs ADD COLUMN batch_slot INTEGER DEFAULT 0")
    con.execute("ALTER TABLE runs ADD COLUMN batch_id TEXT")
    con.execute("ALTER TABLE rounds ADD COLUMN batch_seqs INTEGER DEFAULT 1")
    con.execute(_RUN_STATS_OVER_RUNS.format(more=", k_policy, batch_size"))  # a batch's size changes the pass itself
    con.execute(schema_now.BATCH_STATS)


def count_rounds(con: duckdb.DuckDBPyConnection) -> None:
    # Each run's rounds counted by outcome (round_counts.py), the counts backfilled, and position_stats read from them.
    con.execute("""CREATE TABLE round_counts (
        run_id TEXT NOT NULL, k INTEGER, depth INTEGER, accepted INTEGER, rejected INTEGER, tree BOOLEAN NOT NULL,
        rounds INTEGER NOT NULL, verify_s DOUBLE)""")
    con.execute("""INSERT INTO round_counts SELECT run_id, k, depth, accepted, rejected,
        draft_parents IS NOT NULL AS tree, count(*), sum(verify_s) FROM rounds GROUP BY ALL""")
    con.execute(schema_now.POSITION_STATS.format(outcomes=schema_now.OUTCOMES_COUNTED))


def create_run_facts(con: duckdb.DuckDBPyConnection) -> None:
    """Superseded: `add_pass_rows` makes run_facts as today's SQL reads it (with each pass's rows), in every file."""


def add_tree_nodes(con: duckdb.DuckDBPyConnection) -> None:
    # A tree's nodes per round at most: given as :nodes=N, or measured by its pair (runner/engine/tree_size.py). Runs
    # recorded before drafted their :nodes=N, else 15, the fixed default then; lookahead G guesses of N - 1 (7,5,7).
    con.execute("ALTER TABLE runs ADD COLUMN tree_nodes INTEGER")
    con.execute("""UPDATE runs SET tree_nodes = coalesce(TRY_CAST(regexp_extract(draft, ':nodes=([0-9]+)$', 1)
        AS INTEGER), 15) WHERE draft_kind IN ('ngram-tree', 'eagle-tree', 'hybrid', 'recycling', 'medusa-tree')""")
    con.execute("""UPDATE runs SET tree_nodes = CASE WHEN draft = 'lookahead' THEN 28 ELSE
        CAST(split_part(draft, ',', 3) AS INTEGER) * (CAST(split_part(draft, ',', 2) AS INTEGER) - 1) END
        WHERE draft_kind = 'lookahead'""")


def _work_out_run_facts(con: duckdb.DuckDBPyConnection, engines: bool = True) -> None:
    """run_facts made anew from every run, and run_stats as its view; `engines`: the runs have the engine's columns."""
    con.execute(f"CREATE TABLE run_facts AS {run_facts.facts_sql('run_id IS NOT NULL', engines)} ORDER BY s.run_id")
    con.execute(schema_now.RUN_STATS)


def add_pass_rows(con: duckdb.DuckDBPyConnection) -> None:
    """Each round's verify pass by its rows (`rounds.pass_rows`), which the verify curve reads: every drafter fed
    the root and its k drafts, k + 1 rows, but lookahead, whose window rows were not recorded (NULL: its rounds are
    read into no curve). `run_facts.widths` gains the rows, so its table is worked out again."""
    lookahead = "run_id IN (SELECT run_id FROM runs WHERE draft_kind = 'lookahead')"
    for table in ("rounds", "round_counts"):
        con.execute(f"ALTER TABLE {table} ADD COLUMN pass_rows INTEGER")
        con.execute(f"UPDATE {table} SET pass_rows = k + 1 WHERE NOT {lookahead}")
    con.execute("DROP VIEW run_stats")
    con.execute("DROP TABLE IF EXISTS run_facts")  # files made before kept it since migration 21
    _work_out_run_facts(con, engines=False)  # the runs have no engine columns yet


def add_learn_context(con: duckdb.DuckDBPyConnection) -> None:
    # `train-draft --learn-context`: the head also learned to predict the prompts' own tokens, not only the target's
    # answers. Every training before it learned the answers alone.
    con.execute("ALTER TABLE trainings ADD COLUMN learn_context BOOLEAN")
    con.execute("UPDATE trainings SET learn_context = false")


def add_engines(con: duckdb.DuckDBPyConnection) -> None:
    """`runs.engine` ('specdash' for every run before: our engine decoded them all), the engine's version, the exact
    speculative config it ran and its own report of the request's steps (vLLM), its time to first token; run_facts
    gains the engine's columns, so its table is worked out again. A vLLM round's tokens and times are not reported:
    those columns of `rounds` are NULL for its runs, and so are draft_s, verify_s and c of the run."""
    for column, kind in (("engine", "TEXT"), ("engine_version", "TEXT"), ("engine_config", "TEXT"),
                         ("engine_report", "TEXT"), ("ttft_s", "DOUBLE")):
        con.execute(f"ALTER TABLE runs ADD COLUMN {column} {kind}")
    con.execute("UPDATE runs SET engine = 'specdash'")
    con.execute("DROP VIEW run_stats")
    con.execute("DROP TABLE run_facts")
    _work_out_run_facts(con)


def add_repeat(con: duckdb.DuckDBPyConnection) -> None:
    # Which repetition of its cell a run is (`sweep --repeats N`): 0 for every run recorded before repeats.
    con.execute("ALTER TABLE runs ADD COLUMN repeat INTEGER DEFAULT 0")


def create_comparable_runs(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(schema_now.COMPARABLE_RUNS)


MIGRATIONS: list[Callable[[duckdb.DuckDBPyConnection], None]] = [
    create_runs_and_rounds,
    create_run_stats,
    add_device_name,
    create_bench_results,
    create_run_totals,
    add_divergence,
    add_kernels_and_threads,
    define_metrics,
    create_trainings,
    add_concurrent_workers,
    add_k_policy,
    create_position_stats,
    add_bench_k_policy,
    add_tree_columns,
    add_depth,
    add_turns,
    add_training_categories,
    add_sampling_test,
    add_batches,
    count_rounds,
    create_run_facts,
    add_tree_nodes,
    add_pass_rows,
    add_learn_context,
    add_engines,
    add_repeat,
    create_comparable_runs,
]
