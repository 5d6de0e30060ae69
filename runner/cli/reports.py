"""`report`: tables over a recorded file laid out as others publish them; `report spec-bench`, Spec-Bench's
leaderboard; `report speed-bench`, SPEED-Bench's acceptance matrix and its throughput splits by input length;
`report docs`, the docs' measured tables."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import duckdb
import typer

from runner.cli.shared import app, fail, stderr
from runner.store import doc_tables, spec_bench, speed_bench
from runner.store.connect import reading, upgrade
from runner.store.schema import StoreError

report_app = typer.Typer(no_args_is_help=True, help="Tables over a recorded file, laid out as others publish them.")
app.add_typer(report_app, name="report")
LOCK_TIMEOUT_S = 30.0


@report_app.command("spec-bench")
def spec_bench_command(
    db: Annotated[Path, typer.Option(help="the DuckDB file")] = Path("runs.duckdb"),
    sweep: Annotated[str | None, typer.Option(help="the sweep (default: the one that started last)")] = None,
) -> None:
    """Spec-Bench's leaderboard of a sweep, by its definitions, as Markdown: a speedup per column (the eight
    MT-bench categories pooled as Multi-turn Conversation), #Mean Accepted Tokens and Overall."""
    if not db.is_file():
        fail(f"{db}: no such file")
    try:
        upgrade(db, LOCK_TIMEOUT_S)
        sweep_id, table, note = reading(db, lambda con: _table(con, sweep), LOCK_TIMEOUT_S)
    except (StoreError, duckdb.Error) as exc:
        fail(str(exc).splitlines()[0])
    if table.empty:
        fail(f"sweep {sweep_id} has no speculative run with a baseline")
    print(spec_bench.markdown(table))
    counted = table.dropna(subset=["questions"])
    stderr.print(f"sweep {sweep_id}: " + "; ".join(f"{m}: {q:.0f} questions, {t:.0f} turns" for m, q, t in
                                                   counted[["method", "questions", "turns"]].itertuples(index=False)),
                 highlight=False, markup=False, soft_wrap=True)
    if note:
        stderr.print(note, highlight=False, markup=False, soft_wrap=True)


def _table(con: duckdb.DuckDBPyConnection, sweep: str | None) -> tuple[str, object, str | None]:
    sweep_id = sweep or spec_bench.latest_sweep(con)
    if sweep_id is None:
        raise StoreError("the file has no runs")
    if not con.execute("SELECT 1 FROM runs WHERE sweep_id = ? LIMIT 1", [sweep_id]).fetchone():
        raise StoreError(f'no sweep "{sweep_id}" in the file')
    note = spec_bench.coverage_note(spec_bench.sweep_categories(con, sweep_id))
    return sweep_id, spec_bench.leaderboard(con, sweep_id), note


@report_app.command("speed-bench")
def speed_bench_command(
    db: Annotated[Path, typer.Option(help="the DuckDB file")] = Path("runs.duckdb"),
    sweep: Annotated[str | None, typer.Option(
        help="the sweep (default: the last one that ran SPEED-Bench prompts); the newest SPEED-Bench sweep of each "
             "other engine is reported beside it")] = None,
) -> None:
    """SPEED-Bench's report of a sweep as Markdown, by vLLM's definitions: τ, α and per-position acceptance per
    draft × category of the qualitative split, then acceptance and speedup by input length over the throughput
    splits; one set of tables per engine, each other engine's from its newest SPEED-Bench sweep."""
    if not db.is_file():
        fail(f"{db}: no such file")
    try:
        upgrade(db, LOCK_TIMEOUT_S)
        sweep_ids, matrix, lengths = reading(db, lambda con: _speed_tables(con, sweep), LOCK_TIMEOUT_S)
    except (StoreError, duckdb.Error) as exc:
        fail(str(exc).splitlines()[0])
    if matrix.empty and lengths.empty:
        fail(f"sweep {sweep_ids[0]} has no speculative run of a SPEED-Bench prompt (ids like qualitative-12 or "
             "throughput_2k-3): record one with `runner sweep --prompts <SPEED-Bench directory>`")
    print(speed_bench.markdown(matrix, lengths))
    stderr.print(f"sweep{'s' if len(sweep_ids) > 1 else ''} {', '.join(sweep_ids)}", highlight=False, markup=False)


def _speed_tables(con: duckdb.DuckDBPyConnection, sweep: str | None) -> tuple[tuple[str, ...], object, object]:
    if sweep is not None and not con.execute("SELECT 1 FROM runs WHERE sweep_id = ? LIMIT 1", [sweep]).fetchone():
        raise StoreError(f'no sweep "{sweep}" in the file')
    sweep_ids = speed_bench.beside_other_engines(con, sweep)
    if not sweep_ids:
        raise StoreError("no sweep in the file ran SPEED-Bench prompts (ids like qualitative-12 or "
                         "throughput_2k-3): record one with `runner sweep --prompts <SPEED-Bench directory>`")
    return sweep_ids, speed_bench.acceptance(con, sweep_ids), speed_bench.by_length(con, sweep_ids)


@report_app.command("docs")
def docs_command(
    db: Annotated[Path, typer.Option(help="the DuckDB file the tables are read from")] = Path("runs.duckdb"),
    docs: Annotated[Path, typer.Option(help="the folder of Markdown pages")] = Path("docs"),
    sweeps: Annotated[Path, typer.Option(help="the sweeps the docs describe, one id a line (no file: every sweep)")]
    = Path("bench/results/shipped-sweeps.txt"),
    check: Annotated[bool, typer.Option(help="write nothing; exit 1 naming each page whose tables differ")] = False,
) -> None:
    """The docs' measured tables, rendered again from the file between each page's `<!-- render:NAME -->` and
    `<!-- /render:NAME -->` markers, over the listed sweeps alone (`--check`: only say which pages are stale)."""
    if not db.is_file():
        fail(f"{db}: no such file")
    if not docs.is_dir():
        fail(f"{docs}: no such folder")
    pages = {page: page.read_text() for page in sorted(docs.rglob("*.md"))}
    listed = tuple(line.strip() for line in sweeps.read_text().splitlines() if line.strip()) if sweeps.is_file() else ()
    try:
        upgrade(db, LOCK_TIMEOUT_S)
        rendered = reading(db, lambda con: _rendered(con, pages, listed), LOCK_TIMEOUT_S)
    except (StoreError, duckdb.Error, ValueError) as exc:
        fail(str(exc).splitlines()[0])
    stale = [page for page, text in rendered.items() if text != pages[page]]
    for page in stale:
        if not check:
            page.write_text(rendered[page])
        print(f"{page}: {'stale' if check else 'rendered'}")
    if check and stale:
        raise typer.Exit(1)


def _rendered(con: duckdb.DuckDBPyConnection, pages: dict[Path, str], sweeps: tuple[str, ...]) -> dict[Path, str]:
    con.execute("SET threads = 1")  # one summation order, so a table renders to the same digits every time
    if sweeps:
        found = {row[0] for row in con.execute("SELECT DISTINCT sweep_id FROM runs").fetchall()}
        if missing := [sweep for sweep in sweeps if sweep not in found]:
            raise StoreError(f"sweep {missing[0]} is listed but not in the file")
        doc_tables.only_sweeps(con, sweeps)
    return {page: doc_tables.render_page(text, con) for page, text in pages.items()}
