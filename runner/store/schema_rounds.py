"""What the schema keeps of the rounds counted per run: `round_counts` and `position_stats`, which reads it
(migration `count_rounds` in `schema.py`; kept here to keep that file short).

Every query that pooled rounds over many runs (nodes per round, verify time per width, acceptance per position)
grouped every round on every page load: at 100M rounds about a second each. A run's rounds take only a few distinct
outcomes, so counted once, as the run is written, they are a few rows per run that those queries sum instead.
"""

from __future__ import annotations

import duckdb

from runner.store import schema_facts

# Per run: its rounds counted by outcome. A chain at k has at most k + 1 outcomes (accepted 0..k), a baseline one.
ROUND_COUNTS = """CREATE TABLE round_counts (
        run_id TEXT NOT NULL, k INTEGER, depth INTEGER, accepted INTEGER, rejected INTEGER, tree BOOLEAN NOT NULL,
        rounds INTEGER NOT NULL, verify_s DOUBLE)"""
# The outcome of a round: what `position_stats`, nodes per round and verify time by width tell apart.
OUTCOME = ("k", "depth", "accepted", "rejected", "tree", "pass_rows")
# Every run's rounds counted, as the runner writes them (bench/scale.py's synthetic file, the tests' re-timed ones).
FILL_ROUND_COUNTS = """INSERT INTO round_counts (run_id, k, depth, accepted, rejected, tree, pass_rows, rounds,
    verify_s) SELECT run_id, k, depth, accepted, rejected, draft_parents IS NOT NULL AS tree, pass_rows, count(*),
    sum(verify_s) FROM rounds GROUP BY ALL"""
# The backfill of migration `count_rounds`, before rounds had pass_rows.
_FILL_BEFORE_PASS_ROWS = """INSERT INTO round_counts SELECT run_id, k, depth, accepted, rejected,
    draft_parents IS NOT NULL AS tree, count(*), sum(verify_s) FROM rounds GROUP BY ALL"""

# Per run and draft position i = 1..depth (a tree's level): how many rounds drafted a token there (`proposed`), how
# often a round reached it (drafts 1..i-1 accepted, so a d_i was judged) and how often a d_i was then accepted. A round
# of depth d with a accepted proposed 1..d, reached 1..a + rejected (a chain: min(a + 1, d); a tree reaches level
# a + 1 only when its last accepted node had children) and accepted 1..a. `outcomes` counts the rounds per (run,
# depth, accepted, rejected) before positions are spread out: a few rows per run, not one per round; they are spread
# per run and position alone, and the run's columns joined after (grouping by all of them cost twice the time).
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


# `outcomes` from the rounds themselves, before `round_counts` (depth: `k` before rounds had a depth of their own).
OUTCOMES_OF_ROUNDS = """SELECT run_id, {depth} AS depth, accepted AS a, rejected AS r, count(*) AS n FROM rounds
    WHERE k > 0 GROUP BY ALL"""
OUTCOMES_COUNTED = """SELECT run_id, depth, accepted AS a, rejected AS r, sum(rounds) AS n FROM round_counts
    WHERE k > 0 GROUP BY ALL"""


def count_rounds(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(ROUND_COUNTS)
    con.execute(_FILL_BEFORE_PASS_ROWS)
    con.execute(POSITION_STATS.format(outcomes=OUTCOMES_COUNTED))


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
    schema_facts.create_run_facts(con)
