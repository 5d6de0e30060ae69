"""Every dashboard page under Streamlit's AppTest, over the hand-built database (tests/helpers/dashboard_fixtures.py).

The expected numbers are the ones worked out in tests/dashboard/test_dashboard_queries.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest
from tokenizers import Tokenizer, pre_tokenizers
from tokenizers import models as tok_models
from transformers import PreTrainedTokenizerFast

from dashboard import k_advice
from runner.store import connect
from runner.store.runs import write_run
from runner.store.sql import EXAMPLES
from tests.helpers.dashboard_fixtures import add_benches, add_trees, build, speculative_record

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")
SPAN = re.compile(r'<span class="tok-(\w+)" data-fate="\w+" title="[^"]*">([^<]*)</span>')


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("app") / "runs.duckdb")


@pytest.fixture(scope="module")
def mismatch_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture and four more runs of ngram k=2 on code-01 whose output differs from the baseline's: two numeric
    ties, a real divergence and one a vLLM engine could not judge."""
    db = build(tmp_path_factory.mktemp("app_mismatch") / "runs.duckdb")
    for i, divergence in enumerate(["tie", "tie", "real", "unjudged"]):
        record = speculative_record(f"c1-ng-k2-{divergence}-{i}", "code-01", "ngram", 2, [2, 1, 2, 2, 0], 0.6,
                                    lossless=False, minute=40 + i)
        write_run(db, dataclasses.replace(record, divergence=divergence))
    return db


@pytest.fixture(scope="module")
def tree_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return add_trees(build(tmp_path_factory.mktemp("app_trees") / "runs.duckdb"))


def app(monkeypatch: pytest.MonkeyPatch, db_path: Path, page: str | None = None, **params: str) -> AppTest:
    """The app over `db_path`, opened on `page` with the URL parameters `params`."""
    monkeypatch.setenv("SPECDASH_DB", str(db_path))
    at = AppTest.from_file(APP, default_timeout=30)
    if page:
        at.run()  # switch_page needs the pages st.navigation registers
        at.switch_page(page)
    # Set before the page's widgets first run: a URL value only seeds a widget on its first appearance.
    at.query_params.update(params)
    return at.run()


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def chart_data(element) -> tuple[dict, pd.DataFrame]:
    """A chart's Vega-Lite spec and its data (Streamlit ships named datasets separately, as Arrow)."""
    spec = json.loads(element.proto.spec)
    (dataset,) = element.proto.datasets
    return spec, pa.ipc.open_stream(dataset.data.data).read_pandas()


def fates_in(html: str) -> list[tuple[str, str]]:
    return SPAN.findall(html)


def test_overview_shows_the_hand_computed_numbers(monkeypatch, db):
    at = app(monkeypatch, db)
    assert not at.exception
    assert metrics(at) == {"speculative runs": "9"}
    # The answer: per category the best cell on the prompts every cell ran (code: code-01 only, where ngram k=4
    # takes 0.5 s against the baseline's 1.2 s and accepts 9 of 10 judged drafts); one prompt gives no interval, so
    # the runner-up (k=2, 2.0×) is not told apart from it: a tie.
    head = at.dataframe[0].value.set_index("category")
    assert head.loc["code", ["name", "speedup", "alpha", "prompts", "tied", "runner_up"]].tolist() == [
        "prompt lookup (ngram) at k=4 · fixed", pytest.approx(2.4), pytest.approx(0.9), 1, True,
        "prompt lookup (ngram) at k=2 · fixed"]
    assert head.loc["poem", ["name", "speedup", "alpha"]].tolist() == [
        "prompt lookup (ngram) at k=2 · fixed", pytest.approx(1.2), pytest.approx(1 / 9)]  # 1 accepted, 8 rejected
    cells = at.dataframe[1].value.set_index(["category", "draft", "k"])
    # code-01's run alone (code-02, which only this cell ran, is left out): 7 of 8 judged, 12 tokens in 5 rounds
    assert cells.loc[("code", "ngram", 2), ["alpha", "tau", "thrown_share", "speedup"]].tolist() == \
        pytest.approx([7 / 8, 2.4, 0.0, 2.0])
    assert cells.loc[("poem", "ngram", 4), ["thrown", "drafted", "thrown_share"]].tolist() == \
        pytest.approx([27, 38, 27 / 38])
    assert len(at.get("vega_lite_chart")) == 3


def test_overview_theory_chart_holds_the_curve_and_the_runs(monkeypatch, db):
    at = app(monkeypatch, db, chart_k="4")
    assert at.selectbox(key="chart_k").value == 4
    spec, data = chart_data(at.get("vega_lite_chart")[1])
    assert spec["title"].startswith("measured speedup against the formula's curve, k = 4")
    assert [layer["mark"]["type"] for layer in spec["spec"]["layer"]] == ["line", "rule", "circle"]
    curve = data[data["source"] == "theory"].set_index(["series", "alpha"])["speedup"]
    # k = 4, c = 0.05: α = 0.5 → (1 − 0.5⁵) / (0.5 · 1.2)
    assert curve[("prompt lookup (ngram) · greedy", 0.5)] == pytest.approx((1 - 0.5**5) / 0.6)
    dots = data[data["source"] == "measured"].set_index("run_id")
    assert sorted(dots.index) == ["c1-ls-k4", "c1-ng-k4", "p1-ls-k4", "p1-ng-k4"]
    assert dots.loc["c1-ng-k4", ["alpha", "speedup"]].tolist() == pytest.approx([0.9, 2.4])


def test_overview_filters_come_from_the_url_and_the_widgets(monkeypatch, db):
    at = app(monkeypatch, db, category="poem")
    assert at.multiselect(key="category").value == ["poem"]
    assert metrics(at)["speculative runs"] == "4"
    assert set(at.dataframe[0].value["category"]) == {"poem"}
    at.multiselect(key="category").unselect("poem").select("code").run()
    at.multiselect(key="k").select(4).run()
    assert metrics(at)["speculative runs"] == "2"
    assert at.dataframe[1].value[["draft", "k"]].values.tolist() == [["layerskip:2", 4], ["ngram", 4]]


def test_compare_leaderboard_and_head_to_head(monkeypatch, db):
    at = app(monkeypatch, db, "compare.py")
    assert not at.exception
    board = at.dataframe[0].value.set_index("draft")
    ngram, skip = "prompt lookup (ngram)", "layer skip (layerskip:2)"
    assert board.index.tolist() == [ngram, skip]  # ranked by the geometric mean of best speedups
    # Judged on code-01, the one code prompt every cell ran: k=4 (2.4×) beats k=2 (2×), which only the easy code-02
    # lifted to √8 ≈ 2.83× when pooled; one prompt each, so "≈" the runner-up: a tie.
    assert board.loc[ngram, ["code best", "code speedup", "code α", "code 95%", "code tie", "prompts"]].tolist() == \
        ["k=4 · fixed", pytest.approx(2.4), pytest.approx(0.9), "1 prompt", "≈ k=2 · fixed", "1"]
    assert board.loc[skip, ["poem best", "poem speedup", "poem α"]].tolist() == \
        ["k=4 · fixed", pytest.approx(1.0), pytest.approx(0.8)]
    assert board["setup"].unique().tolist() == ["greedy · skinny kernels · 2 threads · cpu"]
    # p1-ls-k4's output differs, and nothing classified the mismatch
    assert board["lossless"].to_dict() == {ngram: "100%", skip: "75% (1 unjudged)"}
    at.selectbox(key="a").select("ngram").run()
    at.selectbox(key="b").select("layerskip:2").run()
    duel = at.dataframe[1].value.set_index(["category", "k"])
    assert duel.loc[("poem", 4), ["alpha_a", "alpha_b", "speedup_a", "speedup_b", "b_over_a"]].tolist() == \
        pytest.approx([0.0, 0.8, 0.75, 1.0, 1 / 0.75])
    spec, data = chart_data(at.get("vega_lite_chart")[0])
    assert set(data["series"]) == {f"A: {ngram}", f"B: {skip}"}  # one chart, both drafts in it


def test_compare_says_which_k(monkeypatch, db):
    """The "Which k" section: its tables and charts carry the advisor's numbers (tests/store/test_positions.py checks
    them by hand); with no adaptive run recorded, every recommendation is the advisor's k, fixed."""
    at = app(monkeypatch, db, "compare.py")
    assert not at.exception
    advice = at.dataframe[2].value
    skip, ngram = "layer skip (layerskip:2)", "prompt lookup (ngram)"
    assert sorted(zip(advice["draft"], advice["category"], strict=True)) == [
        (skip, "code"), (skip, "poem"), (ngram, "code"), (ngram, "poem")]
    assert set(advice["recommended_policy"]) == {"fixed"}
    assert advice["recommended_k"].tolist() == advice["predicted_best_k"].tolist()
    # Only k = 2 and 4 were recorded: two cells' advisor k is another one, so only the other two are judged (hits)
    assert advice["hit"].tolist() == ["✓ hit" if k in (2, 4) else "not judged: no run at its k"
                                      for k in advice["predicted_best_k"]]
    # The measured answer is the leaderboard's, k and policy named
    assert dict(zip(zip(advice["draft"], advice["category"], strict=True), advice["measured_choice"],
                    strict=True)) == {(skip, "code"): "k=2 · fixed", (skip, "poem"): "k=4 · fixed",
                                      (ngram, "code"): "k=4 · fixed", (ngram, "poem"): "k=2 · fixed"}
    assert at.metric[0].value == "2 of 2"
    spec, positions = chart_data(at.get("vega_lite_chart")[1])
    assert "facet" not in spec and set(positions["series"]) == {"prompt lookup (ngram) · greedy",
                                                                "layer skip (layerskip:2) · greedy"}
    ngram = positions[positions["series"] == "prompt lookup (ngram) · greedy"].set_index("position")
    # ngram, pooled over code and poem. On code, accepted per round 2 1 2 2 (0: no room left to draft) | 4 2 3 |
    # 2 2 2 2 (depths 2 | 4 4 3 | 2): all 11 rounds that drafted accepted d1, 10 of the 11 that reached d2 accepted
    # it, 2 of the 3 at d3, the 1 at d4. On poem, k=2: 8 rounds drafted (the one at 10 tokens a single draft), one
    # accepted d1 and went on to reject d2; k=4: 11 rounds, each rejected d1. A mean of the two categories' rates at
    # d1 would be (11/11 + 1/19) / 2 = 0.53; pooled, it is 12 of 30.
    assert ngram[["reached", "accepted"]].values.tolist() == [[30, 12], [12, 10], [3, 2], [1, 1]]
    assert ngram["rate"].tolist() == pytest.approx([12 / 30, 10 / 12, 2 / 3, 1.0])
    _, curve = chart_data(at.get("vega_lite_chart")[2])
    assert set(curve["source"]) == {"advisor", "measured", "theory"}


def test_overview_and_compare_split_the_lossless_mismatches_the_same_way(monkeypatch, mismatch_db):
    at = app(monkeypatch, mismatch_db)
    cells = at.dataframe[1].value.set_index(["category", "draft", "k"])["lossless"]
    # ngram k=2 on code, on code-01 alone (the prompt every code cell ran): c1-ng-k2 equal, then the four that differ
    assert cells[("code", "ngram", 2)] == "20% (1 real divergence, 2 numeric ties, 1 unjudged)"
    assert cells[("poem", "layerskip:2", 4)] == "0% (1 unjudged)"  # p1-ls-k4, recorded unclassified
    assert cells[("poem", "ngram", 4)] == "100%"
    at = app(monkeypatch, mismatch_db, "compare.py")
    board = at.dataframe[0].value.set_index("draft")["lossless"]
    # Over every selected run: ngram's 5 equal runs and the 4 that differ; layerskip:2's 3 and p1-ls-k4
    assert board.to_dict() == {"prompt lookup (ngram)": "56% (1 real divergence, 2 numeric ties, 1 unjudged)",
                               "layer skip (layerskip:2)": "75% (1 unjudged)"}


def test_compare_draws_the_position_series_with_the_most_rounds_until_others_are_picked(monkeypatch, db):
    monkeypatch.setattr(k_advice, "MANY", 1)
    at = app(monkeypatch, db, "compare.py")
    # Both drafts were judged at 2 or more positions; ngram's rounds reached d1 30 times, layerskip:2's 23 times
    # (7 + 5 rounds that drafted on code-01, 7 + 4 on poem-01).
    picker = at.multiselect(key="position_series")
    assert picker.value == ["prompt lookup (ngram) · greedy"]
    _, positions = chart_data(at.get("vega_lite_chart")[1])
    assert set(positions["series"]) == {"prompt lookup (ngram) · greedy"}
    picker.select("layer skip (layerskip:2) · greedy").run()
    _, positions = chart_data(at.get("vega_lite_chart")[1])
    skip = positions[positions["series"] == "layer skip (layerskip:2) · greedy"]
    assert skip.loc[skip["position"] == 1, "reached"].tolist() == [23]


def test_replay_colours_every_token_by_its_fate(monkeypatch, db):
    at = app(monkeypatch, db, "replay.py", run="p1-ls-k4")
    assert not at.exception
    assert "target tiny-target on cpu (float32, skinny kernels, 2 threads)" in at.caption[0].value
    # 13 drafts at 0.02 s; three passes over 4 drafts at 0.05·1.4 s and one over 1 draft at 0.05·1.1 s
    assert metrics(at) == {"rounds": "4", "drafts accepted / rejected / thrown": "8 / 2 / 3", "α": "0.800",
                           "τ": "3.00", "draft time": "260.0 ms", "verify time": "265.0 ms",
                           "measured speedup": "1.00×", "formula's prediction": f"{(1 - 0.8**5) / (0.2 * 2.6):.2f}×",
                           "lossless": "✗"}
    text, rounds = (h.proto.body for h in at.get("html")[1:3])
    assert fates_in(text) == [
        ("accepted", "[300]"), ("accepted", "[301]"), ("accepted", "[302]"), ("correction", "[303]"),
        ("correction", "[304]"), ("accepted", "[305]"), ("accepted", "[399]"), ("accepted", "[307]"),
        ("accepted", "[308]"), ("bonus", "[309]"), ("accepted", "[310]"), ("bonus", "[311]")]
    first_round = rounds.split('<tr data-round="0">')[1].split("</tr>")[0]
    assert fates_in(first_round) == [("accepted", "[300]"), ("accepted", "[301]"), ("accepted", "[302]"),
                                     ("rejected", "[900]"), ("correction", "[303]")]
    assert at.warning[0].value == "This output differs from its baseline's from token 6 on."
    assert not at.get("vega_lite_chart")  # a chain has no tree to draw
    at.button(key="open_baseline").click().run()
    assert at.selectbox(key="run").value == "poem-01-base"
    assert at.get("html")[1].proto.body.count('data-fate="plain"') == 12


def test_overview_and_compare_show_a_trees_nodes_per_round(monkeypatch, tree_db):
    # c2-tree-k3: 13 nodes in the 4 rounds that drafted, 12 tokens in 5 rounds (test_dashboard_queries.py)
    at = app(monkeypatch, tree_db)
    cells = at.dataframe[1].value.set_index(["category", "draft", "k"])
    assert cells.loc[("code", "ngram", 4), "nodes_per_round"] == pytest.approx(11 / 3)
    # The tree ran code-02 alone, which the four cells on code-01 did not: every page leaves it out, by name.
    assert "ngram-tree" not in set(cells.index.get_level_values("draft"))
    left_out = ("Left out, since they missed a prompt the other cells of their setup ran: prompt lookup tree "
                "(ngram-tree) k=3 · fixed on code.")
    assert any(left_out in caption.value for caption in at.caption)
    at = app(monkeypatch, tree_db, "compare.py")
    assert not at.exception
    assert "prompt lookup tree (ngram-tree)" not in set(at.dataframe[0].value["draft"])
    assert any(left_out in caption.value for caption in at.caption)
    spec, positions = chart_data(at.get("vega_lite_chart")[1])
    assert spec["layer"][0]["encoding"]["x"]["title"] == "draft position / tree depth"  # chains and a tree
    tree = positions[positions["series"] == "prompt lookup tree (ngram-tree) · greedy"]
    assert tree[["position", "reached", "accepted"]].values.tolist() == [[1, 4, 3], [2, 3, 3], [3, 2, 1]]


def test_replay_draws_a_tree_round(monkeypatch, tree_db):
    at = app(monkeypatch, tree_db, "replay.py", run="c2-tree-k3")
    assert not at.exception
    assert [fate for fate, _ in fates_in(at.get("html")[1].proto.body)] == [
        "accepted", "accepted", "correction", "accepted", "accepted", "accepted", "bonus", "correction", "plain",
        "accepted", "accepted", "bonus"]
    first_round = at.get("html")[2].proto.body.split('<tr data-round="0">')[1].split("</tr>")[0]
    assert fates_in(first_round) == [("accepted", "[200]"), ("accepted", "[201]"), ("rejected", "[902]"),
                                     ("thrown", "[950]"), ("correction", "[202]")]
    assert at.selectbox(key="tree_round").options == ["0", "1", "2"]  # round 4's two nodes made a chain
    spec, tree = chart_data(at.get("vega_lite_chart")[0])
    assert spec["layer"][1]["encoding"]["x"]["title"] == "depth (level of the tree)"
    assert tree[["node", "depth", "lane", "fate", "stop"]].values.tolist() == [
        [-1, 0, 0.5, "root", False], [0, 1, 0.0, "accepted", False], [1, 2, 0.0, "accepted", True],
        [2, 3, 0.0, "rejected", False], [3, 1, 1.0, "thrown", False]]
    assert tree["text"].tolist()[1:] == ["[200]", "[201]", "[902]", "[950]"]
    at = app(monkeypatch, tree_db, "replay.py", run="c2-tree-k3", tree_round="2")  # the round is in the URL
    _, tree = chart_data(at.get("vega_lite_chart")[0])
    # the path stopped at the root, whose token is 206, the round before's bonus
    assert tree[["node", "fate", "stop"]].values.tolist() == [
        [-1, "root", True], [0, "rejected", False], [1, "thrown", False], [2, "thrown", False]]
    assert tree["text"].iloc[0] == "[206]" and tree["target_text"].iloc[0] == "[207]"


def test_replay_of_a_failed_run_and_of_a_draftless_round(monkeypatch, db):
    at = app(monkeypatch, db, "replay.py", run="c1-ls-k8")
    assert at.error[0].value == "This run failed: out of memory"
    assert "(float32, kernels not recorded, threads not recorded)" in at.caption[0].value
    at = app(monkeypatch, db, "replay.py", run="p1-ng-k2")
    text = at.get("html")[1].proto.body
    assert fates_in(text)[:3] == [("plain", "[300]"), ("accepted", "[301]"), ("correction", "[302]")]


def test_replay_decodes_with_the_targets_tokenizer(monkeypatch, tmp_path):
    vocab = {f"w{i}": i for i in range(1000)} | {"[UNK]": 1000}
    core = Tokenizer(tok_models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]").save_pretrained(tmp_path / "tok")
    db = build(tmp_path / "runs.duckdb", target=str(tmp_path / "tok"))
    at = app(monkeypatch, db, "replay.py", run="c1-ng-k4")
    assert fates_in(at.get("html")[1].proto.body)[:6] == [
        ("accepted", "w100"), ("accepted", "w101"), ("accepted", "w102"), ("accepted", "w103"),
        ("bonus", "w104"), ("accepted", "w105")]


def test_sql_example_runs_on_a_click(monkeypatch, db):
    at = app(monkeypatch, db, "sql_page.py")
    assert not at.dataframe  # nothing runs before a click
    at.button(key=f"example_{list(EXAMPLES).index('α per category × draft × k')}").click().run()
    assert at.text_area(key="sql").value == EXAMPLES["α per category × draft × k"]
    result = at.dataframe[0].value
    assert result[["category", "draft", "k", "runs"]].values.tolist() == [
        ["code", "layerskip:2", 2, 1], ["code", "layerskip:2", 4, 1], ["code", "ngram", 2, 2], ["code", "ngram", 4, 1],
        ["poem", "layerskip:2", 2, 1], ["poem", "layerskip:2", 4, 1], ["poem", "ngram", 2, 1], ["poem", "ngram", 4, 1]]
    assert result["alpha"].tolist() == [0.364, 0.545, 0.938, 0.9, 0.4, 0.8, 0.111, 0.0]
    assert [c.value for c in at.caption if re.fullmatch(r"8 rows in \d+ ms", c.value)]
    assert at.get("download_button")


def test_sql_from_the_url_fills_the_editor_and_waits_for_run(monkeypatch, db):
    at = app(monkeypatch, db, "sql_page.py", sql="SELECT count(*) AS n FROM runs")
    assert at.text_area(key="sql").value == "SELECT count(*) AS n FROM runs"
    assert not at.dataframe
    at.button(key="run_sql").click().run()
    assert at.dataframe[0].value["n"].tolist() == [13]  # 3 baselines, 9 speculative runs, 1 failed run


@pytest.mark.parametrize("statement", ["DROP TABLE runs", "COPY runs TO '{out}'"])
def test_sql_refuses_writes_and_file_access(monkeypatch, db, tmp_path, statement):
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    out = tmp_path / "x.csv"
    at = app(monkeypatch, db, "sql_page.py")
    at.text_area(key="sql").input(statement.format(out=out)).run()
    at.button(key="run_sql").click().run()
    assert at.error[0].value.startswith("refused: only read statements")
    assert not at.dataframe
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before and not out.exists()


def test_missing_database_shows_how_to_record(monkeypatch, tmp_path):
    missing = tmp_path / "nowhere.duckdb"
    for page in (None, "compare.py", "replay.py", "sql_page.py"):
        at = app(monkeypatch, missing, page)
        assert not at.exception
        assert at.info[0].value.startswith(f"There is no database at `{missing}` yet.")
        assert "python -m runner sweep" in at.markdown[0].value
    assert not missing.exists()  # looking must not create it


def test_empty_database_shows_the_empty_state(monkeypatch, tmp_path):
    empty = tmp_path / "empty.duckdb"
    duckdb.connect(str(empty)).close()
    at = app(monkeypatch, empty)
    assert at.info[0].value.startswith(f"`{empty}` holds no runs yet.")


def test_foreign_files_get_a_clear_message(monkeypatch, tmp_path):
    text = tmp_path / "notes.duckdb"
    text.write_text("not a database at all, just some words")
    at = app(monkeypatch, text)
    assert not at.exception
    assert at.error[0].value == f"{text} is not a specdash database (not a DuckDB file)"
    other = tmp_path / "other.duckdb"
    with duckdb.connect(str(other)) as con:
        con.execute("CREATE TABLE measurements (x INTEGER)")
    at = app(monkeypatch, other, "sql_page.py")
    assert at.error[0].value == f"{other} is not a specdash database"


def test_the_dashboard_lets_the_runner_write_and_shows_new_runs(monkeypatch, tmp_path):
    db = build(tmp_path / "runs.duckdb")
    at = app(monkeypatch, db)
    assert metrics(at)["speculative runs"] == "9"
    # No handle stays open: the write neither waits for a lock nor spills to runs.duckdb.pending/.
    assert write_run(db, speculative_record("p1-ng-k2-again", "poem-01", "ngram", 2, [2, 2, 2, 2], 0.5),
                           lock_timeout_s=2) == 0
    assert not (tmp_path / "runs.duckdb.pending").exists()
    at.run()  # a refresh
    assert metrics(at)["speculative runs"] == "10"


def test_a_page_waits_for_the_runners_write_lock(monkeypatch, tmp_path):
    db = build(tmp_path / "runs.duckdb")
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys; con = duckdb.connect(sys.argv[1]); "
                               "print('locked', flush=True); sys.stdin.readline(); con.close()", str(db)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    waits: list[float] = []

    class Clock:  # the store's clock, except that the page's third wait lets the writer go
        monotonic = staticmethod(time.monotonic)

        @staticmethod
        def sleep(seconds: float) -> None:
            waits.append(seconds)
            if len(waits) == 3:
                holder.stdin.write("done\n")
                holder.stdin.flush()
                holder.wait()
            time.sleep(seconds)

    try:
        assert holder.stdout.readline().strip() == "locked"
        monkeypatch.setattr(connect, "time", Clock)
        at = app(monkeypatch, db)  # opens read-only while another process holds the file read-write
        assert not at.exception and metrics(at)["speculative runs"] == "9"
        assert len(waits) == 3 and holder.returncode == 0  # it waited three times, then read
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_sql_says_when_it_cuts_the_result(monkeypatch, db):
    at = app(monkeypatch, db, "sql_page.py", sql="SELECT range AS i FROM range(100001)")
    at.button(key="run_sql").click().run()
    assert at.warning[0].value.startswith("Showing the first 100,000 rows: the query returned more.")
    # every row kept, shown a page at a time
    assert at.dataframe[0].value["i"].tolist() == list(range(25))
    at.number_input(key="sql_page").set_value(3).run()
    assert at.dataframe[0].value["i"].tolist() == list(range(50, 75))
    assert any(c.value == "rows 51–75 of 100,000" for c in at.caption)


def test_benchmark_page_shows_each_bench_its_goals_and_its_verify_curve(monkeypatch, tmp_path):
    db = build(tmp_path / "runs.duckdb")
    at = app(monkeypatch, db, "bench_page.py")
    assert [i.value for i in at.info][0].startswith("No benchmark is recorded in this file.")
    add_benches(db)
    at = app(monkeypatch, db, "bench_page.py")
    assert not at.exception and at.selectbox(key="bench").value == "b-new"  # the newest first
    assert metrics(at)["goals met"] == "1 of 2"
    _, curve = chart_data(at.get("vega_lite_chart")[0])
    assert curve[["shape", "kernels", "rows", "relative"]].values.tolist() == [
        ["chain", "skinny", 1, 1.0], ["chain", "skinny", 2, 1.6], ["chain", "skinny", 3, 2.0],
        ["chain", "stock", 1, 1.0], ["chain", "stock", 2, 2.0], ["chain", "stock", 3, 3.0],
        ["tree", "skinny", 5, 1.5]]
    assert set(curve["threads"]) == {"1 thread"}
    plain, spec, adaptive, verify, verify_stock = (t.value for t in at.dataframe)
    # The policy ours drafted under is a column only where it is not a fixed k.
    # Each table's columns say what it compares.
    assert "policy" not in spec and adaptive[["k", "policy", "ours, policy / transformers heuristic"]].values.tolist(
        ) == [[2, "heuristic", "1.20× (1.08–1.32×)"]]
    assert verify_stock["pass / one-token pass"].tolist() == [
        "1.00× (0.90–1.10×)", "2.00× (1.80–2.20×)", "3.00× (2.70–3.30×)"]
    assert plain.iloc[0][["ours", "transformers", "ours / transformers", "goal"]].tolist()[2:] == [
        "1.20× (1.08–1.32×)", "✓ ratio >= 1"]
    assert spec.iloc[0][["ours", "ours / transformers assisted", "goal"]].tolist() == [
        "21.00 (18.90–23.10)", "1.10× (0.99–1.21×)", "✗ ratio >= 1.15"]
    assert verify["category"].unique().tolist() == ["all"]  # the thread count is no category
    assert verify[["draft", "pass"]].values.tolist() == [
        ["none", "70.00 (63.00–77.00)"], ["none", "112.00 (100.80–123.20)"], ["none", "140.00 (126.00–154.00)"],
        ["tree", "105.00 (94.50–115.50)"]]
    older = app(monkeypatch, db, "bench_page.py", bench="b-old")  # a shared URL picks the bench
    assert metrics(older)["goals met"] == "1 of 1" and len(older.dataframe) == 1


def test_a_verify_curve_at_two_thread_counts_shows_them_as_threads_not_categories():
    from dashboard import bench_page

    rows = pd.DataFrame([{"metric": "verify_ms", "unit": "ms", "draft": "none", "k": 1, "k_policy": "fixed",
                          "category": f"threads={n}", "threads": n, "ours": 10.0 * n, "ours_min": 9.0 * n,
                          "ours_max": 11.0 * n, "theirs": 8.0 * n, "theirs_min": 8.0 * n, "theirs_max": 8.0 * n,
                          "ratio": 1.25, "ratio_min": 1.1, "ratio_max": 1.4, "alpha": None, "c": None, "goal": None,
                          "goal_met": None, "mismatches": None} for n in (1, 2)])
    shown = bench_page.table(rows)
    assert shown[["category", "threads", "pass", "one-token pass"]].values.tolist() == [
        ["all", 1, "10.00 (9.00–11.00)", "8.00 (8.00–8.00)"], ["all", 2, "20.00 (18.00–22.00)", "16.00 (16.00–16.00)"]]
    assert "theirs" not in shown and "α" not in shown
