"""Scale: a synthetic runs.duckdb of 10 million rounds, then how fast the dashboard and ad-hoc SQL answer on it.

    python bench/scale.py                       # build /tmp/specdash-scale/runs.duckdb (once), then measure
    python bench/scale.py --runs 10000          # a 1M-round file, for a quick look
    python bench/scale.py --explain             # also print where the time of the slowest query goes

The file has the real schema (init_db) and consistent contents: sweeps of prompt groups, each a
baseline plus every draft × k, 100 rounds per run whose accepted counts follow a geometric law per draft and
category (accepted + rejected + thrown = k, bonus = all accepted, emitted = accepted + 1), and run rows whose
new_tokens, n_rounds, draft_s, verify_s and wall_s are the sums of their rounds.

Measured, as medians over --repeats, each on a fresh cache:
  (1) every query function each dashboard page calls for its default view, one short connection each, as
      dashboard/common.load does — the server-side data time of the page;
  (2) each page rendered whole by Streamlit's AppTest (queries, frames, charts, tables) — the server-side time;
  (3) the ad-hoc aggregate "α per category × draft × k" through runner.sql.run_query.
Goals: every page under 2 s server-side, the aggregate under 1 s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `python bench/scale.py` puts bench/, not the repository, on the path

import duckdb  # noqa: E402

from dashboard import filter_queries, overview, queries, replay  # noqa: E402
from runner.store import advisor, comparable, metrics, run_facts  # noqa: E402
from runner.store.connect import init_db, upgrade  # noqa: E402
from runner.store.round_counts import FILL_ROUND_COUNTS, FILL_RUN_TOTALS  # noqa: E402
from runner.store.sql import EXAMPLES, run_query  # noqa: E402

DRAFTS = ["ngram", "ngram:2", "layerskip:24", "layerskip:15"]
KS = [1, 2, 3, 4, 6, 8]
RUNS_PER_GROUP = 1 + len(DRAFTS) * len(KS)  # a baseline, then every draft × k, for one prompt, mode and seed
PROMPTS, GROUPS_PER_SWEEP = 30, 100
CATEGORIES = ["code", "summary", "poem"]
TARGET = "smollm2-135m"
# Acceptance per draft (rows) and category (columns): the geometric law's α.
ALPHA = [[0.45, 0.80, 0.25], [0.40, 0.75, 0.20], [0.55, 0.50, 0.45], [0.15, 0.12, 0.10]]
C = [0.02, 0.02, 0.80, 0.50]  # one draft token's time / one target pass, per draft
PASS_S = 0.05  # one one-token target pass; a pass over k drafts costs PASS_S · (1 + 0.1·k)
ALPHA_QUERY = EXAMPLES["α per category × draft × k"]
GOAL_PAGE_S, GOAL_QUERY_S = 2.0, 1.0


def _lookup(values: list, index_sql: str) -> str:
    return f"[{', '.join(repr(v) for v in values)}][{index_sql} + 1]"


PLAN = f"""CREATE TEMP TABLE plan AS
SELECT i, 'r' || lpad(i::TEXT, 7, '0') AS run_id, 'r' || lpad((i - i % {RUNS_PER_GROUP})::TEXT, 7, '0') AS base_id,
       g, pos, 'sweep-' || lpad((g // {GROUPS_PER_SWEEP})::TEXT, 4, '0') AS sweep_id,
       'p' || lpad((g % {PROMPTS})::TEXT, 2, '0') AS prompt_id,
       {_lookup(CATEGORIES, f'(g % {PROMPTS}) % 3')} AS category,
       CASE WHEN pos = 0 THEN 'none' ELSE {_lookup(DRAFTS, f'(pos - 1) // {len(KS)}')} END AS draft,
       CASE WHEN pos = 0 THEN NULL ELSE {_lookup(KS, f'(pos - 1) % {len(KS)}')} END AS k,
       CASE WHEN pos = 0 THEN NULL ELSE (pos - 1) // {len(KS)} END AS d,
       CASE WHEN g % 2 = 0 THEN 'greedy' ELSE 'sample' END AS mode, g // {PROMPTS} AS seed
FROM (SELECT range AS i, range // {RUNS_PER_GROUP} AS g, range % {RUNS_PER_GROUP} AS pos FROM range(?))"""

ROUNDS = f"""INSERT INTO rounds (run_id, round, k, accepted, rejected, thrown, bonus, emitted, draft_s, verify_s,
    draft_tokens, target_tokens, depth, pass_rows)
WITH drawn AS (
    SELECT p.run_id, r.range AS round, coalesce(p.k, 0) AS k,
           -- geometric: P(accepted >= j) = α^j, from a uniform draw hashed from (run, round)
           CASE WHEN p.k IS NULL THEN 0 ELSE least(p.k, floor(
               ln(greatest((hash(p.i, r.range) % 1000000)::DOUBLE / 1000000, 1e-9))
               / ln({ALPHA}[p.d + 1][(p.g % {PROMPTS}) % 3 + 1]))::INTEGER) END AS accepted,
           CASE WHEN p.k IS NULL THEN 0.0 ELSE {C}[p.d + 1] END AS c
    FROM plan p CROSS JOIN range(?) r)
SELECT run_id, round, k, accepted, (accepted < k)::INTEGER AS rejected, k - accepted - (accepted < k)::INTEGER,
       accepted = k AS bonus, accepted + 1 AS emitted, k * c * {PASS_S} AS draft_s,
       {PASS_S} * (1 + 0.1 * k) AS verify_s, [(x + round)::INTEGER FOR x IN range(k)] AS draft_tokens,
       [(x + round)::INTEGER FOR x IN range(k + 1)] AS target_tokens, k AS depth, k + 1 AS pass_rows
FROM drawn"""

RUNS = """INSERT INTO runs (run_id, sweep_id, started_at, target, draft, draft_kind, category, prompt_id, prompt_text,
    k, mode, temperature, top_p, seed, max_new_tokens, device, dtype, new_tokens, n_rounds, target_passes,
    draft_calls, wall_s, prefill_s, draft_s, verify_s, prompt_tokens, output_tokens, output_text, stop_reason,
    baseline_run_id, lossless, status, error, torch_version, transformers_version, python_version, host, git_commit,
    device_name)
SELECT p.run_id, p.sweep_id, TIMESTAMP '2026-01-01' + p.i * INTERVAL 1 SECOND, ?, p.draft,
    CASE WHEN p.draft = 'none' THEN 'baseline' ELSE split_part(p.draft, ':', 1) END, p.category, p.prompt_id,
    'prompt ' || p.prompt_id, p.k, p.mode, CASE WHEN p.mode = 'greedy' THEN 0.0 ELSE 0.7 END, 1.0, p.seed,
    a.new_tokens, 'cpu', 'float32', a.new_tokens, a.n_rounds, a.n_rounds + 1,
    CASE WHEN p.k IS NULL THEN 0 ELSE a.n_rounds END, 0.1 + a.draft_s + a.verify_s, 0.1, a.draft_s, a.verify_s,
    [1, 2, 3], range(a.new_tokens)::INTEGER[], 'synthetic', 'max_new_tokens',
    CASE WHEN p.pos > 0 THEN p.base_id END,
    CASE WHEN p.pos > 0 AND p.mode = 'greedy' THEN hash(p.i) % 1000 <> 0 END,
    'ok', NULL, '2.13.0', '5.24.0', '3.11.7', 'synthetic', '', 'synthetic CPU'
FROM plan p JOIN (SELECT run_id, sum(emitted)::INTEGER + 1 AS new_tokens, count(*)::INTEGER AS n_rounds,
                         sum(draft_s) AS draft_s, sum(verify_s) AS verify_s FROM rounds GROUP BY run_id) a
    USING (run_id)"""


def build(db: Path, runs: int, rounds_per_run: int) -> None:
    """Create (or re-create) the synthetic file: `runs` runs × `rounds_per_run` rounds."""
    for stale in (db, db.with_name(db.name + ".wal")):
        stale.unlink(missing_ok=True)
    db.parent.mkdir(parents=True, exist_ok=True)
    init_db(db)
    started = time.perf_counter()
    with duckdb.connect(str(db)) as con:
        con.execute(PLAN, [runs])
        con.execute(ROUNDS, [rounds_per_run])
        con.execute(RUNS, [TARGET])
        con.execute(FILL_RUN_TOTALS)
        con.execute(FILL_ROUND_COUNTS)
        run_facts.refresh_all(con)
        con.execute("CHECKPOINT")
    print(f"built {db}: {runs:,} runs × {rounds_per_run} rounds in {time.perf_counter() - started:.0f} s, "
          f"{db.stat().st_size / 2**20:,.0f} MiB", flush=True)


def check(db: Path) -> tuple[int, int]:
    """The invariants the runner keeps hold here too; returns (runs, rounds)."""
    with duckdb.connect(str(db), read_only=True) as con:
        broken = con.execute("""SELECT
            (SELECT count(*) FROM rounds WHERE accepted + rejected + thrown <> k OR bonus <> (accepted = k)
                OR emitted <> accepted + 1 OR rejected NOT IN (0, 1)),
            (SELECT count(*) FROM runs r JOIN (SELECT run_id, count(*) AS n, sum(emitted) AS e FROM rounds
                GROUP BY run_id) a USING (run_id) WHERE r.n_rounds <> a.n OR r.new_tokens <> a.e + 1
                OR len(r.output_tokens) <> r.new_tokens),
            (SELECT count(*) FROM runs r LEFT JOIN runs b ON b.run_id = r.baseline_run_id
                WHERE r.draft <> 'none' AND (b.draft IS DISTINCT FROM 'none' OR b.prompt_id <> r.prompt_id))
            """).fetchone()
        counts = con.execute("SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM rounds)").fetchone()
    assert broken == (0, 0, 0), f"synthetic data breaks an invariant: {broken}"
    return counts


def median_s(fn: Callable[[], object], repeats: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), times


def page_queries(newest_run: str, drafts: list[str]) -> dict[str, list[tuple[Callable, tuple]]]:
    """What each page's default view reads (see dashboard/*.py render()); a query a page calls twice is cached, so it
    counts once."""
    everything = metrics.Filters()
    head_to_head = metrics.Filters(draft=tuple(drafts[:2]))  # Compare's draft A and B: the first two, sorted
    return {
        "overview": [(queries.run_count, ()), (filter_queries.filter_options, ()),
                     (queries.comparable_cells, (everything,)), (comparable.best_cells, (everything,)),
                     (comparable.left_out, (everything,)),
                     (queries.runs, (everything, overview.THEORY_DOTS, min(KS))),
                     (queries.runs, (everything, overview.RUNS_SHOWN)),
                     (metrics.formula_over_alpha, (everything, min(KS))),
                     (metrics.formula_over_k, (everything,)), (queries.verify_growth, (everything,))],
        "compare": [(queries.run_count, ()), (filter_queries.filter_options, ()),
                    (queries.comparable_cells, (everything,)), (comparable.lossless_by_setup, (everything,)),
                    (comparable.best_cells, (everything,)),
                    (comparable.left_out, (everything,)), (metrics.formula_over_k, (head_to_head,)),
                    (advisor.positions, (everything,)), (queries.tree_drafts, ()),
                    (advisor.k_answer, (everything,))],
        "replay (no run picked)": [(queries.run_count, ()), (queries.run_choices, (replay.RUNS_SHOWN,))],
        "replay ?run=…": [(queries.run_count, ()), (queries.run_choices, (replay.RUNS_SHOWN, (newest_run,))),
                          (queries.run_detail, (newest_run,)), (queries.run_rounds, (newest_run,))],
        "bench": [(queries.run_count, ()), (queries.benches, ())],
        "sql": [(queries.run_count, ()), (queries.schema, ())],
    }


def measure_queries(db: Path, repeats: int, newest_run: str) -> dict[str, tuple[float, dict[str, float]]]:
    results = {}
    drafts = sorted(DRAFTS)
    for page, calls in page_queries(newest_run, drafts).items():
        per_query = {}
        for fn, args in calls:
            name = fn.__name__ if fn.__name__ not in per_query else f"{fn.__name__} {args[1:]}"  # a page's second call
            per_query[name] = median_s(lambda fn=fn, args=args: queries.read(db, fn, *args), repeats)[0]
        results[page] = (sum(per_query.values()), per_query)
    return results


def measure_pages(db: Path, repeats: int, newest_run: str) -> dict[str, float]:
    """Whole-page server-side render times under AppTest, each repeat on an empty st.cache_data."""
    import os

    import streamlit as st
    from streamlit import logger
    from streamlit.testing.v1 import AppTest

    logger.set_log_level("error")  # AppTest outside `streamlit run` warns about its bare mode on every run

    os.environ["SPECDASH_DB"] = str(db)
    pages = {"overview": ("overview.py", {}), "compare": ("compare.py", {}),
             "replay (no run picked)": ("replay.py", {}), "replay ?run=…": ("replay.py", {"run": newest_run}),
             "bench": ("bench_page.py", {}), "sql": ("sql_page.py", {})}
    results = {}
    for name, (page, params) in pages.items():
        times = []
        for _ in range(repeats + 1):  # the first warms imports and the tokenizer (cache_resource); not counted
            at = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=600)
            at.run()
            at.switch_page(page)
            at.query_params.update(params)
            st.cache_data.clear()
            started = time.perf_counter()
            at.run()
            times.append(time.perf_counter() - started)
            problems = [e.value for e in at.exception] + [e.value for e in at.error]
            assert not problems, f"{name}: {problems}"
        results[name] = statistics.median(times[1:])
    return results


def explain(db: Path) -> None:
    with duckdb.connect(str(db), read_only=True) as con:
        con.execute("PRAGMA enable_profiling = 'query_tree'")
        con.execute(ALPHA_QUERY).fetchall()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", type=Path, default=Path("/tmp/specdash-scale/runs.duckdb"))
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--rounds-per-run", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rebuild", action="store_true", help="build the file even if it has the right size")
    parser.add_argument("--no-pages", action="store_true", help="skip the AppTest page renders")
    parser.add_argument("--explain", action="store_true", help="profile the α query")
    args = parser.parse_args()

    counts = check(args.db) if args.db.exists() and not args.rebuild else None
    if counts != (args.runs, args.runs * args.rounds_per_run):
        build(args.db, args.runs, args.rounds_per_run)
        counts = check(args.db)
    started = time.perf_counter()
    upgrade(args.db)  # a file built by an older specdash gets this one's tables and views, as the dashboard does
    print(f"upgraded to this specdash's schema (if it was older) in {time.perf_counter() - started:.1f} s")
    print(f"{args.db}: {counts[0]:,} runs, {counts[1]:,} rounds, {args.db.stat().st_size / 2**20:,.0f} MiB; "
          f"medians of {args.repeats}", flush=True)
    newest = queries.read(args.db, queries.run_choices, 1)["run_id"].iloc[0]

    alpha, alpha_times = median_s(lambda: run_query(args.db, ALPHA_QUERY), args.repeats)
    verdict = "ok" if alpha < GOAL_QUERY_S else f"OVER the {GOAL_QUERY_S:g} s goal"
    each = ", ".join(f"{t:.2f}" for t in alpha_times)
    print(f"\nrun_query α per category × draft × k: {alpha:.2f} s ({verdict}; each run: {each})")

    print("\ndashboard query functions per page (default view), seconds:")
    for page, (total, per_query) in measure_queries(args.db, args.repeats, newest).items():
        verdict = "ok" if total < GOAL_PAGE_S else f"OVER the {GOAL_PAGE_S:g} s goal"
        detail = ", ".join(f"{name} {t:.2f}" for name, t in per_query.items())
        print(f"  {page:<24} {total:6.2f}  ({verdict}) = {detail}")
    if not args.no_pages:
        print("\nwhole page under AppTest (server-side render), seconds:")
        for page, seconds in measure_pages(args.db, args.repeats, newest).items():
            verdict = "ok" if seconds < GOAL_PAGE_S else f"OVER the {GOAL_PAGE_S:g} s goal"
            print(f"  {page:<24} {seconds:6.2f}  ({verdict})")
    if args.explain:
        explain(args.db)


if __name__ == "__main__":
    main()
