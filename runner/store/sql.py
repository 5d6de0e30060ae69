"""User SQL over runs.duckdb, sandboxed (docs/design.md, "Untrusted SQL"); shared by `runner sql` and the dashboard.

Two layers: a statement check (exactly one statement, and only a read) before DuckDB sees the
text, then a read-only connection whose configuration forbids file access, extensions and any
change of settings, and bounds time and memory. The settings are defence in depth, not an OS
sandbox.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pandas as pd

from runner.store.connect import READ_BOUND_S, Locked, open_db, upgrade
from runner.store.schema import StoreError

_SANDBOX = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "threads": 2,
    "memory_limit": "512MB",
    "lock_configuration": True,  # no SET, RESET or PRAGMA can loosen the settings above
}
# PRAGMAs that only read; every other PRAGMA sets something (or is a function call in disguise).
_READ_PRAGMAS = {"table_info", "show_tables", "show_tables_expanded", "database_list", "database_size",
                 "storage_info", "version", "platform", "functions", "collations"}
# Table functions that read files. DuckDB exempts a connection's own database file and WAL from
# enable_external_access = false, so these are refused by name too; query() would run a string past this check.
_FILE_FUNCTION_PREFIXES = ("read_", "parquet_")
_FILE_FUNCTION_SUFFIX = "_scan"
_FILE_FUNCTIONS = {"glob", "sniff_csv", "query", "query_table"}
_READ_ONLY_REFUSAL = "refused: only read statements (SELECT, WITH, VALUES, DESCRIBE, SHOW, EXPLAIN) are allowed"


class QueryError(Exception):
    """A one-line, user-facing reason why a query was refused or failed."""


@dataclass(frozen=True)
class QueryResult:
    columns: list[str]
    frame: pd.DataFrame  # at most max_rows rows
    truncated: bool  # the query had more rows than max_rows
    elapsed_s: float  # execution and fetch, not the connection


def _words(sql: str) -> list[tuple[int, str]]:
    """(offset, lower-cased text) of each token, comments dropped."""
    tokens = duckdb.tokenize(sql)
    ends = [start for start, _ in tokens[1:]] + [len(sql)]
    return [(start, sql[start:end].strip().lower())
            for (start, kind), end in zip(tokens, ends, strict=True) if kind != duckdb.token_type.comment]


def _is_read(statement: duckdb.Statement) -> bool:
    kind = statement.type
    if kind == duckdb.StatementType.SELECT:  # also WITH, VALUES, FROM-first, DESCRIBE, SHOW, SUMMARIZE
        return True
    words = _words(statement.query)
    texts = [text for _, text in words]
    if kind == duckdb.StatementType.MULTI:  # PIVOT expands to several statements, all reads
        return texts[:1] == ["pivot"]
    if kind == duckdb.StatementType.PRAGMA:
        return len(texts) > 1 and texts[1] in _READ_PRAGMAS and "=" not in texts
    if kind == duckdb.StatementType.EXPLAIN:
        # EXPLAIN ANALYZE runs its statement, so what it explains must itself be a plain read.
        inner = 2 if texts[1:2] in (["analyze"], ["analyse"]) else 1
        return len(words) > inner and _single(statement.query[words[inner][0]:]).type == duckdb.StatementType.SELECT
    return False


def _single(sql: str) -> duckdb.Statement:
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as error:
        raise QueryError(_first_line(error)) from None
    if not statements:
        raise QueryError("empty query")
    if len(statements) > 1:
        raise QueryError("refused: only one statement at a time")
    return statements[0]


def _file_function(words: list[tuple[int, str]]) -> str | None:
    """The first call of a file-reading table function among the tokens, if any."""
    for (_, name), (_, after) in zip(words, words[1:], strict=False):
        name = name.strip('"')
        if after == "(" and (name.startswith(_FILE_FUNCTION_PREFIXES) or name.endswith(_FILE_FUNCTION_SUFFIX)
                             or name in _FILE_FUNCTIONS):
            return name
    return None


def check_statement(sql: str) -> str:
    """The one read statement in `sql`, or QueryError saying why it is refused."""
    statement = _single(sql)
    if name := _file_function(_words(statement.query)):
        raise QueryError(f"refused: file access is disabled ({name} reads files)")
    try:
        readable = _is_read(statement)
    except QueryError:
        readable = False
    if not readable:
        raise QueryError(_READ_ONLY_REFUSAL)
    return statement.query


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0]


def _failure(error: duckdb.Error, timeout_ms: int) -> QueryError:
    if isinstance(error, duckdb.InterruptException):
        return QueryError(f"time limit of {timeout_ms / 1000:g} s reached")
    if isinstance(error, duckdb.OutOfMemoryException):
        return QueryError(f"memory limit reached ({_SANDBOX['memory_limit']})")
    if isinstance(error, duckdb.PermissionException):
        return QueryError(f"file access is disabled ({_first_line(error)})")
    return QueryError(_first_line(error))


def run_query(db_path: str | os.PathLike, sql: str, max_rows: int = 10_000, timeout_ms: int = 5000,
              lock_bound_s: float = READ_BOUND_S) -> QueryResult:
    """Run one read statement on a read-only, sandboxed connection; at most max_rows rows. The statement may run
    `timeout_ms`; opening the file may wait `lock_bound_s` for a write, as a dashboard page does."""
    statement = check_statement(sql)
    if not Path(db_path).is_file():
        raise QueryError(f"no database at {db_path}")
    config = {"max_execution_time": timeout_ms, **_SANDBOX}
    try:
        upgrade(db_path, lock_bound_s)  # the examples read the metric macros, which an older file lacks
        con, _ = open_db(db_path, read_only=True, bound_s=lock_bound_s, config=config)
    except Locked:
        raise QueryError(f"{db_path} is busy (a run is being recorded); try again") from None
    except StoreError as error:
        raise QueryError(str(error)) from None
    try:
        started = time.perf_counter()
        cursor = con.execute(statement)
        rows = cursor.fetchmany(max_rows + 1)
        columns = [d[0] for d in cursor.description]
    except duckdb.Error as error:
        raise _failure(error, timeout_ms) from None
    finally:
        con.close()
    frame = pd.DataFrame(rows[:max_rows], columns=columns)
    return QueryResult(columns, frame, len(rows) > max_rows, time.perf_counter() - started)


# The pooled numbers read the macros that define them once (docs/reference.md, "Metric macros"), so these give
# exactly what the Overview and `runner sweep` show for the same cell.
EXAMPLES: dict[str, str] = {
    "α per category × draft × k": """\
SELECT target, mode, category, draft, k, k_policy, count(*) AS runs,
       round(alpha(sum(accepted), sum(rejected)), 3) AS alpha, round(avg(tau), 2) AS tau,
       round(geomean(measured_speedup), 2) AS measured_speedup
FROM run_stats WHERE draft <> 'none'
GROUP BY ALL ORDER BY target, mode, category, draft, k, k_policy""",
    "thrown-away drafts": """\
SELECT draft, k, sum(thrown) AS thrown, sum(drafted) AS drafted,
       round(thrown_share(sum(thrown), sum(drafted)), 3) AS thrown_share
FROM run_stats WHERE draft <> 'none'
GROUP BY ALL ORDER BY thrown_share DESC""",
    "best k per category and draft (measured speedup)": """\
SELECT target, mode, category, draft, arg_max(k, speedup) AS best_k, arg_max(k_policy, speedup) AS policy,
       round(max(speedup), 2) AS speedup
FROM (SELECT target, mode, category, draft, k, k_policy, geomean(measured_speedup) AS speedup
      FROM run_stats WHERE draft <> 'none' GROUP BY ALL)
GROUP BY ALL ORDER BY target, mode, category, speedup DESC""",
    "each draft-length policy against the best fixed k": """\
WITH cells AS (SELECT target, mode, category, draft, k, k_policy, geomean(measured_speedup) AS speedup
               FROM run_stats WHERE draft <> 'none' GROUP BY ALL),
best AS (SELECT target, mode, category, draft, arg_max(k, speedup) AS best_k, max(speedup) AS best_fixed
         FROM cells WHERE k_policy = 'fixed' GROUP BY ALL)
SELECT target, mode, category, draft, k_policy, k AS start_k, round(speedup, 3) AS speedup, best_k,
       round(best_fixed, 3) AS best_fixed, round(speedup / best_fixed, 3) AS of_best_fixed
FROM cells JOIN best USING (target, mode, category, draft) WHERE k_policy <> 'fixed'
ORDER BY target, mode, draft, k_policy, start_k, category""",
    "speedup by batch size (where speculation stops paying)": """\
SELECT draft, k, k_policy, category, batch_size, sum(runs) AS runs, round(avg(measured_speedup), 2) AS speedup,
       round(avg(tokens_per_s_per_batch), 1) AS batch_tokens_per_s
FROM batch_stats WHERE draft <> 'none'
GROUP BY ALL ORDER BY draft, k, k_policy, category, batch_size""",
    "acceptance by context length": """\
SELECT draft, category, context_from, sum(rounds) AS rounds, alpha(sum(accepted), sum(rejected)) AS alpha,
       tau(sum(emitted), sum(rounds)) AS tau
FROM context_stats GROUP BY ALL ORDER BY ALL""",
    "the formula at your own α, k and c": """\
SELECT k, round(formula_speedup(0.7, k, 0.05), 2) AS predicted_speedup
FROM range(1, 9) t(k)""",
    "how each number is defined": """\
SELECT function_name, parameters, macro_definition
FROM duckdb_functions() WHERE function_type = 'macro' AND NOT internal ORDER BY function_name""",
    "lossless failures": """\
SELECT run_id, sweep_id, category, prompt_id, draft, k, dtype, device, baseline_run_id
FROM runs WHERE lossless = false ORDER BY started_at DESC""",
    "slowest rounds": """\
SELECT r.run_id, s.draft, r.round, r.k, r.accepted, round(r.draft_s * 1000, 1) AS draft_ms,
       round(r.verify_s * 1000, 1) AS verify_ms
FROM rounds r JOIN runs s USING (run_id)
ORDER BY r.draft_s + r.verify_s DESC LIMIT 20""",
    "accepted drafts per round (histogram)": """\
SELECT s.draft, r.k, r.accepted, count(*) AS rounds
FROM rounds r JOIN runs s USING (run_id) WHERE s.draft <> 'none'
GROUP BY ALL ORDER BY s.draft, r.k, r.accepted""",
}
