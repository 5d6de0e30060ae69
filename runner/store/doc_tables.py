"""The docs' measured tables, rendered from a recorded file: every figure a page shows comes from here.

A page marks each table it shows with `<!-- render:NAME -->` and `<!-- /render:NAME -->`; `render_page` replaces what
lies between them with TABLES[NAME] over the file, so `runner report docs` writes the tables again and its `--check`
(and the test that runs it) fails when a page no longer says what the file holds. The tables read the same functions
as the dashboard (`comparable`, `advisor`, `batches`), so a page and the dashboard give one answer.

The docs describe the sweeps `bench/reship.sh` recorded (it lists them in `bench/results/shipped-sweeps.txt`), not
whatever else a file gathers later (`make run` records a quick sweep into the same file): `only_sweeps` makes a
connection see those sweeps' runs alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

import duckdb
import pandas as pd

from runner.store import advisor, batches, comparable
from runner.store.metrics import Filters
from runner.store.sql import EXAMPLES

CHAINS_AND_TREES = Filters(k_policy=("fixed",), batch_size=(1,), kernels=("skinny",))
MARKER = re.compile(r"(<!-- render:(?P<name>[a-z0-9-]+) -->\n)(?P<body>.*?)(<!-- /render:(?P=name) -->)", re.S)


SWEPT = ("runs", "run_facts", "run_stats")  # what the tables read per run; the views over them read these in turn


def only_sweeps(con: duckdb.DuckDBPyConnection, sweeps: tuple[str, ...]) -> None:
    """From here on, `con` sees only the runs of `sweeps` in SWEPT: a temporary view of each, named as the relation
    it filters, is found before the file's own. (A view takes no parameters, so the ids are quoted literals.)"""
    catalog = con.execute("SELECT current_database()").fetchone()[0]
    listed = ", ".join("'" + sweep.replace("'", "''") + "'" for sweep in sweeps)
    for name in SWEPT:
        con.execute(f'CREATE OR REPLACE TEMP VIEW {name} AS SELECT * FROM "{catalog}".main.{name} '
                    f"WHERE sweep_id IN ({listed})")


def _cell(value: object, pattern: str) -> str:
    return "–" if value is None or pd.isna(value) else pattern.format(value)


def markdown(frame: pd.DataFrame, formats: dict[str, str]) -> str:
    """`frame` as a Markdown table: a column per key of `formats` (header: the key), each value by its pattern."""
    lines = ["| " + " | ".join(formats) + " |", "|" + "---|" * len(formats)]
    for _, row in frame.iterrows():
        lines.append("| " + " | ".join(_cell(row[name], pattern) for name, pattern in formats.items()) + " |")
    return "\n".join(lines)


def sweeps(con: duckdb.DuckDBPyConnection) -> str:
    """What the file holds: each sweep's settings, drafts and runs, and how many of its checked runs were lossless."""
    frame = con.execute("""
        SELECT sweep_id, any_value(mode || CASE WHEN mode = 'sample' THEN ' T=' || temperature ELSE '' END) AS mode,
            string_agg(DISTINCT kernels, ', ' ORDER BY kernels) AS kernels,
            string_agg(DISTINCT coalesce(batch_size, 1)::VARCHAR, ', ' ORDER BY coalesce(batch_size, 1)::VARCHAR)
                AS batch,
            string_agg(DISTINCT draft, ', ' ORDER BY draft) FILTER (draft <> 'none') AS drafts,
            string_agg(DISTINCT k::VARCHAR, ', ' ORDER BY k::VARCHAR) AS k,
            string_agg(DISTINCT k_policy, ', ' ORDER BY k_policy) FILTER (draft <> 'none') AS policies,
            count(*) AS runs, CASE WHEN count(lossless) > 0
                THEN count(lossless) FILTER (lossless) || ' of ' || count(lossless) END AS lossless
        FROM runs WHERE status = 'ok' GROUP BY sweep_id ORDER BY min(started_at)""").df()
    formats = {"sweep": "`{}`", "mode": "{}", "kernels": "{}", "batch": "{}", "drafts": "{}", "k": "{}",
               "policies": "{}", "runs": "{}", "lossless": "{}"}
    return markdown(frame.rename(columns={"sweep_id": "sweep"}), formats)


def _best(con: duckdb.DuckDBPyConnection, mode: str) -> str:
    """Per category, each draft at its best fixed k (batch 1, the default kernels), fastest first, as the Compare
    page ranks them: on the prompts every compared cell ran."""
    frame = comparable.best_cells(con, replace(CHAINS_AND_TREES, mode=(mode,)))
    formats = {"category": "{}", "draft": "`{}`", "best k": "{:.0f}", "α": "{:.3f}", "τ": "{:.2f}",
               "speedup": "{:.2f}×", "prompts": "{}"}
    return markdown(frame.rename(columns={"k": "best k", "alpha": "α", "tau": "τ"}), formats)


def policies(con: duckdb.DuckDBPyConnection) -> str:
    """Each adaptive policy's speedup as a share of the best fixed k's on the same prompts (> 1: it beat every fixed
    k), per category: the SQL page's example "each draft-length policy against the best fixed k", pivoted."""
    frame = con.execute(EXAMPLES["each draft-length policy against the best fixed k"]).df()
    frame["mode"] = frame["mode"].where(frame["mode"] == "greedy", "sample")
    wide = frame.pivot_table(index=["mode", "draft", "k_policy", "start_k"], columns="category",
                             values="of_best_fixed").reset_index()
    categories = [c for c in wide.columns if c not in ("mode", "draft", "k_policy", "start_k")]
    formats = {"mode": "{}", "draft": "`{}`", "k_policy": "`{}`", "start_k": "{:.0f}",
               **{category: "{:.3f}" for category in categories}}
    return markdown(wide, formats)


def advice(con: duckdb.DuckDBPyConnection) -> str:
    """The k advisor's record at batch 1: the k it predicts best against the k measured best, whether the measured
    speed at its k is within `advisor.WITHIN` of the best, and the mean error of it and of the flat formula."""
    frame = advisor.k_advice(con, Filters(batch_size=(1,), kernels=("skinny",)))
    frame["hit"] = frame["hit"].map({True: "yes", False: "no"})
    formats = {"mode": "{}", "category": "{}", "draft": "`{}`", "predicted_best_k": "{:.0f}",
               "measured_best_k": "{:.0f}", "hit": "{}", "advisor_error": "{:.1%}", "formula_error": "{:.1%}",
               "recommended_policy": "`{}`", "recommended_k": "{:.0f}"}
    return markdown(frame, formats)


def batch_curve(con: duckdb.DuckDBPyConnection) -> str:
    """Speedup over plain decoding at the same batch size, and the batch's tokens/s, per draft × k × batch size ×
    category (greedy, fixed k)."""
    frame = batches.curve(con, Filters(mode=("greedy",), k_policy=("fixed",), kernels=("skinny",)))
    frame = frame[frame["draft"] != "none"].dropna(subset=["speedup"])
    frame = frame[frame.groupby(["draft", "k", "category"])["batch_size"].transform("nunique") > 1]
    formats = {"draft": "`{}`", "k": "{:.0f}", "category": "{}", "batch_size": "{}", "runs": "{}",
               "speedup": "{:.2f}×", "tokens_per_s_per_batch": "{:.1f}"}
    return markdown(frame.sort_values(["draft", "k", "category", "batch_size"]), formats)


def training(con: duckdb.DuckDBPyConnection) -> str:
    """Each recorded training of a draft head, epoch by epoch: its losses and the held-out acceptance at each draft
    position 1, 2, … (each given the earlier drafts were right), pooled over the held-out categories."""
    frame = con.execute("""
        SELECT t.draft, e.epoch || CASE WHEN e.epoch = t.saved_epoch THEN ' (saved)' ELSE '' END AS epoch,
            e.train_loss, e.heldout_loss,
            string_agg(CASE WHEN p.judged > 0 THEN printf('%.3f', p.accepted / p.judged) ELSE '–' END, ' / '
                ORDER BY p.position) AS positions
        FROM trainings t JOIN training_epochs e USING (train_id)
        JOIN training_positions p ON p.train_id = e.train_id AND p.epoch = e.epoch AND p.category = 'all'
        WHERE t.status = 'ok' GROUP BY ALL ORDER BY t.draft, min(e.epoch)""").df()
    return markdown(frame, {"draft": "`{}`", "epoch": "{}", "train_loss": "{:.3f}", "heldout_loss": "{:.3f}",
                            "positions": "{}"})


def training_categories(con: duckdb.DuckDBPyConnection) -> str:
    """Each recorded training's held-out acceptance at its saved epoch, per held-out category and draft position."""
    frame = con.execute("""
        SELECT t.draft, p.category, sum(p.judged) AS judged,
            string_agg(CASE WHEN p.judged > 0 THEN printf('%.3f', p.accepted / p.judged) ELSE '–' END, ' / '
                ORDER BY p.position) AS positions
        FROM trainings t JOIN training_positions p ON p.train_id = t.train_id AND p.epoch = t.saved_epoch
        WHERE t.status = 'ok' AND p.category <> 'all' GROUP BY ALL ORDER BY t.draft, p.category""").df()
    return markdown(frame, {"draft": "`{}`", "category": "{}", "judged": "{:.0f}", "positions": "{}"})


TABLES: dict[str, Callable[[duckdb.DuckDBPyConnection], str]] = {
    "sweeps": sweeps,
    "best-greedy": lambda con: _best(con, "greedy"),
    "best-sampled": lambda con: _best(con, "sample"),
    "policies": policies,
    "advice": advice,
    "batches": batch_curve,
    "training": training,
    "training-categories": training_categories,
}


def render_page(text: str, con: duckdb.DuckDBPyConnection) -> str:
    """`text` with every marked table rendered again from the file; an unknown table's name is a ValueError."""
    def rendered(match: re.Match) -> str:
        name = match["name"]
        if name not in TABLES:
            raise ValueError(f"unknown table <!-- render:{name} -->; known: {', '.join(TABLES)}")
        return f"{match[1]}{TABLES[name](con)}\n{match[4]}"
    return MARKER.sub(rendered, text)
