"""What a run's rounds are summed into as the run is written, so that queries need not read every round: its totals
(`run_totals`) and its rounds counted by outcome (`round_counts`); the SQL that works both out again from the rounds
themselves (bench/scale.py's synthetic file, the tests' re-timed ones), and positions pooled from the counts.

Every query that pooled rounds over many runs (nodes per round, verify time per width, acceptance per position)
grouped every round on every page load: at 100M rounds about a second each. A run's rounds take only a few distinct
outcomes, so counted once, as the run is written, they are a few rows per run that those queries sum instead.
"""

from __future__ import annotations

# Every run's totals from its rounds (also the backfill of migration `create_run_totals`).
FILL_RUN_TOTALS = """INSERT INTO run_totals SELECT run_id, sum(accepted), sum(rejected), sum(thrown), sum(k),
    sum(emitted) FROM rounds GROUP BY run_id"""
# The outcome of a round: what `position_stats`, nodes per round and verify time by width tell apart.
OUTCOME = ("k", "depth", "accepted", "rejected", "tree", "pass_rows")
# Every run's rounds counted, as the runner writes them.
FILL_ROUND_COUNTS = """INSERT INTO round_counts (run_id, k, depth, accepted, rejected, tree, pass_rows, rounds,
    verify_s) SELECT run_id, k, depth, accepted, rejected, draft_parents IS NOT NULL AS tree, pass_rows, count(*),
    sum(verify_s) FROM rounds GROUP BY ALL"""


def positions_pooled(keys: str, runs: str) -> str:
    """Per value of `keys` (columns of run_facts, comma-separated) and draft position: rounds that proposed, reached
    and accepted it, over the runs `runs` selects (a query of rows of run_facts). Equal to `position_stats` summed
    by `keys`, but each key's outcomes (`run_facts.outcomes`) are pooled before they are spread over positions: a
    few rows per key rather than per run, so the advisor's cost grows with its keys, not with the runs."""
    return f"""
        SELECT {keys}, p.position, sum(o.n)::BIGINT AS proposed,
               coalesce(sum(o.n) FILTER (p.position <= o.a + o.r), 0)::BIGINT AS reached,
               coalesce(sum(o.n) FILTER (p.position <= o.a), 0)::BIGINT AS accepted
        FROM (SELECT {keys}, c.depth, c.accepted AS a, c.rejected AS r, sum(c.rounds) AS n
              FROM (SELECT {keys}, unnest(outcomes) AS c FROM ({runs})) GROUP BY ALL) o
        CROSS JOIN LATERAL range(1, o.depth + 1) p(position) GROUP BY ALL"""
