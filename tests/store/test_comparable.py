"""Which draft, which k, which policy: one answer per setup, on the prompts every compared cell ran.

A database where pooling misleads: prompt lookup's `auto` policy ran only the easy prompt code-02 (its baseline is
twice as slow, so every speedup there doubles), while fixed k = 2 ran code-01 and code-02; and a layer-skip draft
ran only on the stock kernels, where its runs are fast. Pooled, `auto` looks best for ngram (3.0× on code-02
against the geometric mean √(2 · 4) = 2.83× of fixed k = 2) and layer-skip looks best of all. On the common prompt
code-02, fixed k = 2 gives 2.4 / 0.6 = 4.0× against auto's 2.4 / 0.8 = 3.0×; layer-skip is its own setup's answer.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import duckdb
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from dashboard import frames, queries
from runner.store import advisor, comparable, run_facts
from runner.store.metrics import Filters
from runner.store.runs import write_run
from tests.helpers.dashboard_fixtures import baseline_record, retimed, speculative_record

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")
SKINNY = "greedy · skinny kernels · 2 threads · cpu"
STOCK = "greedy · stock kernels · 2 threads · cpu"


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("comparable") / "runs.duckdb"
    for minute, prompt_id in enumerate(("code-01", "code-02")):
        write_run(path, baseline_record(prompt_id, minute=minute))
    runs = [speculative_record("ng2-c1", "code-01", "ngram", 2, [2, 2, 2, 2], 0.6),  # 1.2 / 0.6 = 2×
            speculative_record("ng2-c2", "code-02", "ngram", 2, [2, 2, 2, 2], 0.6),  # 2.4 / 0.6 = 4×
            dataclasses.replace(speculative_record("ng4a-c2", "code-02", "ngram", 4, [4, 4, 1], 0.8),
                                k_policy="auto")]  # 3× on the easy prompt only
    runs += [dataclasses.replace(speculative_record(f"ls-{p}", p, "layerskip:2", 2, [2, 2, 2, 2], 0.2),
                                 kernels="stock") for p in ("code-01", "code-02")]  # 6× and 12×
    for minute, record in enumerate(runs, start=10):
        write_run(path, dataclasses.replace(record, started_at=f"2026-01-01T12:{minute:02d}:00"))
    return path


def test_the_best_cell_is_judged_on_the_common_prompts_per_setup(db):
    best = queries.read(db, comparable.best_cells, Filters()).assign(
        setup=lambda f: comparable.labelled(f)).set_index(["setup", "draft"])
    assert best.loc[(SKINNY, "ngram"), ["k", "k_policy", "speedup", "runs", "prompts"]].tolist() == \
        [2, "fixed", pytest.approx(4.0), 1, 1]
    assert best.loc[(STOCK, "layerskip:2"), ["k", "k_policy", "speedup", "prompts"]].tolist() == \
        [2, "fixed", pytest.approx((6 * 12) ** 0.5), 2]
    assert len(best) == 2  # layer-skip never pooled with the skinny kernels' cells


def test_the_advisor_names_the_leaderboards_answer(db):
    def read(con):
        return frames.advice_table(advisor.k_advice(con, Filters()), comparable.best_cells(con, Filters()))

    table = queries.read(db, read).set_index(["setup", "draft"])
    assert table.loc[(SKINNY, "ngram"), "measured_choice"] == "k=2 · fixed"
    assert table.loc[(STOCK, "layerskip:2"), "measured_choice"] == "k=2 · fixed"


def _page(monkeypatch: pytest.MonkeyPatch, db: Path, page: str | None = None) -> AppTest:
    monkeypatch.setenv("SPECDASH_DB", str(db))
    at = AppTest.from_file(APP, default_timeout=90)
    at.run()
    if page:
        at.switch_page(page).run()
    assert not at.exception
    return at


def test_the_overview_headline_and_the_leaderboard_give_one_answer(monkeypatch, db):
    head = _page(monkeypatch, db).dataframe[0].value.set_index(["setup", "category"])
    assert head.loc[(SKINNY, "code"), ["name", "speedup", "alpha", "prompts"]].tolist() == [
        "prompt lookup (ngram) at k=2 · fixed", pytest.approx(4.0), pytest.approx(1.0), 1]
    assert head.loc[(STOCK, "code"), ["name", "speedup", "alpha", "prompts"]].tolist() == [
        "layer skip (layerskip:2) at k=2 · fixed", pytest.approx(math.sqrt(72)), pytest.approx(1.0), 2]
    board = _page(monkeypatch, db, "compare.py").dataframe[0].value.set_index(["setup", "draft"])
    assert board.loc[(SKINNY, "prompt lookup (ngram)"), ["code best", "code speedup", "prompts"]].tolist() == \
        ["k=2 · fixed", pytest.approx(4.0), "1"]
    assert board.loc[(STOCK, "layer skip (layerskip:2)"), "code best"] == "k=2 · fixed"


def test_the_advisor_counts_positions_over_the_runs_it_compares(tmp_path):
    """c2-ng-k2 ran code-02, which no other code cell ran: it is no comparable run (code's common prompt is
    code-01), so removing it changes nothing the advisor says; its positions are not pooled with the runs it
    measures rounds over."""
    db, without = retimed(tmp_path / "runs.duckdb"), tmp_path / "without.duckdb"
    without.write_bytes(db.read_bytes())
    with duckdb.connect(str(without)) as con:
        con.execute("DELETE FROM runs WHERE run_id = 'c2-ng-k2'")
        run_facts.refresh_all(con)
    with duckdb.connect(str(db), read_only=True) as con:
        assert "c2-ng-k2" not in {r for (r,) in con.execute(*comparable.comparable_runs_sql(Filters())).fetchall()}
        kept, left = advisor.k_curve(con, Filters()), len(con.execute("SELECT * FROM runs").fetchall())
    with duckdb.connect(str(without), read_only=True) as con:
        assert len(con.execute("SELECT * FROM runs").fetchall()) == left - 1
        pd.testing.assert_frame_equal(advisor.k_curve(con, Filters()), kept, check_exact=True)
    # ngram on code, pooled over k: c1-ng-k2 accepted 2, 1, 2, 2 in its 4 drafting rounds (its fifth, at the budget's
    # end, drafted nothing), c1-ng-k4 4, 2, 3 in its 3, so s_1 = 7/7 and s_2 = 6/7 of the drafting rounds, and the idle
    # round is f = 1/24 of the 24 tokens. At k = 2 a drafting round emits E = 20/7 and p = r / (f + r) = 161/181 of
    # the rounds draft, r = (23/24) / E: 1 + p · 13/7 = 480/181 tokens a round. Pooling c2-ng-k2's 2, 2, 2, 2 into
    # the counts but not into the rounds would have made s_1 = 11/7 and s_2 = 10/7: more than k + 1 tokens a round.
    code = kept[(kept["draft"] == "ngram") & (kept["category"] == "code") & (kept["k"] == 2)]
    assert code["emitted"].tolist() == [pytest.approx(480 / 181)]
