"""The k advisor: which k (and which draft-length policy) to use, predicted from what was measured on this device
rather than from the flat-cost formula.

Per target × device × kernels × threads × batch size × mode × category × draft, over the fixed-k runs at every k
recorded, on the prompts that every compared cell of the setup × category ran (`comparable`), baselines included:

- s_i: the share of the rounds that drafted (of runs whose k reaches position i) that accepted at least i drafts,
  and w_i: the share that drafted at least i (prompt lookup can find fewer; the budget cuts the last rounds), both as
  `position_stats` counts them (pooled per key first: `round_counts.positions_pooled`), over the same fixed-k runs;
- f: the rounds that drafted nothing (prompt lookup's unmatched text), one token each, as a share of all the tokens
  the rounds emitted. That share, not a share of the rounds, is the same at every k: a longer k crosses the matched
  text in fewer rounds but the unmatched text in as many, so its rounds draft less often. At k a drafting round emits
  E = 1 + Σ_{i≤k} s_i tokens, a token takes (1 − f) / E drafting rounds and f idle ones, and p = r / (f + r),
  r = (1 − f) / E, of the rounds draft;
- v(r): the mean verify pass over r rows (the newest token and w drafts: r = w + 1), per draft and category, from
  the draft's own passes and plain decoding's (a draft's passes can cost more than their rows: a head's also hand it
  the target's features; a category's prompts set the context every pass reads: a summary's passage makes each pass
  dearer), every round of those runs as `run_facts.widths` sums them (the baselines' rounds give r = 1); a row count
  no pass had is interpolated between its measured neighbours, below the fewest measured it is taken as theirs, and
  past the most it is not predicted;
- d: drafting seconds per drafted token, and l: the loop's own seconds per round (wall − prefill − draft − verify).

A round at k then emits 1 + p·Σ_{i≤k} s_i tokens in d·p·Σ_{i≤k} w_i + v(1) + Σ_{i≤k} p·w_i·(v(i + 1) − v(i)) + l
seconds.

At batch size B (part of the setup, like the kernels: `engine/round/batch.py`) the baseline is plain decoding at B
and v(r) comes from the batch's shared passes (one per batch and round). A pass with L sequences live carries
L · (W + 1) rows, every member's padded to the widest member's W drafts, so it is at least i wide when any of them
drafted that far: 1 − (1 − p·w_i)^L of the passes, members drafting independently, in place of p·w_i, with v read at
L · (i + 1) rows. L is not B: members that finish leave, and the last passes carry fewer and cost less. So the verify
term is averaged over the live counts the draft's members were in, each pass counted once per member it carried
(a member pays the passes it is in). Every member drafts in turn before the pass, so a round's drafting is
B·d·p·Σ w_i, and l is what is left of a member's round after B times its own drafting: the advice is then one k per
batch size, as a serving engine's per-batch-size draft length takes it.

A tree (its passes wider than the levels it drafted, `position_stats` counting levels) is verified as wide as its
passes: at each depth k recorded, its verify term is v over the row counts its passes had (its rounds'; in a batch,
its shared passes', each pass once per member), Σ n_r·v(r) / Σ n_r, not v at the mean, since a pass's cost is not
linear in its rows; its drafting is its measured seconds per round at k; depths never recorded are not predicted. A
pass's rows (`rounds.pass_rows`) are the newest token and a chain's k drafts or a tree's nodes, and with lookahead
its window too, rows it never drafts. Runs recorded before rounds kept their pass rows (lookahead's, whose rows are
then unknown) are neither read into v nor predicted.
Measured throughput is the decode phase's: (new_tokens − 1) / (wall_s − prefill_s) (the prefill makes the first
token), so prediction and measurement count the same tokens and the same seconds.
"""

from __future__ import annotations

import duckdb
import pandas as pd

from runner.store import comparable, round_counts
from runner.store.metrics import Filters

GROUP = ("target", "device", "kernels", "threads", "batch_size")  # a setup: what the measured costs belong to
KEY = (*GROUP, "mode", "category", "draft")
CURVE = (*GROUP, "category", "draft")  # a verify curve per category and draft (see v(r) above)
WITHIN = 0.03  # a predicted best k "hits" when its measured speed is within 3% of the measured best
# The runs v may be read from: every pass's rows known (migration `add_pass_rows` left lookahead's earlier
# rounds NULL: their window was not recorded, so their passes would read as narrow ones at a wide one's cost).
ROWS_KNOWN = "coalesce(len(list_filter(widths, lambda o: o.rows IS NULL)), 0) = 0"
# Runs recorded before `threads` existed have none; 0 (never a real thread count) stands for it inside the query,
# because USING joins never match NULLs.
_THREADS = "coalesce(threads, 0) AS threads"


def _same(a: str, b: str, columns: tuple[str, ...]) -> str:
    """A join condition: `a` and `b` agree on every column, NULLs included."""
    return " AND ".join(f"{a}.{c} IS NOT DISTINCT FROM {b}.{c}" for c in columns)


def advisor_sql(filters: Filters) -> tuple[str, list]:
    """Per key × k from 1 to the largest fixed k recorded: the prediction and, where a fixed-k run was recorded,
    the measurement."""
    key, group = ", ".join(KEY), ", ".join(GROUP)
    curve_key = ", ".join(CURVE)
    spec_where, spec_params = filters.where()
    base_where, base_params = filters.where(skip=("draft", "k", "k_policy"))
    comparable_runs, comparable_params = comparable.comparable_runs_sql(filters)
    positions = round_counts.positions_pooled(key, "SELECT * FROM fixed")  # the runs `depth` counts, no others
    return f"""
    WITH picked AS (
        SELECT * REPLACE ({_THREADS}) FROM run_facts WHERE run_id IN ({comparable_runs})
            AND ((draft <> 'none' AND {spec_where}) OR (draft = 'none' AND {base_where}))
            AND {ROWS_KNOWN}),
    fixed AS (SELECT * FROM picked WHERE k_policy = 'fixed'),
    measured AS (SELECT {key}, k, count(*) AS runs, sum(new_tokens - 1) / sum(wall_s - prefill_s) AS tokens_per_s
        FROM fixed GROUP BY ALL),
    costs AS (
        SELECT {key}, sum(draft_s) / nullif(sum(drafted), 0) AS draft_token_s,
            sum(wall_s - prefill_s - batch_size * draft_s - verify_s) / sum(n_rounds) AS loop_s,
            alpha(sum(accepted), sum(rejected)) AS alpha
        FROM fixed WHERE drafted IS NOT NULL GROUP BY ALL),
    baseline AS (SELECT {group}, mode, category, sum(new_tokens - 1) / sum(wall_s - prefill_s) AS tokens_per_s
        FROM picked WHERE draft = 'none' GROUP BY ALL),
    passes AS (  -- a batch's shared passes: the members it carried, each padded to the widest member's rows
        SELECT {", ".join(f"p.{c}" for c in KEY)}, p.k, p.k_policy, count(*) AS members,
            count(*) * max(x.pass_rows) AS rows, any_value(x.verify_s) AS verify_s
        FROM picked p JOIN runs USING (run_id) JOIN rounds x USING (run_id) WHERE p.batch_size > 1
        GROUP BY {", ".join(f"p.{c}" for c in KEY)}, p.k, p.k_policy, runs.batch_id, x.round),
    timed AS (  -- every draft's passes by their rows: how many, and their seconds
        SELECT {curve_key}, o.rows, sum(o.rounds) AS n, sum(o.verify_s) AS seconds
            FROM (SELECT {curve_key}, unnest(widths) AS o FROM picked WHERE batch_size = 1) GROUP BY ALL
        UNION ALL BY NAME
        SELECT {curve_key}, rows, count(*) AS n, sum(verify_s) AS seconds FROM passes GROUP BY ALL),
    surface AS (  -- v(r): a draft's mean verify pass over r rows, from its own passes and plain decoding's
        SELECT {", ".join(f"d.{c}" for c in CURVE)}, t.rows, sum(t.seconds) / sum(t.n) AS verify_s
        FROM (SELECT DISTINCT {curve_key} FROM picked WHERE draft <> 'none') d
            JOIN timed t ON {_same("t", "d", (*GROUP, "category"))}
                AND t.draft IN (d.draft, 'none')
        GROUP BY ALL),
    grid AS (SELECT {curve_key}, g.rows, v.verify_s
        FROM (SELECT {curve_key}, max(rows) AS top FROM surface GROUP BY ALL) m
        CROSS JOIN LATERAL range(1, m.top + 1) g(rows) LEFT JOIN surface v USING ({curve_key}, rows)),
    neighbours AS (SELECT *,
            last_value(verify_s IGNORE NULLS) OVER below AS lo,
            last_value(CASE WHEN verify_s IS NOT NULL THEN rows END IGNORE NULLS) OVER below AS lo_r,
            first_value(verify_s IGNORE NULLS) OVER above AS hi,
            first_value(CASE WHEN verify_s IS NOT NULL THEN rows END IGNORE NULLS) OVER above AS hi_r
        FROM grid WINDOW below AS (PARTITION BY {curve_key} ORDER BY rows),
            above AS (PARTITION BY {curve_key} ORDER BY rows ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING)),
    curve AS (SELECT {curve_key}, rows,
            coalesce(verify_s, lo + (hi - lo) * (rows - lo_r) / (hi_r - lo_r), hi) AS verify_s FROM neighbours),
    live AS (  -- how many sequences a member's passes carried (its own included), as a share of its passes
        SELECT {key}, live, n / sum(n) OVER (PARTITION BY {key}) AS share
            FROM (SELECT {key}, members AS live, sum(members) AS n FROM passes WHERE k_policy = 'fixed' GROUP BY ALL)
        UNION ALL BY NAME
        SELECT DISTINCT {key}, 1 AS live, 1.0 AS share FROM fixed WHERE batch_size = 1),
    depth AS (SELECT {key}, g.position, sum(drafting_rounds) AS rounds
        FROM fixed CROSS JOIN LATERAL range(1, k + 1) g(position) GROUP BY ALL),
    positions AS ({positions}),
    shares AS (  -- of the rounds that drafted: the share that accepted, and that drafted, at least `position`
        SELECT {key}, position, coalesce(p.accepted, 0) / d.rounds AS s, coalesce(p.proposed, 0) / d.rounds AS w
        FROM depth d LEFT JOIN positions p USING ({key}, position)),
    idle AS (  -- the rounds that drafted nothing, one token each, as a share of all the tokens the rounds emitted
        SELECT {key}, sum(n_rounds - coalesce(drafting_rounds, 0)) / nullif(sum(n_rounds + accepted), 0) AS f
        FROM fixed GROUP BY ALL),
    mix AS (  -- at k, the share of rounds that draft: r / (f + r), r = (1 − f) / (1 + Σ_{{i≤k}} s_i) a token
        SELECT {key}, k, r / (f + r) AS p FROM (
            SELECT {key}, x.position AS k, i.f, (1 - i.f) / (1 + sum(x.s) OVER upto) AS r
            FROM shares x JOIN idle i USING ({key}) WINDOW upto AS (PARTITION BY {key} ORDER BY x.position))),
    -- with L sequences live a pass is L · (W + 1) rows, W the widest member's drafts: at least i when any of them
    -- drafted that far, 1 − (1 − p·w_i)^L of the passes; past the most rows measured, no prediction (NULL)
    by_live AS (SELECT {key}, l.live, l.share, m.k, 1 + m.p * sum(x.s) AS emitted, m.p * sum(x.w) AS drafted,
            one.verify_s AS one_pass_s,
            one.verify_s + sum((1 - pow(1 - m.p * x.w, l.live)) * (wider.verify_s - narrower.verify_s)) AS verify_s,
            bool_and(x.w = 0 OR wider.verify_s IS NOT NULL) AS known
        FROM mix m JOIN shares x USING ({key}) JOIN live l USING ({key})
            LEFT JOIN curve one ON {_same("one", "x", CURVE)}
                AND one.rows = l.live
            LEFT JOIN curve narrower ON {_same("narrower", "x", CURVE)}
                AND narrower.rows = l.live * x.position
            LEFT JOIN curve wider ON {_same("wider", "x", CURVE)}
                AND wider.rows = l.live * (x.position + 1)
        WHERE x.position <= m.k GROUP BY {key}, l.live, l.share, m.k, m.p, one.verify_s),
    chains AS (SELECT {key}, k, any_value(emitted) AS emitted, any_value(drafted) AS drafted,
            CASE WHEN bool_and(known) THEN sum(share * verify_s) END AS verify_s,
            sum(share * one_pass_s) AS one_pass_s
        FROM by_live GROUP BY ALL),
    per_k AS (SELECT {key}, k, sum(drafted) / sum(n_rounds) AS nodes, sum(draft_s) / sum(n_rounds) AS round_draft_s,
            -- passes wider than the levels drafted (a tree, lookahead's window): Σ rounds · width > Σ rounds · depth
            sum(coalesce(list_sum(list_transform(widths, lambda o: (o.rows - 1) * o.rounds)), 0))
                > sum(coalesce(list_sum(list_transform(outcomes, lambda o: o.depth * o.rounds)), 0)) AS wider
        FROM fixed WHERE drafted IS NOT NULL GROUP BY ALL),
    tree_rows AS (  -- how often a tree's member was in a pass of each size: its rounds' at batch 1, its batch's else
        SELECT {key}, k, o.rows, sum(o.rounds) AS n
            FROM (SELECT {key}, k, unnest(widths) AS o FROM fixed WHERE batch_size = 1) GROUP BY ALL
        UNION ALL BY NAME
        SELECT {key}, k, rows, sum(members) AS n FROM passes WHERE k_policy = 'fixed' GROUP BY ALL),
    shapes AS (SELECT *, bool_or(wider) OVER (PARTITION BY {key}) AS tree FROM per_k),
    tree_verify AS (SELECT h.*, sum(n * c.verify_s) / sum(n) AS verify_s
        FROM shapes h JOIN tree_rows t USING ({key}, k) JOIN curve c USING ({curve_key}, rows)
        WHERE h.tree GROUP BY ALL),
    predicted AS (
        SELECT c.*, batch_size * c.drafted * d.draft_token_s AS draft_s
            FROM chains c JOIN costs d USING ({key}) ANTI JOIN tree_verify USING ({key})
        UNION ALL BY NAME
        SELECT c.* REPLACE (t.nodes AS drafted, t.verify_s AS verify_s), batch_size * t.round_draft_s AS draft_s
            FROM chains c JOIN tree_verify t USING ({key}, k))
    SELECT {", ".join(c for c in KEY if c != "threads")}, nullif(threads, 0) AS threads, k, p.emitted, p.drafted,
        p.emitted / (p.draft_s + p.verify_s + c.loop_s) AS predicted_tokens_per_s,
        m.tokens_per_s AS measured_tokens_per_s, m.runs, b.tokens_per_s AS baseline_tokens_per_s, c.alpha,
        formula_speedup(c.alpha, k, draft_cost(c.draft_token_s, p.one_pass_s)) * b.tokens_per_s
            AS formula_tokens_per_s
    FROM predicted p JOIN costs c USING ({key}) LEFT JOIN measured m USING ({key}, k)
        LEFT JOIN baseline b USING ({group}, mode, category)
    ORDER BY {key}, k""", comparable_params + spec_params + base_params


def _evaluate(con: duckdb.DuckDBPyConnection, filters: Filters) -> None:
    """`advisor_sql` with each prediction's error against the measurement (NULL where none was recorded), into the
    connection's temporary table `advisor_curve`, which the advice then reads: one evaluation for both."""
    sql, params = advisor_sql(filters)
    con.execute(f"""CREATE OR REPLACE TEMP TABLE advisor_curve AS
        SELECT *, predicted_tokens_per_s / measured_tokens_per_s - 1 AS error,
            formula_tokens_per_s / measured_tokens_per_s - 1 AS formula_error FROM ({sql})""", params)


def _curve(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    return con.execute(f"SELECT * FROM advisor_curve ORDER BY {', '.join(KEY)}, k").df()


def k_curve(con: duckdb.DuckDBPyConnection, filters: Filters) -> pd.DataFrame:
    """Per key × k from 1 to the largest fixed k recorded: the prediction, the measurement where one was recorded,
    and the prediction's error against it (NULL where none was)."""
    _evaluate(con, filters)
    return _curve(con)


def k_advice(con: duckdb.DuckDBPyConnection, filters: Filters) -> pd.DataFrame:
    """Per key: the advisor's best k (over every k it predicts) and its best among the recorded ks, the measured
    best fixed k, whether the prediction hit (the measured speed at the advisor's best k within WITHIN of the
    measured best; NULL where no run was recorded at that k: the prediction cannot be judged),
    the mean |error| of the advisor and of the flat formula over the recorded ks, the fastest measured adaptive
    policy, and the recommendation: that policy where it beat every fixed k, else the advisor's k, fixed."""
    _evaluate(con, filters)
    return _advice(con, filters)


def k_answer(con: duckdb.DuckDBPyConnection, filters: Filters) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`k_advice` and `k_curve` from one evaluation of the advisor (the Compare page shows both)."""
    _evaluate(con, filters)
    return _advice(con, filters), _curve(con)


def _advice(con: duckdb.DuckDBPyConnection, filters: Filters) -> pd.DataFrame:
    key = ", ".join(KEY)
    where, adaptive_params = filters.where()
    comparable_runs, comparable_params = comparable.comparable_runs_sql(filters)
    return con.execute(f"""
        WITH curve AS (SELECT * FROM advisor_curve),
        summary AS (SELECT {key}, arg_max(k, predicted_tokens_per_s) AS predicted_best_k,
                arg_max(k, predicted_tokens_per_s) FILTER (measured_tokens_per_s IS NOT NULL) AS predicted_recorded_k,
                arg_max_null(measured_tokens_per_s, predicted_tokens_per_s) AS measured_at_predicted,
                arg_max(k, measured_tokens_per_s) AS measured_best_k, max(measured_tokens_per_s) AS measured_best,
                avg(abs(predicted_tokens_per_s / measured_tokens_per_s - 1)) AS advisor_error,
                avg(abs(formula_tokens_per_s / measured_tokens_per_s - 1)) AS formula_error
            FROM curve GROUP BY ALL),
        adaptive AS (SELECT {", ".join(c for c in KEY if c != "threads")}, threads, k_policy, k,
                sum(new_tokens - 1) / sum(wall_s - prefill_s) AS tokens_per_s
            FROM runs WHERE status = 'ok' AND draft <> 'none' AND k_policy <> 'fixed' AND {where}
                AND run_id IN ({comparable_runs}) GROUP BY ALL),
        best_adaptive AS (SELECT {key}, arg_max(k_policy, tokens_per_s) AS adaptive_policy,
                arg_max(k, tokens_per_s) AS adaptive_k, max(tokens_per_s) AS adaptive_best
            FROM adaptive GROUP BY ALL),
        joined AS (SELECT s.*, a.adaptive_policy, a.adaptive_k, a.adaptive_best, a.adaptive_best > s.measured_best
                AS adaptive_wins FROM summary s LEFT JOIN best_adaptive a
            ON {" AND ".join(f"a.{c} IS NOT DISTINCT FROM s.{c}" for c in KEY)})
        SELECT *, measured_at_predicted >= (1 - {WITHIN}) * measured_best AS hit,
            CASE WHEN adaptive_wins THEN adaptive_policy ELSE 'fixed' END AS recommended_policy,
            CASE WHEN adaptive_wins THEN adaptive_k ELSE predicted_best_k END AS recommended_k
        FROM joined ORDER BY {key}""", adaptive_params + comparable_params).df()


def positions(con: duckdb.DuckDBPyConnection, filters: Filters) -> pd.DataFrame:
    """Per target × mode × draft × position: `position_stats` pooled over k and policy (a draft's chance at position
    i, once the round reached it, does not depend on how many more it was asked for) and over the selected
    categories, so its rate is the accepted over the reached summed over them, not a mean of their rates."""
    where, params = filters.where()
    pooled = round_counts.positions_pooled("target, mode, draft", f"SELECT * FROM run_facts WHERE {where}")
    return con.execute(f"""SELECT *, alpha(accepted, reached - accepted) AS rate FROM ({pooled})
        ORDER BY ALL""", params).df()
