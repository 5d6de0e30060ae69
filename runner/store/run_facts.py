"""`run_facts`: every 'ok' run's row of `run_stats` worked out once, as the run is written, instead of on every query.

run_stats joined runs to run_totals and to the baseline's row of runs on every query, a cost that grows with the
runs for each of the Overview's and Compare's queries. Its rows are now a table, written with the run (`refresh`), and
run_stats is a view of that table (schema_now.py), so its columns and numbers are what they were. The table adds the
run's own times (wall, prefill, drafting, verifying: what the k advisor splits a round into) and what the dashboard
pooled from round_counts per run: the rounds that drafted (`drafting_rounds`) and whether any drafted a tree (`tree`,
for nodes per round), the verify passes by width (`widths`: per k and pass rows, rounds and summed verify seconds),
and the drafting rounds by outcome (`outcomes`: per depth, accepted and rejected, the rounds), which acceptance by
position spreads.

A run's row depends on its baseline's, so writing a run also works out again the rows of the runs that name it as
their baseline (a baseline spilled while the file was locked can be written after its runs). A file changed by hand
outside specdash keeps its old rows until `refresh_all`.
"""

from __future__ import annotations

import duckdb

# One row per 'ok' run: its totals, the explainer's numbers, and its speedups against its baseline b. Migrations 8, 11
# and 19 made it the view run_stats itself; `facts_sql` works it out into run_facts instead.
RUN_STATS_SELECT = """
    WITH measured AS (
        SELECT r.*, t.accepted::BIGINT AS accepted, t.rejected::BIGINT AS rejected, t.thrown::BIGINT AS thrown,
               t.drafted::BIGINT AS drafted, alpha(t.accepted, t.rejected) AS alpha, tau(t.emitted, r.n_rounds) AS tau,
               thrown_share(t.thrown, t.drafted) AS thrown_share,
               r.new_tokens / nullif(r.wall_s, 0) AS tokens_per_s,
               b.new_tokens / nullif(b.wall_s, 0) AS baseline_tokens_per_s,
               CASE WHEN r.draft <> 'none' THEN (b.wall_s / nullif(b.new_tokens, 0))
                    / nullif(r.wall_s / nullif(r.new_tokens, 0), 0) END AS measured_speedup,
               b.verify_s / nullif(b.n_rounds, 0) AS target_pass_s,
               r.verify_s / nullif(r.n_rounds, 0) AS verify_pass_s,
               r.draft_s / nullif(t.drafted, 0) AS draft_token_s
        FROM runs r LEFT JOIN run_totals t USING (run_id)
        LEFT JOIN runs b ON b.run_id = r.baseline_run_id
        WHERE r.status = 'ok'),
    with_c AS (SELECT *, draft_cost(draft_token_s, target_pass_s) AS c FROM measured)
    SELECT run_id, sweep_id, target, draft, draft_kind, category, prompt_id, k, mode,
           temperature, top_p, seed, device, dtype, new_tokens, n_rounds, accepted, rejected,
           thrown, drafted, alpha, tau, thrown_share, tokens_per_s, baseline_tokens_per_s,
           measured_speedup, target_pass_s, verify_pass_s, draft_token_s, c,
           formula_speedup(alpha, k, c) AS theoretical_speedup, lossless, divergence, kernels, threads{more}
    FROM with_c"""

# run_stats' columns after the runs' own, as migration 19 left them, then the engine's (migration `add_engines`), then
# the run's own times the advisor splits
_COLUMNS = ", k_policy, batch_size"
_ENGINE_COLUMNS = ", engine, engine_version, ttft_s"
_TIMES = ("wall_s", "prefill_s", "draft_s", "verify_s")
# Per run from round_counts: the rounds that drafted, whether any drafted a tree, per (k, pass rows) the rounds verified
# and their summed verify seconds, and the drafting rounds counted by (depth, accepted, rejected).
_PER_RUN = """SELECT * FROM (
        SELECT run_id, (sum(rounds) FILTER (k > 0))::BIGINT AS drafting_rounds, bool_or(tree) FILTER (k > 0) AS tree,
            list({{'k': k, 'rows': pass_rows, 'rounds': rounds, 'verify_s': verify_s}} ORDER BY k, pass_rows) AS widths
        FROM (SELECT run_id, k, pass_rows, sum(rounds)::BIGINT AS rounds, sum(verify_s) AS verify_s,
                     bool_or(tree) AS tree
              FROM round_counts WHERE {where} GROUP BY run_id, k, pass_rows)
        GROUP BY run_id)
    LEFT JOIN (
        SELECT run_id, list({{'depth': depth, 'accepted': accepted, 'rejected': rejected, 'rounds': rounds}}
                            ORDER BY depth, accepted, rejected) AS outcomes
        FROM (SELECT run_id, depth, accepted, rejected, sum(rounds)::BIGINT AS rounds FROM round_counts
              WHERE k > 0 AND {where} GROUP BY ALL)
        GROUP BY run_id) USING (run_id)"""


def facts_sql(where: str, engines: bool = True) -> str:
    """run_facts' rows of the runs `where` picks (a condition on run_id), in the table's column order; `engines`: with
    the engine's columns, which files before migration `add_engines` lack."""
    more = _COLUMNS + (_ENGINE_COLUMNS if engines else "") + "".join(f", {name}" for name in _TIMES)
    return f"""SELECT s.*, c.drafting_rounds, c.tree, c.widths, c.outcomes
        FROM ({RUN_STATS_SELECT.format(more=more)}) s
        LEFT JOIN ({_PER_RUN.format(where=where)}) c USING (run_id)
        WHERE s.{where}"""


def refresh(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """Work out the rows of `run_id` and of the runs whose baseline it is (inside the caller's transaction)."""
    ids = [run_id, *(row[0] for row in con.execute("SELECT run_id FROM runs WHERE baseline_run_id = ?",
                                                    [run_id]).fetchall())]
    # Constants, not a subquery: the condition then reaches each table's scan, so a row costs its own runs only.
    picked = f"run_id IN ({', '.join(f'${n}' for n in range(1, len(ids) + 1))})"
    con.execute(f"DELETE FROM run_facts WHERE {picked}", ids)
    con.execute(f"INSERT INTO run_facts {facts_sql(picked)}", ids)


def refresh_all(con: duckdb.DuckDBPyConnection) -> None:
    """Every row worked out again from runs, run_totals and round_counts: after a file was changed by hand."""
    engines = bool(con.execute("SELECT count(*) FROM duckdb_columns() WHERE table_name = 'run_facts' "
                               "AND column_name = 'engine'").fetchone()[0])  # a file before `add_engines`: without
    con.execute("DELETE FROM run_facts")
    con.execute(f"INSERT INTO run_facts {facts_sql('run_id IS NOT NULL', engines)} ORDER BY s.run_id")
