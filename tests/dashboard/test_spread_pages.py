"""The pooling and tie rule (`runner/store/spread.py`) and every page that shows it, on the hand-made database of
`spread_fixture.py`: each speedup with its interval, its prompts' range and count, and the same number on the
Overview, Compare, the SQL page's placeholder and the head to head."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from runner.store import comparable, spread
from runner.store.connect import open_db
from runner.store.metrics import Filters
from tests.dashboard.spread_fixture import build

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")
T_2, T_1 = 4.302652729749464, 12.706204736174698  # Student's t at 0.975 with 2 and 1 degrees of freedom
LN2 = math.log(2)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("spread") / "runs.duckdb")


def app(monkeypatch, db: Path, page: str | None = None, **params: str) -> AppTest:
    monkeypatch.setenv("SPECDASH_DB", str(db))
    at = AppTest.from_file(APP, default_timeout=60)
    if page:
        at.run()
        at.switch_page(page)
    at.query_params.update(params)
    return at.run()


def cells(db: Path):
    con, _ = open_db(db, read_only=True)
    try:
        return comparable.cells(con, Filters()).set_index(["category", "draft", "k"])
    finally:
        con.close()


def test_the_interval_is_students_t_over_the_prompts_log_speedups():
    # 2×, 4×, 1×: ln 2 · (1, 2, 0), mean ln 2, sample sd ln 2, n 3
    assert spread.interval(LN2, LN2, 3) == pytest.approx((2 ** (1 - T_2 / math.sqrt(3)), 2 ** (1 + T_2 / math.sqrt(3))))
    assert all(math.isnan(x) for x in spread.interval(LN2, math.nan, 1))  # one prompt: no interval


def test_a_cell_pools_its_repeats_then_its_prompts(db):
    table = cells(db)
    ngram = table.loc[("code", "ngram", 2)]
    # c1's repeats (2×, 8×) pool to 4× before the prompts do: no spread left between prompts
    assert ngram[["runs", "prompts", "speedup", "low", "high", "speedup_min", "speedup_max", "alpha"]].tolist() == \
        pytest.approx([4, 3, 4.0, 4.0, 4.0, 4.0, 4.0, 1.0])
    skip = table.loc[("code", "layerskip:2", 2)]
    assert skip[["speedup", "alpha", "alpha_min", "alpha_max"]].tolist() == pytest.approx([2.0, 2 / 3, 6 / 11, 1.0])
    poem = table.loc[("poem", "ngram", 2)]  # 2× and 8×: ln sd √2 · ln 2, so the half width is t(0.975, 1) · ln 2
    assert poem[["speedup", "low", "high", "speedup_min", "speedup_max"]].tolist() == \
        pytest.approx([4.0, 2 ** (2 - T_1), 2 ** (2 + T_1), 2.0, 8.0])


def test_a_tie_is_an_overlap_of_the_winners_and_the_runner_ups_intervals(db):
    con, _ = open_db(db, read_only=True)
    best = comparable.best_cells(con, Filters()).set_index(["category", "draft"])
    con.close()
    # within a draft: ngram k=2 (4×, [4, 4]) against its k=3 (1.6×, [1.6, 1.6]): no overlap
    assert best.loc[("code", "ngram"), ["choice", "runner_up", "tied"]].tolist() == ["k=2 · fixed", "k=3 · fixed",
                                                                                     False]


def test_the_overview_answers_each_category_with_its_spread_and_its_runner_up(monkeypatch, db):
    at = app(monkeypatch, db)
    assert not at.exception
    head = at.dataframe[0].value.set_index("category")
    # code: ngram 4× [4, 4] against layer skip 2× [2, 2]: apart; poem: ngram 4× with an interval reaching far below
    # layer skip's 3×: a tie
    assert head.loc["code", ["name", "speedup", "low", "high", "prompts", "tied", "runner_up"]].tolist() == [
        "prompt lookup (ngram) at k=2 · fixed", 4.0, 4.0, 4.0, 3, False, "layer skip (layerskip:2) at k=2 · fixed"]
    assert head.loc["poem", ["speedup", "speedup_min", "speedup_max", "tied", "runner_up_speedup"]].tolist() == \
        pytest.approx([4.0, 2.0, 8.0, True, 3.0])
    table = at.dataframe[1].value.set_index(["category", "draft", "k"])
    assert table.loc[("code", "ngram", 3), ["speedup", "alpha", "prompts"]].tolist() == pytest.approx([1.6, 8 / 11, 3])
    assert any("geometric mean over the 2–3 prompts" in c.value for c in at.caption)


def test_compare_gives_the_overviews_number_with_its_interval_and_ties(monkeypatch, db):
    at = app(monkeypatch, db, "compare.py")
    assert not at.exception
    board = at.dataframe[0].value.set_index("draft")
    row = board.loc["prompt lookup (ngram)"]
    assert row[["code best", "code speedup", "code 95%", "code tie", "poem speedup"]].tolist() == \
        ["k=2 · fixed", 4.0, "4.00–4.00×", "", 4.0]
    at.selectbox(key="a").select("layerskip:2").run()
    at.selectbox(key="b").select("ngram").run()
    duel = at.dataframe[1].value.set_index(["category", "k"])
    assert duel.loc[("code", 2), ["speedup_a", "speedup_b", "b_over_a", "tie"]].tolist() == [2.0, 4.0, 2.0, False]
    assert duel.loc[("poem", 2), ["b_over_a", "tie"]].tolist() == [pytest.approx(4 / 3), True]


def test_the_sql_placeholder_gives_the_overviews_numbers(monkeypatch, db):
    at = app(monkeypatch, db, "sql_page.py")
    at.button(key="run_sql").click().run()  # an empty editor runs the placeholder
    result = at.dataframe[0].value.set_index(["category", "draft", "k"])
    table = cells(db)
    assert result["speedup"].to_dict() == pytest.approx(table["speedup"].round(3).to_dict())
    assert result["prompts"].to_dict() == table["prompts"].to_dict()


def test_an_empty_sql_result_says_which_condition_emptied_it(monkeypatch, db):
    at = app(monkeypatch, db, "sql_page.py", sql="SELECT * FROM run_stats WHERE draft = 'prompt lookup'")
    at.button(key="run_sql").click().run()
    (info,) = [i.value for i in at.info]
    assert "no run has draft = 'prompt lookup'" in info and "its spec is `ngram`" in info


def test_an_empty_page_says_which_filter_emptied_it(monkeypatch, db):
    at = app(monkeypatch, db, category="poem", k="3")
    assert any("before k = “3”" in i.value for i in at.info)


def test_the_filters_travel_with_the_sidebars_links_and_a_url_may_name_a_drafts_spec(monkeypatch, db):
    at = app(monkeypatch, db, draft="ngram", category="code")
    assert at.multiselect(key="draft").value == ["ngram"]
    assert dict(at.query_params) == {"draft": "prompt lookup (ngram)", "category": "code"}
    links = {link.proto.page: link.proto.query_string for link in at.get("page_link")}
    assert links["compare"] == "draft=prompt+lookup+%28ngram%29&category=code"
    assert links["replay"] == links["batches"] == links["compare"]
    # Opened on another page with the filters, then the replay: its run picker offers what they pick.
    at = app(monkeypatch, db, draft="prompt lookup (ngram)", category="poem")
    at.switch_page("replay.py")
    at.run()
    assert at.multiselect(key="category").value == ["poem"]
    assert set(at.dataframe[0].value["run_id"]) == {"p1-ngram-k2-r0", "p2-ngram-k2-r0"}


def test_a_url_that_names_a_drafts_spec_shows_the_filters_label_after_the_first_run(monkeypatch, db):
    # The address bar names the draft as the filter does before anything is picked; a value that matches nothing is
    # named in a warning and leaves the URL.
    at = app(monkeypatch, db, draft=["layerskip:2", "medusa"], category="code")
    assert dict(at.query_params) == {"draft": "layer skip (layerskip:2)", "category": "code"}
    assert at.multiselect(key="draft").value == ["layerskip:2"]
    assert at.metric[0].value == "3"  # layerskip:2 on c1, c2 and c3
    assert [w.value for w in at.warning] == ["draft: no speculative run has “medusa”; that filter value was left out."]
