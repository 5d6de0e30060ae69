"""Spec-Bench's leaderboard from recorded runs, by its own definitions (its `evaluation/speed.py`), and acceptance by
context length.

A question is a conversation (`runs.conversation`): its tokens and seconds are summed over its turns, and its speed
is tokens / seconds. A column's speedup is the mean speed of the method's questions over the mean speed of the same
questions' baselines (each turn timed against the baseline it was checked against, `runs.baseline_run_id`): a ratio
of arithmetic means, not the project's geometric mean of per-run ratios. "#Mean Accepted Tokens" is the mean over
all of a method's decoding steps (target passes, the prefill's included) of the tokens each commits: new tokens /
target passes, pooled over every run, so 1.00 for plain decoding.
"""

from __future__ import annotations

import duckdb
import pandas as pd

MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
# The leaderboard's columns, in its order, each with the categories of question.jsonl it pools.
COLUMNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Multi-turn Conversation", MT_BENCH),
    ("Translation", ("translation",)),
    ("Summarization", ("summarization",)),
    ("Question Answering", ("qa",)),
    ("Mathematical Reasoning", ("math_reasoning",)),
    ("Retrieval-aug. Generation", ("rag",)),
)
MEAN_ACCEPTED = "#Mean Accepted Tokens"
OVERALL = "Overall"
ROW_KEYS = ["draft", "k", "k_policy", "mode", "temperature", "top_p"]

# Per method (a draft at a k and policy, in one decoding) and question: the sums over its turns, its own and its
# baselines'. Only turns recorded 'ok' with an 'ok' baseline count, on both sides alike.
_QUESTIONS = f"""
    SELECT {", ".join("r." + key for key in ROW_KEYS)}, r.category, r.conversation,
           count(*) AS turns, sum(r.new_tokens)::BIGINT AS tokens, sum(r.wall_s) AS seconds,
           sum(r.target_passes)::BIGINT AS steps, sum(b.new_tokens)::BIGINT AS baseline_tokens,
           sum(b.wall_s) AS baseline_seconds, sum(b.target_passes)::BIGINT AS baseline_steps
    FROM runs r JOIN runs b ON b.run_id = r.baseline_run_id
    WHERE r.sweep_id = ? AND r.status = 'ok' AND b.status = 'ok' AND r.draft <> 'none'
    GROUP BY ALL ORDER BY ALL"""


def latest_sweep(con: duckdb.DuckDBPyConnection) -> str | None:
    """The sweep that started last, or None in a file with no runs."""
    row = con.execute("SELECT sweep_id FROM runs GROUP BY sweep_id ORDER BY min(started_at) DESC, sweep_id "
                      "LIMIT 1").fetchone()
    return row and row[0]


def questions(con: duckdb.DuckDBPyConnection, sweep_id: str) -> pd.DataFrame:
    """One row per method × question of the sweep, with its speed and its baselines' speed (tokens per second)."""
    frame = con.execute(_QUESTIONS, [sweep_id]).df()
    frame["speed"] = frame["tokens"] / frame["seconds"]
    frame["baseline_speed"] = frame["baseline_tokens"] / frame["baseline_seconds"]
    return frame


def label(row: pd.Series) -> str:
    """A method as the table names it: the draft, its k, a policy other than fixed, and a sampling decoding."""
    policy = "" if row["k_policy"] in (None, "fixed") else f" {row['k_policy']}"
    sampled = "" if row["mode"] == "greedy" else f" (T={row['temperature']:g}, top-p={row['top_p']:g})"
    return f"{row['draft']} k={row['k']}{policy}{sampled}"


def leaderboard(con: duckdb.DuckDBPyConnection, sweep_id: str) -> pd.DataFrame:
    """The leaderboard's table: a plain-decoding row, then one row per method; a column's speedup, #Mean Accepted
    Tokens, Overall, and the questions counted. A column without questions in the sweep is NaN."""
    per_question = questions(con, sweep_id)
    rows = []
    for _, group in per_question.groupby(ROW_KEYS, dropna=False, sort=True):
        row: dict[str, object] = {"method": label(group.iloc[0])}
        for name, categories in COLUMNS:
            row[name] = _speedup(group[group["category"].isin(categories)])
        row[MEAN_ACCEPTED] = group["tokens"].sum() / group["steps"].sum()
        row[OVERALL] = _speedup(group)
        row["questions"] = len(group)
        row["turns"] = int(group["turns"].sum())
        rows.append(row)
    columns = ["method", *(name for name, _ in COLUMNS), MEAN_ACCEPTED, OVERALL, "questions", "turns"]
    if not rows:
        return pd.DataFrame(columns=columns)
    plain = {"method": "plain decoding", **{name: 1.0 for name, _ in COLUMNS}, OVERALL: 1.0,
             MEAN_ACCEPTED: _plain_mean_accepted(con, sweep_id), "questions": None, "turns": None}
    return pd.DataFrame([plain, *rows], columns=columns)


def _speedup(group: pd.DataFrame) -> float:
    if group.empty:
        return float("nan")
    return group["speed"].mean() / group["baseline_speed"].mean()


def _plain_mean_accepted(con: duckdb.DuckDBPyConnection, sweep_id: str) -> float:
    tokens, steps = con.execute("SELECT sum(new_tokens), sum(target_passes) FROM runs WHERE sweep_id = ? AND "
                                "draft = 'none' AND status = 'ok'", [sweep_id]).fetchone()
    return tokens / steps if steps else float("nan")


def sweep_categories(con: duckdb.DuckDBPyConnection, sweep_id: str) -> list[str]:
    """The categories of the sweep's speculative runs, sorted."""
    return [row[0] for row in con.execute("SELECT DISTINCT category FROM runs WHERE sweep_id = ? AND draft <> 'none' "
                                          "ORDER BY category", [sweep_id]).fetchall()]


def coverage_note(categories: list[str]) -> str | None:
    """Why every column of the table is empty, when none of `categories` is one of question.jsonl's; else None."""
    known = [c for _, pooled in COLUMNS for c in pooled]
    if set(categories) & set(known):
        return None
    return (f"None of this sweep's categories ({', '.join(categories) or 'none'}) is one of Spec-Bench's "
            f"({', '.join(known)}), so every column is empty (–) and only Overall and {MEAN_ACCEPTED} are measured: "
            "the table needs a sweep of Spec-Bench's question.jsonl (`runner sweep --prompts question.jsonl`).")


def markdown(table: pd.DataFrame) -> str:
    """The table as Markdown, laid out as the published one: speedups as `2.10x`, accepted tokens to 2 decimals."""
    names = ["method", *(name for name, _ in COLUMNS), MEAN_ACCEPTED, OVERALL]
    lines = ["| " + " | ".join(names) + " |", "| --- |" + " :---: |" * (len(names) - 1)]
    for _, row in table.iterrows():
        cells = [str(row["method"])]
        for name in names[1:]:
            value = row[name]
            cells.append("–" if pd.isna(value) else f"{value:.2f}" if name == MEAN_ACCEPTED else f"{value:.2f}x")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def context_curve(con: duckdb.DuckDBPyConnection, sweep_id: str | None = None) -> pd.DataFrame:
    """α and τ per draft × category × context bucket (`context_stats`), pooled over runs, k and policy: whether a
    draft's acceptance falls as the text grows."""
    where, params = ("WHERE sweep_id = ?", [sweep_id]) if sweep_id else ("", [])
    return con.execute(f"""
        SELECT draft, category, context_from, any_value(context_to) AS context_to, sum(rounds)::BIGINT AS rounds,
               alpha(sum(accepted), sum(rejected)) AS alpha, tau(sum(emitted), sum(rounds)) AS tau
        FROM context_stats {where} GROUP BY ALL ORDER BY ALL""", params).df()


def sweeps(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The file's sweeps with a speculative run, newest first."""
    return [row[0] for row in con.execute(
        "SELECT sweep_id FROM runs GROUP BY sweep_id HAVING bool_or(draft <> 'none') "
        "ORDER BY min(started_at) DESC, sweep_id").fetchall()]
