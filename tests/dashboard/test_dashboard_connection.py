"""A page's reads share one read-only connection (common.one_connection) and give what short connections give."""

from __future__ import annotations

import duckdb
import pytest
import streamlit as st

from dashboard import common, filter_queries, queries
from runner.store import comparable, metrics
from tests.helpers.dashboard_fixtures import build

READS = [(queries.run_count, ()), (filter_queries.filter_options, ()), (queries.comparable_cells, (metrics.Filters(),)),
         (comparable.best_cells, (metrics.Filters(),)), (metrics.formula_over_k, (metrics.Filters(),))]


@pytest.fixture
def db(tmp_path, monkeypatch):
    path = build(tmp_path / "runs.duckdb")
    monkeypatch.setenv(common.DB_ENV, str(path))
    st.cache_data.clear()
    return path


@pytest.fixture
def opens(monkeypatch) -> list[bool]:
    """Each open_db the shared path makes, recorded (read_only) before the real open."""
    seen: list[bool] = []
    real = common.open_db

    def counting(db_path, *, read_only, bound_s=30.0, config=None):
        seen.append(read_only)
        return real(db_path, read_only=read_only, bound_s=bound_s, config=config)

    monkeypatch.setattr(common, "open_db", counting)
    return seen


def _equal(a, b) -> bool:
    return a.equals(b) if hasattr(a, "equals") else a == b


def test_one_connection_serves_every_read_of_the_block_with_the_short_connections_results(db, opens):
    expected = [queries.read(db, fn, *args) for fn, args in READS]
    with common.one_connection():
        got = [common.load(fn, *args) for fn, args in READS]
        assert opens == [True]  # one read-only open for five reads
        shared = common._PAGE.con
    assert all(_equal(a, b) for a, b in zip(got, expected, strict=True))
    with pytest.raises(duckdb.ConnectionException):  # closed when the block ends
        shared.execute("SELECT 1")
    st.cache_data.clear()
    assert _equal(common.load(queries.comparable_cells, metrics.Filters()), expected[2])
    assert opens == [True]  # outside a block: a short connection of queries.read, not the shared path


def test_a_read_that_fails_on_the_shared_connection_is_read_again_on_its_own(db, opens):
    def torn_once(con, calls=[]):  # noqa: B006 - counts its calls across the two connections
        calls.append(con)
        if len(calls) == 1:
            raise duckdb.IOException("Could not read enough bytes from file: a checkpoint half-written")
        return con.execute("SELECT count(*) FROM runs").fetchone()[0]

    with common.one_connection():
        assert common.load(torn_once) == queries.read(db, queries.run_count)
        assert common._PAGE.con is None  # the failed connection is closed; the next read opens a fresh one
        assert common.load(queries.run_count) == queries.read(db, queries.run_count)
    assert opens == [True, True]
