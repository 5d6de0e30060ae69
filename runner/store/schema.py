"""The schema of runs.duckdb: an ordered list of migrations, `schema_migrations` recording which ran, and the
version check that refuses foreign and newer files.

Append new migrations; never edit one that has shipped. A view's SQL is a template that several migrations may
create it from (`RUN_STATS`: 8, 11, 19), so a template's change reaches new files only: a change to a view needs a
new migration that re-creates it, and the template then serves the migrations before it as well (the newest wins).
`run_facts` holds run_stats' rows worked out from `RUN_STATS_SELECT` as runs are written: a change to that SQL
needs a migration that works the table out again.
Column names are the public SQL contract (docs/reference.md).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import duckdb

from runner.records import tree_depth
from runner.store.schema_batches import BATCH_STATS, batch_columns
from runner.store.schema_facts import RUN_STATS
from runner.store.schema_rounds import OUTCOMES_OF_ROUNDS, POSITION_STATS, add_pass_rows, count_rounds
from runner.store.schema_trainings import add_learn_context, add_training_categories, create_trainings
from runner.store.spec_bench import CONTEXT_STATS


def _create_runs_and_rounds(con: duckdb.DuckDBPyConnection) -> None:
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


def _create_run_stats(con: duckdb.DuckDBPyConnection) -> None:
    """Superseded: the view it made is defined by `_define_metrics`, which every file reaches, so no file keeps it."""


def _add_device_name(con: duckdb.DuckDBPyConnection) -> None:
    # "cuda" alone does not say which GPU; throughput comparisons need the model of the chip.
    con.execute("ALTER TABLE runs ADD COLUMN device_name TEXT")


# `make bench`: one row per printed line of its table, so the dashboard shows exactly what was printed.
# Values are medians over repeats with their min and max; ratio = ours / theirs, per repeat, then the median.
BENCH_RESULTS = """CREATE TABLE bench_results (
        bench_id TEXT NOT NULL, started_at TIMESTAMP, device TEXT, device_name TEXT, dtype TEXT, threads INTEGER,
        target TEXT, draft TEXT NOT NULL, k INTEGER NOT NULL, category TEXT NOT NULL, metric TEXT NOT NULL, unit TEXT,
        ours DOUBLE, ours_min DOUBLE, ours_max DOUBLE, theirs DOUBLE, theirs_min DOUBLE, theirs_max DOUBLE,
        ratio DOUBLE, ratio_min DOUBLE, ratio_max DOUBLE, repeats INTEGER, prompts INTEGER,
        max_new_tokens INTEGER, mismatches INTEGER, alpha DOUBLE, c DOUBLE, goal TEXT, goal_met BOOLEAN,
        load_before DOUBLE, load_after DOUBLE, command TEXT, torch_version TEXT, transformers_version TEXT,
        host TEXT, git_commit TEXT{more}, PRIMARY KEY (bench_id, metric, draft, k, category{key}))"""


def _create_bench_results(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(BENCH_RESULTS.format(more="", key=""))


# Every run's totals from its rounds: the backfill of migration 5 (and of bench/scale.py's synthetic file).
FILL_RUN_TOTALS = """INSERT INTO run_totals SELECT run_id, sum(accepted), sum(rejected), sum(thrown), sum(k),
    sum(emitted) FROM rounds GROUP BY run_id"""


def _create_run_totals(con: duckdb.DuckDBPyConnection) -> None:
    # Per-run sums of the rounds, written with the run, so run_stats need not aggregate every round on
    # every query (a cost that grows with the rounds). A table of its own, so that the columns of
    # rounds JOIN runs stay unambiguous.
    con.execute("""CREATE TABLE run_totals (
        run_id TEXT PRIMARY KEY, accepted INTEGER, rejected INTEGER, thrown INTEGER, drafted INTEGER,
        emitted INTEGER)""")
    con.execute(FILL_RUN_TOTALS)


def _add_divergence(con: duckdb.DuckDBPyConnection) -> None:
    # A greedy mismatch is either a numeric tie (two logits within rounding of each other swapped between passes
    # of different widths) or a real divergence: where it happened and how close the target's choice was.
    for column, kind in (("divergence_at", "INTEGER"), ("divergence_gap", "DOUBLE"),
                         ("divergence_tolerance", "DOUBLE"), ("divergence", "TEXT")):
        con.execute(f"ALTER TABLE runs ADD COLUMN {column} {kind}")


def _add_kernels_and_threads(con: duckdb.DuckDBPyConnection) -> None:
    # The linears' path and the CPU thread count change a run's speed, so a run says which it had.
    # Every run recorded before ran torch's stock F.linear; their thread count is unknown (NULL).
    con.execute("ALTER TABLE runs ADD COLUMN kernels TEXT")
    con.execute("ALTER TABLE runs ADD COLUMN threads INTEGER")
    con.execute("UPDATE runs SET kernels = 'stock'")
    # A bench's own engine too: its plain and speculative rows ran on these kernels (transformers' on stock).
    con.execute("ALTER TABLE bench_results ADD COLUMN kernels TEXT")
    con.execute("UPDATE bench_results SET kernels = 'stock'")


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


def _define_metrics(con: duckdb.DuckDBPyConnection) -> None:
    for signature, body in METRIC_MACROS.items():
        con.execute(f"CREATE OR REPLACE MACRO {signature} AS {body}")
    con.execute(RUN_STATS.format(more=""))


def _add_k_policy(con: duckdb.DuckDBPyConnection) -> None:
    # How each round's k was chosen (runner/engine/policies.py); every run before policies drafted a fixed k.
    con.execute("ALTER TABLE runs ADD COLUMN k_policy TEXT")
    con.execute("UPDATE runs SET k_policy = 'fixed' WHERE draft <> 'none'")
    con.execute(RUN_STATS.format(more=", k_policy"))


def _create_position_stats(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(POSITION_STATS.format(outcomes=OUTCOMES_OF_ROUNDS.format(depth="k")))  # every round was a chain then


def _add_concurrent_workers(con: duckdb.DuckDBPyConnection) -> None:
    # Workers that share a machine share its memory bandwidth, so their timings can differ from a process alone.
    # Every run recorded before this column was recorded by one process alone.
    con.execute("ALTER TABLE runs ADD COLUMN concurrent_workers INTEGER")
    con.execute("UPDATE runs SET concurrent_workers = 1")


def _add_bench_k_policy(con: duckdb.DuckDBPyConnection) -> None:
    # A bench also times our draft-length policies against transformers' adaptive schedules, so a row says which
    # policy ours ran (part of the key: the same draft and start k under two policies are two rows). Every row
    # before drafted a fixed k. The key changes, so the table is rebuilt, in its printed order.
    con.execute("ALTER TABLE bench_results RENAME TO bench_results_old")
    con.execute(BENCH_RESULTS.format(more=", kernels TEXT, k_policy TEXT NOT NULL", key=", k_policy"))
    con.execute("INSERT INTO bench_results BY NAME "
                "SELECT *, 'fixed' AS k_policy FROM bench_results_old ORDER BY rowid")
    con.execute("DROP TABLE bench_results_old")


def _add_tree_columns(con: duckdb.DuckDBPyConnection) -> None:
    # A tree draft's shape and the branch the target accepted (docs/drafters.md, "Tree drafts"); every round
    # recorded before drafted a chain, for which both stay NULL.
    con.execute("ALTER TABLE rounds ADD COLUMN draft_parents INTEGER[]")
    con.execute("ALTER TABLE rounds ADD COLUMN accepted_path INTEGER[]")


def _add_depth(con: duckdb.DuckDBPyConnection) -> None:
    # How deep each round drafted, which `position_stats` spreads it over: k for a chain (every round before trees),
    # the longest branch for a tree (`Round.depth`).
    con.execute("ALTER TABLE rounds ADD COLUMN depth INTEGER")
    con.execute("UPDATE rounds SET depth = k WHERE draft_parents IS NULL")
    trees = con.execute("SELECT rowid, draft_parents FROM rounds WHERE draft_parents IS NOT NULL").fetchall()
    for rowid, parents in trees:
        con.execute("UPDATE rounds SET depth = ? WHERE rowid = ?", [tree_depth(parents), rowid])
    con.execute(POSITION_STATS.format(outcomes=OUTCOMES_OF_ROUNDS.format(depth="depth")))


def _add_turns(con: duckdb.DuckDBPyConnection) -> None:
    # A multi-turn question is one run per turn: which, and the question they share; every run before was one turn.
    con.execute("ALTER TABLE runs ADD COLUMN turn INTEGER")
    con.execute("ALTER TABLE runs ADD COLUMN conversation TEXT")
    con.execute("UPDATE runs SET turn = 1, conversation = prompt_id")
    con.execute(CONTEXT_STATS)  # acceptance by the round's place in the text, which a later turn's prompt extends


def _add_sampling_test(con: duckdb.DuckDBPyConnection) -> None:
    # Sampled rounds: the min(1, p/q) test of every judged draft (p(x), q(x), the uniform draw), and whether the
    # round's own token came from the residual; NULL for greedy rounds and for rounds recorded before.
    for column, kind in (("draft_p", "DOUBLE[]"), ("draft_q", "DOUBLE[]"), ("draft_u", "DOUBLE[]"),
                         ("from_residual", "BOOLEAN")):
        con.execute(f"ALTER TABLE rounds ADD COLUMN {column} {kind}")



def _add_batches(con: duckdb.DuckDBPyConnection) -> None:
    batch_columns(con)
    con.execute(RUN_STATS.format(more=", k_policy, batch_size"))  # a batch's size changes the target's pass itself
    con.execute(BATCH_STATS)


def _create_run_facts(con: duckdb.DuckDBPyConnection) -> None:
    """Superseded: `add_pass_rows` makes run_facts as today's SQL reads it (with each pass's rows), in every file."""


def _add_tree_nodes(con: duckdb.DuckDBPyConnection) -> None:
    # A tree's nodes per round at most: given as :nodes=N, or measured by its pair (runner/engine/tree_size.py). Runs
    # recorded before drafted their :nodes=N, else 15, the fixed default then; lookahead G guesses of N - 1 (7,5,7).
    con.execute("ALTER TABLE runs ADD COLUMN tree_nodes INTEGER")
    con.execute("""UPDATE runs SET tree_nodes = coalesce(TRY_CAST(regexp_extract(draft, ':nodes=([0-9]+)$', 1)
        AS INTEGER), 15) WHERE draft_kind IN ('ngram-tree', 'eagle-tree', 'hybrid', 'recycling', 'medusa-tree')""")
    con.execute("""UPDATE runs SET tree_nodes = CASE WHEN draft = 'lookahead' THEN 28 ELSE
        CAST(split_part(draft, ',', 3) AS INTEGER) * (CAST(split_part(draft, ',', 2) AS INTEGER) - 1) END
        WHERE draft_kind = 'lookahead'""")


MIGRATIONS: list[Callable[[duckdb.DuckDBPyConnection], None]] = [
    _create_runs_and_rounds,
    _create_run_stats,
    _add_device_name,
    _create_bench_results,
    _create_run_totals,
    _add_divergence,
    _add_kernels_and_threads,
    _define_metrics,
    create_trainings,
    _add_concurrent_workers,
    _add_k_policy,
    _create_position_stats,
    _add_bench_k_policy,
    _add_tree_columns,
    _add_depth,
    _add_turns,
    add_training_categories,
    _add_sampling_test,
    _add_batches,
    count_rounds,
    _create_run_facts,
    _add_tree_nodes,
    add_pass_rows,
    add_learn_context,
]
SCHEMA_VERSION = len(MIGRATIONS)


class StoreError(Exception):
    """A one-line, user-facing problem with the database file."""



def _db_name(con: duckdb.DuckDBPyConnection) -> str:
    return con.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchone()[0]


def schema_version(con: duckdb.DuckDBPyConnection) -> int:
    """The applied schema version (0 for an empty database); refuses foreign or newer files."""
    try:
        version, has_runs = con.execute(
            "SELECT (SELECT max(version) FROM schema_migrations), (SELECT count(*) "
            "FROM duckdb_tables() WHERE schema_name = 'main' AND table_name = 'runs')").fetchone()
    except duckdb.CatalogException:
        if con.execute("SELECT count(*) FROM duckdb_tables()").fetchone()[0]:
            raise StoreError(f"{_db_name(con)} is not a specdash database") from None
        return 0
    if (version or 0) > SCHEMA_VERSION:
        raise StoreError(f"{Path(_db_name(con)).name} has schema version {version}, newer than this specdash "
                         f"({SCHEMA_VERSION}); upgrade specdash")
    if version and not has_runs:
        raise StoreError(f"{_db_name(con)} is not a specdash database")
    return version or 0


def migrate(con: duckdb.DuckDBPyConnection, to_version: int = SCHEMA_VERSION) -> None:
    """Apply the missing migrations up to `to_version`, each in its own transaction."""
    version = schema_version(con)
    if version == 0:
        con.execute("CREATE TABLE IF NOT EXISTS schema_migrations "
                    "(version INTEGER PRIMARY KEY, name TEXT, applied_at TIMESTAMP)")
    for number in range(version + 1, to_version + 1):
        step = MIGRATIONS[number - 1]
        con.begin()
        try:
            step(con)
            con.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)", [number, step.__name__.lstrip("_"),
                                                                            datetime.now(UTC)])
            con.commit()
        except BaseException:
            con.rollback()
            raise
