"""The commands over recorded files: `merge`, `sql`, `list` and `serve`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from runner.cli.common import app, fail, stderr, stdout
from runner.report import frame_table
from runner.serve import ServeError, serve
from runner.store.merge import merge as merge_databases
from runner.store.runs import list_sweeps
from runner.store.schema import StoreError
from runner.store.sql import QueryError, run_query


@app.command()
def merge(
    sources: Annotated[list[Path], typer.Argument(help="databases recorded elsewhere")],
    into: Annotated[Path, typer.Option(help="the database to merge into; created if absent")],
) -> None:
    """Bring the runs and benchmarks of other databases into one; those it already has are skipped."""
    try:
        added = merge_databases(sources, into)
    except StoreError as exc:
        fail(str(exc))
    for source in added:
        stdout.print(source.line(), highlight=False, soft_wrap=True)


@app.command("sql")
def sql_command(
    query: Annotated[str, typer.Argument(help="one read-only statement")],
    db: Annotated[Path, typer.Option(help="the DuckDB file")] = Path("runs.duckdb"),
    max_rows: int = 200,
) -> None:
    """Run one read-only SQL statement, sandboxed: no file access, no writes, bounded time and memory."""
    try:
        result = run_query(db, query, max_rows=max_rows)
    except QueryError as exc:
        fail(str(exc))
    stdout.print(frame_table(result.frame), highlight=False)
    note = f"{len(result.frame)} row(s) in {result.elapsed_s * 1000:.0f} ms"
    stderr.print(note + (f" (truncated at {max_rows})" if result.truncated else ""), highlight=False)


@app.command("list")
def list_command(db: Annotated[Path, typer.Option(help="the DuckDB file")] = Path("runs.duckdb")) -> None:
    """List the recorded sweeps, newest first."""
    try:
        sweeps = list_sweeps(db)
    except StoreError as exc:
        fail(str(exc))
    stdout.print(frame_table(sweeps), highlight=False)


@app.command("serve")
def serve_command(
    db: Annotated[Path, typer.Option(help="the DuckDB file")] = Path("runs.duckdb"),
    port: Annotated[int, typer.Option(help="the dashboard's port")] = 8501,
    sweep: Annotated[str | None, typer.Option(
        help="also record a sweep into --db meanwhile: the options of `runner sweep`, quoted as one string; "
             "a sweep of the same plan interrupted earlier is finished")] = None,
    address: Annotated[str | None, typer.Option(
        help="the address to listen on, 127.0.0.1 for this machine only; Streamlit's default: every interface")] = None,
    auth: Annotated[bool, typer.Option(
        "--auth", help="refuse to start unless the secrets configure the login ([auth], see docs/sharing.md)")
    ] = False,
) -> None:
    """Serve the dashboard on --db at once, and optionally record a sweep into it meanwhile; Ctrl-C stops both."""
    try:
        code = serve(db, port, sweep, address, require_auth=auth)
    except ServeError as exc:
        fail(str(exc))
    raise typer.Exit(code)
