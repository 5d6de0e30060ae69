"""The dashboard's reads: pure `(con, …) -> DataFrame` functions, aggregation done in DuckDB.

No Streamlit here. Every value a user picks travels as a `?` parameter; column names come only
from the fixed fields of `Filters`. The pooled numbers (cells, the leaderboard, the formula's curves)
come from `runner.store.metrics`, which `runner sweep` and the bench read too.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

import duckdb
import pandas as pd

from runner.store import advisor, comparable
from runner.store import trainings as trainings_store
from runner.store.connect import READ_BOUND_S, reading
from runner.store.metrics import PASS_SETUP, Filters
from runner.store.schema import schema_version

T = TypeVar("T")
EVERYTHING = Filters()  # nothing filtered


def read(db_path: str | os.PathLike, query: Callable[..., T], *args: object) -> T:
    """Run one query function on a short-lived read-only connection, so the runner can write between reads."""
    return reading(db_path, lambda con: query(con, *args), READ_BOUND_S)


def _frame(con: duckdb.DuckDBPyConnection, sql: str, params: list) -> pd.DataFrame:
    return con.execute(sql, params).df()


def run_count(con: duckdb.DuckDBPyConnection) -> int:
    """Recorded runs; 0 for a database the runner has not written yet. Refuses foreign files (StoreError)."""
    if schema_version(con) == 0:
        return 0
    return con.execute("SELECT count(*) FROM runs").fetchone()[0]


def runs(con: duckdb.DuckDBPyConnection, filters: Filters, limit: int, k: int | None = None) -> pd.DataFrame:
    """The newest `limit` selected speculative runs, newest first; at `k`, only those with a measured speedup (a
    baseline) and an α. The newest are picked from `runs` alone (every filter is one of its columns, and run_stats
    holds its 'ok' runs), so only they pay run_stats' joins, which would otherwise grow with every run in the file."""
    where, params = filters.where()
    at_k, measured = ("", "") if k is None else (
        "AND k = ? AND baseline_run_id IS NOT NULL", "WHERE s.measured_speedup IS NOT NULL AND s.alpha IS NOT NULL")
    return _frame(con, f"""
        WITH newest AS (
            SELECT run_id, started_at FROM runs WHERE status = 'ok' AND draft <> 'none' AND {where} {at_k}
            ORDER BY started_at DESC, run_id LIMIT ?)
        SELECT s.run_id, n.started_at, s.target, s.mode, s.category, s.prompt_id, s.draft, s.k, s.k_policy,
            s.kernels, s.threads, s.batch_size,
            s.alpha, s.tau, s.thrown_share, s.c, s.measured_speedup, s.theoretical_speedup, s.lossless
        FROM newest n JOIN run_stats s USING (run_id) {measured}
        ORDER BY n.started_at DESC, s.run_id""", [*params, *([] if k is None else [k]), limit])


def nodes_per_round(con: duckdb.DuckDBPyConnection, filters: Filters, keys: tuple[str, ...]) -> pd.DataFrame:
    """Per value of `keys` over the selected speculative runs: nodes per round, Σ k over the rounds that drafted
    divided by their count (for a chain: drafts per round; for a tree: its size), and whether any of them drafted a
    tree (`draft_parents` recorded)."""
    where, params = filters.where()
    # Per run, run_facts holds Σ k (`drafted`), the rounds that drafted and whether any drafted a tree.
    return _frame(con, f"""
        SELECT {", ".join(keys)}, sum(drafted) / sum(drafting_rounds) AS nodes_per_round,
            coalesce(bool_or(tree), false) AS tree
        FROM run_facts WHERE draft <> 'none' AND {where} GROUP BY ALL ORDER BY ALL""", params)


def comparable_cells(con: duckdb.DuckDBPyConnection, filters: Filters) -> pd.DataFrame:
    """Every kept cell by the one pooling rule (`comparable.cells`), with its nodes per round over the same runs'
    cell (every run of the cell: a tree's size does not depend on the prompt set) and whether it drafted trees."""
    cells = comparable.cells(con, filters)
    keys = ("target", "mode", "category", "draft", "k", "k_policy", *PASS_SETUP)
    nodes = nodes_per_round(con, filters, keys).fillna({"kernels": "not recorded", "threads": 0})
    return cells.merge(nodes.astype({"threads": cells["threads"].dtype}) if len(cells) else nodes, on=list(keys),
                       how="left")


def tree_drafts(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The drafts that proposed a tree in at least one round: their draft positions are the tree's levels."""
    return [draft for (draft,) in con.execute("""
        SELECT DISTINCT draft FROM runs WHERE run_id IN (SELECT run_id FROM round_counts WHERE tree)
        ORDER BY draft""").fetchall()]


def verify_growth(con: duckdb.DuckDBPyConnection, filters: Filters) -> pd.DataFrame:
    """Mean verify-pass time by the pass's width `k`, its rows beyond the newest token (a chain's drafts, a tree's
    nodes, lookahead's window too), relative to the baselines' one-token pass.

    The explainer assumes a pass costs the same for 1 and for k+1 tokens; this measures it. Baselines
    have no draft and no k, so only the other filters pick them.
    """
    spec_where, spec_params = filters.where(alias="s.")
    base_where, base_params = filters.where(alias="s.", skip=("draft", "k", "k_policy"))
    # Each run's verify passes by width (`run_facts.widths`), a few per run: the rows beyond the newest token, a
    # lookahead window's included, over the runs whose rows are known (`advisor.ROWS_KNOWN`). Kernels and threads
    # change the pass time itself, so each setting gets its own curve and its own reference.
    return _frame(con, f"""
        WITH picked AS (
            SELECT target, device, kernels, threads, w.rows - 1 AS k, w.rounds AS n, w.verify_s AS s, baseline
            FROM (SELECT target, device, kernels, threads, draft = 'none' AS baseline, unnest(widths) AS w
                  FROM run_facts s
                  WHERE ((s.draft <> 'none' AND {spec_where}) OR (s.draft = 'none' AND {base_where}))
                      AND {advisor.ROWS_KNOWN})),
        one_token AS (SELECT target, device, kernels, threads, sum(s) / sum(n) AS one_token_s FROM picked
                      WHERE baseline GROUP BY ALL)
        SELECT p.target, p.device, p.kernels, p.threads, p.k, sum(p.n)::BIGINT AS rounds,
            sum(p.s) / sum(p.n) AS verify_s, sum(p.s) / sum(p.n) / any_value(o.one_token_s) AS relative
        FROM picked p LEFT JOIN one_token o ON o.target = p.target AND o.device = p.device
            AND o.kernels IS NOT DISTINCT FROM p.kernels AND o.threads IS NOT DISTINCT FROM p.threads
        GROUP BY ALL ORDER BY p.target, p.device, p.kernels, p.threads, p.k""", spec_params + base_params)


def run_choices(con: duckdb.DuckDBPyConnection, newest: int, also: tuple[str, ...] = (),
                filters: Filters = EVERYTHING) -> pd.DataFrame:
    """The `newest` runs the filters pick and those of `also` that exist, newest first, with what a picker needs
    to describe them."""
    columns = ("run_id, started_at, category, prompt_id, draft, k, k_policy, mode, kernels, threads, batch_size, "
               "repeat, status")
    where, params = filters.where()
    return _frame(con, f"""
        (SELECT {columns} FROM runs WHERE {where} ORDER BY started_at DESC, run_id LIMIT ?)
        UNION (SELECT {columns} FROM runs WHERE run_id IN (SELECT unnest(?::TEXT[])))
        ORDER BY started_at DESC, run_id""", [*params, newest, list(also)])


def run_detail(con: duckdb.DuckDBPyConnection, run_id: str) -> pd.DataFrame:
    """One row: the run, its statistics and its baseline's output (to find where a lossy run differs)."""
    return _frame(con, """
        SELECT r.run_id, r.sweep_id, r.started_at, r.target, r.draft, r.draft_kind, r.category, r.prompt_id,
            r.prompt_text, r.k, r.mode, r.temperature, r.top_p, r.seed, r.max_new_tokens, r.device, r.dtype,
            r.kernels, r.threads, r.new_tokens, r.n_rounds, r.wall_s, r.draft_s, r.verify_s, r.output_tokens,
            r.output_text, r.stop_reason, r.baseline_run_id, r.lossless, r.status, r.error, r.divergence,
            r.divergence_at, r.divergence_gap, r.divergence_tolerance, r.host, r.concurrent_workers, r.k_policy,
            r.tree_nodes, r.batch_size, r.repeat, r.engine,
            s.accepted, s.rejected, s.thrown, s.drafted, s.alpha, s.tau, s.c, s.measured_speedup,
            s.theoretical_speedup, b.wall_s AS baseline_wall_s, b.output_tokens AS baseline_tokens
        FROM runs r LEFT JOIN run_stats s USING (run_id) LEFT JOIN runs b ON b.run_id = r.baseline_run_id
        WHERE r.run_id = ?""", [run_id])


def run_rounds(con: duckdb.DuckDBPyConnection, run_id: str) -> pd.DataFrame:
    """The run's rounds in order."""
    return _frame(con, """
        SELECT round, k, accepted, rejected, thrown, bonus, emitted, draft_s, verify_s, pass_rows, draft_tokens,
            target_tokens, draft_parents, accepted_path, draft_p, draft_q, draft_u, from_residual
        FROM rounds WHERE run_id = ? ORDER BY round""", [run_id])


def schema(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """The tables and views SQL users query, with their columns in order."""
    return _frame(con, """
        SELECT table_name, column_name, data_type FROM duckdb_columns()
        WHERE database_name = current_database() AND schema_name = 'main'
        ORDER BY table_name, column_index""", [])


def macros(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """The metric macros stored in the file: name, parameters and definition."""
    return _frame(con, """
        SELECT function_name AS macro, array_to_string(parameters, ', ') AS parameters,
            macro_definition AS definition
        FROM duckdb_functions() WHERE function_type = 'macro' AND NOT internal
            AND database_name = current_database() ORDER BY function_name""", [])


def benches(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """One row per recorded `make bench`, newest first, with how many of its goals were met."""
    if schema_version(con) < 4:  # bench_results came with version 4
        return pd.DataFrame(columns=["bench_id"])
    return _frame(con, """
        SELECT bench_id, any_value(started_at) AS started_at, any_value(target) AS target,
            any_value(device) AS device, any_value(device_name) AS device_name, any_value(dtype) AS dtype,
            -- the bench's own thread count: its verify curves are also timed at 1 thread
            any_value(threads) FILTER (category NOT LIKE 'threads=%') AS threads, any_value(kernels) AS kernels,
            any_value(max_new_tokens) AS max_new_tokens,
            any_value(prompts) AS prompts, any_value(repeats) AS repeats, any_value(load_before) AS load_before,
            any_value(load_after) AS load_after, any_value(command) AS command,
            any_value(torch_version) AS torch_version, any_value(transformers_version) AS transformers_version,
            any_value(git_commit) AS git_commit,
            count(*) FILTER (goal_met) AS goals_met, count(goal_met) AS goals
        FROM bench_results GROUP BY bench_id ORDER BY started_at DESC, bench_id""", [])


def bench_rows(con: duckdb.DuckDBPyConnection, bench_id: str) -> pd.DataFrame:
    """The rows of one bench in the order it printed them."""
    return _frame(con, """
        SELECT metric, unit, draft, k, k_policy, category, threads, ours, ours_min, ours_max, theirs, theirs_min,
            theirs_max, ratio, ratio_min, ratio_max, alpha, c, goal, goal_met, mismatches
        FROM bench_results WHERE bench_id = ? ORDER BY rowid""", [bench_id])


def _has_trainings(con: duckdb.DuckDBPyConnection) -> bool:
    return con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() "
                       "AND table_name = 'trainings'").fetchone()[0] > 0


def _pooled_positions(con: duckdb.DuckDBPyConnection) -> str:
    """The condition that keeps `training_positions` to its pooled rows (a file from before the per-category
    scores holds only those, and no category column)."""
    has = con.execute("SELECT count(*) FROM duckdb_columns() WHERE database_name = current_database() "
                      "AND table_name = 'training_positions' AND column_name = 'category'").fetchone()[0]
    return f"p.category = '{trainings_store.POOLED}'" if has else "true"


def trainings(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """One row per recorded training of a draft head, newest first: its setup, its saved epoch's held-out
    acceptance of the first draft, and how many recorded runs used the head it made."""
    if not _has_trainings(con):
        return pd.DataFrame(columns=["train_id"])
    return _frame(con, f"""
        SELECT t.*, p.accepted / nullif(p.judged, 0) AS heldout_first_acceptance,
            (SELECT count(*) FROM runs r WHERE r.draft = t.draft AND r.target = t.target AND r.status = 'ok')
                AS runs
        FROM trainings t
        LEFT JOIN training_positions p ON p.train_id = t.train_id AND p.epoch = t.saved_epoch AND p.position = 1
            AND {_pooled_positions(con)}
        ORDER BY t.started_at DESC, t.train_id""", [])


def training_epochs(con: duckdb.DuckDBPyConnection, train_id: str) -> pd.DataFrame:
    """Per epoch of one training (0: the untrained head): losses, seconds, and held-out acceptance by position."""
    return _frame(con, f"""
        SELECT e.epoch, e.train_loss, e.heldout_loss, e.seconds, p.position, p.judged, p.accepted,
            p.accepted / nullif(p.judged, 0) AS acceptance
        FROM training_epochs e JOIN training_positions p USING (train_id, epoch)
        WHERE train_id = ? AND {_pooled_positions(con)} ORDER BY e.epoch, p.position""", [train_id])


def training_categories(con: duckdb.DuckDBPyConnection, train_id: str) -> pd.DataFrame:
    """Per epoch × held-out category × draft position of one training: judged, accepted, acceptance (empty for a
    training recorded before the per-category scores)."""
    if _pooled_positions(con) == "true":
        return pd.DataFrame(columns=["epoch", "category", "position", "judged", "accepted", "acceptance"])
    return _frame(con, """
        SELECT epoch, category, position, judged, accepted, accepted / nullif(judged, 0) AS acceptance
        FROM training_positions p WHERE train_id = ? AND category <> ?
        ORDER BY epoch, category, position""", [train_id, trainings_store.POOLED])


def draft_positions(con: duckdb.DuckDBPyConnection, target: str, draft: str) -> pd.DataFrame:
    """Per mode × category × draft position j of one draft's runs (`position_stats`): rounds that proposed a j-th
    draft after accepting the j-1 before it (judged), and those that accepted it too, as the training's held-out
    score counts."""
    return _frame(con, """
        SELECT mode, category, position, sum(reached)::BIGINT AS judged, sum(accepted)::BIGINT AS accepted,
            alpha(sum(accepted), sum(reached) - sum(accepted)) AS acceptance
        FROM position_stats WHERE target = ? AND draft = ?
        GROUP BY ALL ORDER BY mode, category, position""", [target, draft])
