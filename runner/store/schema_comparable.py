"""The view `comparable_runs` (migration `create_comparable_runs`, listed in `schema.py`): the runs the dashboard's
numbers pool, so users' SQL can pool the same ones.

Its rows are `comparable.comparable_runs_sql` with nothing filtered: every baseline and every kept cell's run on a
common prompt of its setup × category (the prompts every compared cell ran). The SQL page's placeholder reads it.
"""

from __future__ import annotations

import duckdb

from runner.store.comparable import comparable_runs_sql
from runner.store.metrics import Filters


def create_comparable_runs(con: duckdb.DuckDBPyConnection) -> None:
    sql, params = comparable_runs_sql(Filters())
    assert not params  # a view holds no parameters: with no filter there are none
    con.execute(f"CREATE OR REPLACE VIEW comparable_runs AS {sql}")
