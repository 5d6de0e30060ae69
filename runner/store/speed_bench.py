"""SPEED-Bench's report from recorded runs: the per-category acceptance matrix of its qualitative split, and
acceptance and speedup by input length over its throughput splits, by the definitions vLLM's `bench serve` and
SPEED-Bench use.

A run is SPEED-Bench's when its prompt id is `<split>-<line>` (`runner/speed_bench_files.py`); the split is read back
from the id. Over the rounds of a method's runs that drafted (k > 0: vLLM's "drafts"; a round whose drafter found
nothing to propose is no draft there):

- τ, mean acceptance length, the bonus token included = 1 + accepted / drafts (vLLM `spec_decode_acceptance_length`);
- acceptance rate = accepted / drafted tokens (vLLM `spec_decode_acceptance_rate`, there in percent): thrown drafts
  count against it;
- α = accepted / (accepted + rejected) (the project's α: thrown drafts were never judged);
- per-position acceptance at i = drafts that accepted at least i tokens / drafts (vLLM
  `num_accepted_tokens_per_pos[i] / num_drafts`, unconditional), so τ = 1 + their sum;
- speedup (throughput splits) = the method's tokens per second over its baselines' (Σ new tokens / Σ wall seconds of
  the same prompts), as an output-throughput ratio is taken at one request at a time.
"""

from __future__ import annotations

import duckdb
import pandas as pd

from runner.store import spec_bench

QUALITATIVE = "qualitative"
ALL = "all"
# The ids runner/speed_bench_files.py gives SPEED-Bench's prompts, `<split>-<line>`; the first group is the split.
PROMPT_ID = r"^(qualitative|throughput_\d+k)-\d+$"
# A method is one decoding of one draft at one k and policy, on one engine.
KEYS = ["engine", *spec_bench.ROW_KEYS]


def engine_column(con: duckdb.DuckDBPyConnection) -> str:
    """The engine a run was decoded by: `runs.engine` where the file records it, else this project's own."""
    found = con.execute("SELECT 1 FROM information_schema.columns WHERE table_name = 'runs' AND "
                        "column_name = 'engine'").fetchone()
    return "r.engine" if found else "'specdash'"


def _histogram(con: duckdb.DuckDBPyConnection, sweep_ids: tuple[str, ...]) -> pd.DataFrame:
    """Per method × split × category × accepted count: the drafts that accepted that many, and their sums."""
    keys = ", ".join(f"r.{key}" for key in spec_bench.ROW_KEYS)
    return con.execute(f"""
        SELECT {engine_column(con)} AS engine, {keys}, regexp_extract(r.prompt_id, '{PROMPT_ID}', 1) AS split,
               r.category, o.accepted, count(*) AS drafts, sum(o.k)::BIGINT AS drafted,
               sum(o.rejected)::BIGINT AS rejected, max(o.k) AS k_max
        FROM runs r JOIN rounds o USING (run_id)
        WHERE list_contains(?, r.sweep_id) AND r.status = 'ok' AND r.draft <> 'none' AND o.k > 0
              AND regexp_matches(r.prompt_id, '{PROMPT_ID}')
        GROUP BY ALL ORDER BY ALL""", [list(sweep_ids)]).df()


def _pooled(rows: pd.DataFrame) -> dict[str, float]:
    """τ, acceptance rate, α and the per-position rates of a group's histogram rows."""
    drafts = rows["drafts"].sum()
    accepted = (rows["accepted"] * rows["drafts"]).sum()
    judged = accepted + rows["rejected"].sum()
    out = {"drafts": int(drafts), "tau": 1 + accepted / drafts, "acceptance_rate": accepted / rows["drafted"].sum(),
           "alpha": accepted / judged if judged else float("nan")}
    for i in range(1, int(rows["k_max"].max()) + 1):
        out[f"p{i}"] = rows.loc[rows["accepted"] >= i, "drafts"].sum() / drafts
    return out


def acceptance(con: duckdb.DuckDBPyConnection, sweep_ids: tuple[str, ...]) -> pd.DataFrame:
    """The matrix of the sweeps' runs in long form: one row per engine × method × category of the qualitative
    split, and one for the categories pooled (`all`), with drafts, τ, acceptance rate, α and p1..pk (per-position
    acceptance)."""
    hist = _histogram(con, sweep_ids)
    hist = hist[hist["split"] == QUALITATIVE]
    rows = []
    for _, method in hist.groupby(KEYS, dropna=False, sort=True):
        head = {"engine": method.iloc[0]["engine"], "method": spec_bench.label(method.iloc[0])}
        for category, group in method.groupby("category", sort=True):
            rows.append({**head, "category": category, **_pooled(group)})
        rows.append({**head, "category": ALL, **_pooled(method)})
    return _ordered(pd.DataFrame(rows), ["engine", "method", "category"])


def _ordered(frame: pd.DataFrame, head: list[str]) -> pd.DataFrame:
    """Columns in a fixed order, the positions last, p1 before p10."""
    positions = sorted((c for c in frame.columns if c[:1] == "p" and c[1:].isdigit()), key=lambda c: int(c[1:]))
    fixed = [*head, "drafts", "tau", "acceptance_rate", "alpha"]
    return frame.reindex(columns=[*fixed, *(c for c in frame.columns if c not in fixed and c not in positions),
                                  *positions])


def split_tokens(split: str) -> int:
    """A throughput split's nominal input length in tokens: throughput_8k -> 8000."""
    return int(split.removeprefix("throughput_").removesuffix("k")) * 1000


def by_length(con: duckdb.DuckDBPyConnection, sweep_ids: tuple[str, ...]) -> pd.DataFrame:
    """One row per engine × method × throughput split, shortest first: the mean prompt length, drafts, τ,
    acceptance rate, α, p1..pk and the speedup over plain decoding of the same prompts."""
    hist = _histogram(con, sweep_ids)
    hist = hist[hist["split"] != QUALITATIVE]
    rows = [{**dict(zip([*KEYS, "split"], key, strict=True)), "method": spec_bench.label(group.iloc[0]),
             **_pooled(group)} for key, group in hist.groupby([*KEYS, "split"], dropna=False, sort=True)]
    if not rows:
        return _ordered(pd.DataFrame(rows), ["engine", "method", "split", "bucket", "prompt_tokens", "speedup"])
    # pandas merges missing keys (a baseline's policy) as equal, as the groups above were made
    frame = pd.DataFrame(rows).merge(_speeds(con, sweep_ids), on=[*KEYS, "split"], how="left")
    frame["bucket"] = frame["split"].str.removeprefix("throughput_")
    frame["order"] = frame["split"].map(split_tokens)
    frame = frame.sort_values(["engine", "method", "order"], ignore_index=True)
    return _ordered(frame.drop(columns=[*spec_bench.ROW_KEYS, "order"]),
                    ["engine", "method", "split", "bucket", "prompt_tokens", "speedup"])


def _speeds(con: duckdb.DuckDBPyConnection, sweep_ids: tuple[str, ...]) -> pd.DataFrame:
    """Per method × split: the mean prompt length and Σtokens/Σseconds over the same for its baselines."""
    keys = ", ".join(f"r.{key}" for key in spec_bench.ROW_KEYS)
    return con.execute(f"""
        SELECT {engine_column(con)} AS engine, {keys}, regexp_extract(r.prompt_id, '{PROMPT_ID}', 1) AS split,
               avg(len(r.prompt_tokens)) AS prompt_tokens,
               (sum(r.new_tokens) / sum(r.wall_s)) / (sum(b.new_tokens) / sum(b.wall_s)) AS speedup
        FROM runs r JOIN runs b ON b.run_id = r.baseline_run_id
        WHERE list_contains(?, r.sweep_id) AND r.status = 'ok' AND b.status = 'ok' AND r.draft <> 'none'
              AND regexp_matches(r.prompt_id, '{PROMPT_ID}')
        GROUP BY ALL""", [list(sweep_ids)]).df()


def sweeps(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The file's sweeps with a speculative run of a SPEED-Bench prompt, newest first."""
    return [sweep for sweep, _ in _sweep_engines(con)]


def _sweep_engines(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str]]:
    """`sweeps`, each with its engine (a sweep runs on one)."""
    return [tuple(row) for row in con.execute(
        f"SELECT sweep_id, any_value({engine_column(con).removeprefix('r.')}) FROM runs GROUP BY sweep_id "
        f"HAVING bool_or(draft <> 'none' AND regexp_matches(prompt_id, '{PROMPT_ID}')) "
        "ORDER BY min(started_at) DESC, sweep_id").fetchall()]


def beside_other_engines(con: duckdb.DuckDBPyConnection, sweep_id: str | None = None) -> tuple[str, ...]:
    """The sweep (default: the newest with SPEED-Bench prompts), then the newest such sweep of each other engine,
    so one report sets the engines side by side on the benchmark; a sweep without SPEED-Bench prompts alone."""
    found = _sweep_engines(con)
    engines = dict(found)
    if sweep_id is None and found:
        sweep_id = found[0][0]
    if sweep_id not in engines:
        return () if sweep_id is None else (sweep_id,)
    newest = {}
    for sweep, engine in found:
        newest.setdefault(engine, sweep)
    return (sweep_id, *(sweep for engine, sweep in newest.items() if engine != engines[sweep_id]))


def _cell(value: object, suffix: str = "") -> str:
    return "–" if value is None or pd.isna(value) else f"{value:.2f}{suffix}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| --- |" + " :---: |" * (len(header) - 1)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def matrix_markdown(matrix: pd.DataFrame, metric: str) -> str:
    """One engine's matrix of one metric: a row per method, a column per category, `all` last."""
    categories = [c for c in dict.fromkeys(matrix["category"]) if c != ALL] + [ALL]
    wide = matrix.pivot(index="method", columns="category", values=metric)
    return _table(["method", *categories], [[method, *(_cell(wide.loc[method].get(c)) for c in categories)]
                                            for method in wide.index])


def positions_markdown(matrix: pd.DataFrame) -> str:
    """One engine's per-position acceptance: a row per method × category."""
    positions = [c for c in matrix.columns if c[:1] == "p" and c[1:].isdigit() and matrix[c].notna().any()]
    return _table(["method", "category", *(f"pos {c[1:]}" for c in positions)],
                  [[r["method"], r["category"], *(_cell(r[c]) for c in positions)] for _, r in matrix.iterrows()])


def length_markdown(lengths: pd.DataFrame) -> str:
    """One engine's throughput splits: a row per method × split."""
    return _table(["method", "split", "prompt tokens", "τ", "α", "acceptance rate", "speedup"],
                  [[r["method"], r["split"], "–" if pd.isna(r["prompt_tokens"]) else f"{r['prompt_tokens']:.0f}",
                    _cell(r["tau"]), _cell(r["alpha"]), _cell(r["acceptance_rate"]), _cell(r["speedup"], "x")]
                   for _, r in lengths.iterrows()])


def markdown(matrix: pd.DataFrame, lengths: pd.DataFrame) -> str:
    """The whole report, engine by engine: τ and α by category, per-position acceptance, then by input length."""
    parts = []
    for engine in sorted(set(matrix["engine"]) | set(lengths["engine"])):
        m, n = matrix[matrix["engine"] == engine], lengths[lengths["engine"] == engine]
        if len(m):
            parts += [f"## {engine}: τ by category (qualitative)", matrix_markdown(m, "tau"),
                      f"## {engine}: α by category (qualitative)", matrix_markdown(m, "alpha"),
                      f"## {engine}: per-position acceptance (qualitative)", positions_markdown(m)]
        if len(n):
            parts += [f"## {engine}: by input length (throughput splits)", length_markdown(n)]
    return "\n\n".join(parts)
