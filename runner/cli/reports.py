"""`report`: tables over a recorded file laid out as others publish them; `report spec-bench`, Spec-Bench's
leaderboard."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import duckdb
import typer

from runner.cli.shared import app, fail, stderr
from runner.store import spec_bench
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
        sweep_id, table = reading(db, lambda con: _table(con, sweep), LOCK_TIMEOUT_S)
    except (StoreError, duckdb.Error) as exc:
        fail(str(exc).splitlines()[0])
    if table.empty:
        fail(f"sweep {sweep_id} has no speculative run with a baseline")
    print(spec_bench.markdown(table))
    counted = table.dropna(subset=["questions"])
    stderr.print(f"sweep {sweep_id}: " + "; ".join(f"{m}: {q:.0f} questions, {t:.0f} turns" for m, q, t in
                                                   counted[["method", "questions", "turns"]].itertuples(index=False)),
                 highlight=False, markup=False, soft_wrap=True)


def _table(con: duckdb.DuckDBPyConnection, sweep: str | None) -> tuple[str, object]:
    sweep_id = sweep or spec_bench.latest_sweep(con)
    if sweep_id is None:
        raise StoreError("the file has no runs")
    if not con.execute("SELECT 1 FROM runs WHERE sweep_id = ? LIMIT 1", [sweep_id]).fetchone():
        raise StoreError(f'no sweep "{sweep_id}" in the file')
    return sweep_id, spec_bench.leaderboard(con, sweep_id)
