"""Speedup and throughput against batch size (runner/store/batches.py) and the Batches page, over the hand-built
database plus batches whose numbers are chosen by hand.

ngram k=2 on the two code prompts: alone (the fixture) 2.0× and 4.0×, geometric mean √8 = 2.83×. At batch 2 the
plain batch takes 1.5 s for 12 tokens each; ngram's members take 1.0 s and 1.2 s: speedups 1.5× and 1.25×, geometric
mean √1.875 = 1.37×, and 24 tokens / 1.2 s = 20 tokens/s per batch (plain: 24 / 1.5 = 16). At batch 4 every plain
member takes 2.0 s and every ngram member 2.5 s: 0.8×. So ngram k=2 pays up to batch 2 and is below 1× at 4.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import duckdb
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from runner.store import advisor, batches, comparable
from runner.store.metrics import Filters
from runner.store.runs import write_run
from tests.helpers.dashboard_fixtures import baseline_record, build, speculative_record

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")
CODE = ["code-01", "code-02"]


def _member(record, run_id: str, wall_s: float, size: int, slot: int, batch_id: str, baseline: str | None):
    return replace(record, run_id=run_id, generation=replace(record.generation, wall_s=wall_s), batch_size=size,
                   batch_slot=slot, batch_id=batch_id, baseline_run_id=baseline)


def add_batches(db: Path) -> Path:
    for size, plain_s, ngram_s in ((2, [1.5, 1.5], [1.0, 1.2]), (4, [2.0] * 4, [2.5] * 4)):
        for slot in range(size):
            prompt = CODE[slot % 2]
            base = f"b{size}-none-{slot}"
            write_run(db, _member(baseline_record(prompt), base, plain_s[slot], size, slot, f"b{size}-none", None))
            spec = speculative_record("x", prompt, "ngram", 2, [2, 2, 2, 2], 1.0)
            write_run(db, _member(spec, f"b{size}-ng-{slot}", ngram_s[slot], size, slot, f"b{size}-ng", base))
    return db


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return add_batches(build(tmp_path_factory.mktemp("batches") / "runs.duckdb"))


@pytest.fixture(scope="module")
def curve(db: Path):
    with duckdb.connect(str(db), read_only=True) as con:
        frame = batches.curve(con, Filters(category=("code",)))
    return frame


def row(frame, draft: str, size: int):
    picked = frame[(frame["draft"] == draft) & (frame["batch_size"] == size) & (frame["k"].fillna(0) != 4)]
    assert len(picked) == 1
    return picked.iloc[0]


def test_the_curve_gives_speedup_and_throughput_per_batch_size(curve):
    assert row(curve, "ngram", 1)["speedup"] == pytest.approx(math.sqrt(8))
    two = row(curve, "ngram", 2)
    assert (two["runs"], two["batches"]) == (2, 1)
    assert two["speedup"] == pytest.approx(math.sqrt(1.5 * 1.25))
    assert two["tokens_per_s_per_batch"] == pytest.approx(24 / 1.2)
    assert two["tokens_per_s_per_seq"] == pytest.approx((12 / 1.0 + 12 / 1.2) / 2)
    assert row(curve, "none", 2)["tokens_per_s_per_batch"] == pytest.approx(16)
    assert math.isnan(row(curve, "none", 2)["speedup"])
    assert row(curve, "ngram", 4)["speedup"] == pytest.approx(0.8)
    assert row(curve, "ngram", 4)["tokens_per_s_per_batch"] == pytest.approx(48 / 2.5)


def test_the_crossover_is_the_first_batch_size_below_one_after_paying(curve):
    cross = batches.crossovers(curve).set_index(["draft", "k"])
    assert list(cross.loc[("ngram", 2), "batch_sizes"]) == [1, 2, 4]
    assert cross.loc[("ngram", 2), "crossover"] == 4
    assert cross.loc[("ngram", 2), "pays"] == "up to batch 2; below 1× at 4"
    assert cross.loc[("ngram", 4), "pays"] == "at every batch measured (to 1)"  # k=4 ran alone only
    assert math.isnan(cross.loc[("layerskip:2", 2), "crossover"])


def test_the_best_k_table_has_a_column_per_batch_size(db):
    with duckdb.connect(str(db), read_only=True) as con:
        table = batches.best_k_by_batch(comparable.best_cells(con, Filters(category=("code",))))
    ngram = table[table["draft"] == "ngram"].iloc[0]
    # Alone, on code-01 (the code prompt every cell ran): k=4 2.40× against k=2 2.00×, one prompt each: a tie. At
    # batch 2, 1.5× and 1.25×: ln sd |ln 1.5 − ln 1.25| / √2, t(0.975, 1) = 12.706. At batch 4, 0.8× on both prompts.
    half = 12.706204736 * abs(math.log(1.5 / 1.25)) / 2
    low, high = math.sqrt(1.875) * math.exp(-half), math.sqrt(1.875) * math.exp(half)
    assert (ngram["batch 1"], ngram["batch 2"], ngram["batch 4"]) == (
        "k=4 · fixed 2.40× (1 prompt) ≈ k=2 · fixed", f"k=2 · fixed 1.37× ({low:.2f}–{high:.2f})",
        "k=2 · fixed 0.80× (0.80–0.80)")


def test_batch_stats_and_the_sql_example_agree_with_the_curve(db):
    with duckdb.connect(str(db), read_only=True) as con:
        got = con.execute("""SELECT batches, runs, measured_speedup, tokens_per_s_per_batch FROM batch_stats
                             WHERE draft = 'ngram' AND batch_size = 2""").fetchall()
    assert got == [(1, 2, pytest.approx((1.5 + 1.25) / 2), pytest.approx(20.0))]


def test_the_batches_page_draws_both_curves_and_names_the_crossover(monkeypatch, db):
    monkeypatch.setenv("SPECDASH_DB", str(db))
    at = AppTest.from_file(APP, default_timeout=30)
    at.run()
    at.switch_page("batches_page.py")
    at.query_params.update({"category": "code"})
    at.run()
    assert not at.exception
    charts = at.get("vega_lite_chart")
    titles = [json.loads(c.proto.spec)["spec"]["layer"][0]["encoding"]["y"]["title"] for c in charts]
    assert titles == ["speedup over plain decoding at the same batch size", "tokens/s per batch"]
    tables = [t.value for t in at.dataframe]
    pays = tables[0].set_index(["draft", "k", "category"])["pays"]
    assert pays[("prompt lookup (ngram)", 2, "code")] == "up to batch 2; below 1× at 4"
    best = tables[1].set_index(["draft", "category"])
    assert best.loc[("prompt lookup (ngram)", "code"), "batch 2"].startswith("k=2 · fixed 1.37× (")
    # The advisor's k: at batch 2, k = 1 would emit 2 tokens in 2 · 0.0025 + 0.055 (v at 4 rows, between the plain
    # batch's 2 rows at 0.05 s and ngram's 6 at 0.06 s) + 0.18 s = 8.3/s against k = 2's 12/s; at batch 4, 2 / (0.01 +
    # 0.055 + 0.52) = 3.4/s against 3 / (0.02 + 0.06 + 0.52) = 5/s. Alone, k = 4, measured 27.5/s against k = 2's 22.
    advised = tables[2].set_index(["draft", "category"])
    assert advised.loc[("ngram", "code")].tolist() == ["k=4 · fixed · measured best"] + [
        "k=2 · fixed · measured best"] * 2


def test_the_advisors_table_says_how_each_advised_k_measured():
    def advice(size, k, policy, best_k, at_advised, best, hit):
        return {"draft": "ngram", "category": "code", "batch_size": size, "recommended_k": k,
                "recommended_policy": policy, "measured_best_k": best_k, "measured_at_predicted": at_advised,
                "measured_best": best, "hit": hit}

    table = batches.advised_k_by_batch(pd.DataFrame([
        advice(1, 3, "fixed", 3, 30.0, 30.0, True), advice(2, 4, "fixed", 3, 20.0, 20.4, True),
        advice(4, 4, "fixed", 2, 10.0, 11.0, False), advice(8, 1, "fixed", 2, None, 8.0, None),
        advice(16, 2, "auto", 2, 4.0, 4.0, True), advice(32, pd.NA, "fixed", 4, None, 2.0, pd.NA)]))
    assert table.drop(columns=["draft", "category"]).iloc[0].tolist() == [
        "k=3 · fixed · measured best", "k=4 · fixed · k=3 +2.0%", "k=4 · fixed · k=2 +10.0%, over 3%",
        "k=1 · fixed · not measured", "k=2 · auto · beat every fixed k",
        "no advice · k=4 measured best"]  # nothing to predict from, as on one k of one prompt


def test_the_advisor_predicts_each_batch_size_from_its_own_shared_passes(db):
    """At batch 2 (ngram k=2, code): every round accepts both drafts (emitted 3, drafted 2); d = 0.0025 s a draft;
    v(0) = 0.05 s (the plain batch's passes), v(2) = 0.06 s; l = Σ(wall − prefill − 2·draft − verify) / rounds =
    ((1.0 − 0.1 − 0.04 − 0.24) + (1.2 − 0.1 − 0.04 − 0.24)) / 8 = 0.18 s. Predicted: 3 / (2·2·0.0025 + 0.06 + 0.18)
    = 12 tokens/s; measured: (11 + 11) / (0.9 + 1.1) = 11."""
    with duckdb.connect(str(db), read_only=True) as con:
        curve = advisor.k_curve(con, Filters(category=("code",), draft=("ngram",)))
        advice = advisor.k_advice(con, Filters(category=("code",), draft=("ngram",)))
    two = curve[(curve["batch_size"] == 2) & (curve["k"] == 2)].iloc[0]
    assert two["predicted_tokens_per_s"] == pytest.approx(12.0)
    assert two["measured_tokens_per_s"] == pytest.approx(11.0)
    assert sorted(advice["batch_size"]) == [1, 2, 4]  # one recommendation per batch size


def test_the_compare_page_keeps_each_batch_size_its_own_setup(monkeypatch, db):
    monkeypatch.setenv("SPECDASH_DB", str(db))
    at = AppTest.from_file(APP, default_timeout=30)
    at.run()
    at.switch_page("compare.py")
    at.run()
    assert not at.exception
    leaderboard, *_, advice = [t.value for t in at.dataframe]
    setups = sorted(set(leaderboard["setup"]))
    alone = "greedy · skinny kernels · 2 threads · cpu"
    assert setups == [alone, f"{alone} · batch 2", f"{alone} · batch 4"]
    ngram = advice[(advice["draft"] == "prompt lookup (ngram)") & (advice["category"] == "code")]
    assert sorted(ngram["setup"]) == setups  # the advisor's answer per batch size, beside the leaderboard's
    # alone, on code-01 (the prompt every compared cell ran), k=4's 2.4× beats k=2's 2.0×
    assert list(ngram.sort_values("setup")["measured_choice"]) == ["k=4 · fixed", "k=2 · fixed", "k=2 · fixed"]


def batch_of_two_curve(db: Path, last_pass_s: float):
    """ngram k=2 at batch 2 (code), the advisor's curve: code-01 drafts 2 in each of its 4 rounds, passes 0–3 at 0.06
    s; code-02 finds nothing in every other round ([None, 2, None, 2, None, 2]): pass 4 holds it alone with none
    (0.05 s), pass 5 alone with its last drafts (`last_pass_s`)."""
    plans = (("code-01", [2, 2, 2, 2], 0.9, [0.06] * 4), ("code-02", [None, 2, None, 2, None, 2], 1.2,
                                                         [0.06] * 4 + [0.05, last_pass_s]))
    for slot, (prompt, schedule, wall_s, passes) in enumerate(plans):
        base = f"w-none-{slot}"
        write_run(db, _member(baseline_record(prompt), base, 1.5, 2, slot, "w-none", None))
        spec = speculative_record("x", prompt, "ngram", 2, schedule, 1.0)
        rounds = tuple(replace(r, verify_s=v) for r, v in zip(spec.generation.rounds, passes, strict=True))
        spec = replace(spec, generation=replace(spec.generation, rounds=rounds))
        write_run(db, _member(spec, f"w-ng-{slot}", wall_s, 2, slot, "w-ng", base))
    with duckdb.connect(str(db), read_only=True) as con:
        curve = advisor.k_curve(con, Filters(category=("code",), draft=("ngram",), batch_size=(2,)))
    return curve[curve["k"] == 2].iloc[0]


def test_a_batch_pass_is_as_wide_as_its_widest_member(tmp_path):
    """Passes 0–3 carry both members padded to code-01's drafts: 2 · 3 = 6 rows at 0.06 s, even where code-02
    drafted none; pass 4 holds code-02 alone with none (1 row, 0.05 s), pass 5 its last drafts (3 rows, 0.06 s); the
    plain batch's 12 passes are 2 rows at 0.05 s. So v(r) by rows: v(1) = v(2) = 0.05, v(3) = 0.06, v(6) = 0.06
    (v(4), v(5) between v(3) and v(6)).
    Pooled per position, w = s = 7/10 (7 of 10 rounds drafted and accepted both). Of the member's 10 passes, 8 were
    shared by 2 and 2 were its own: with 2 live, a pass is at least i wide when either drafted that far, 1 − (1 − 0.7)²
    = 0.91, so 0.05 + 0.91 · (v(6) − v(2)) = 0.0591 s; alone, 0.05 + 0.7 · (v(3) − v(1)) = 0.057 s; verify =
    0.8 · 0.0591 + 0.2 · 0.057 = 0.05868 s. Drafting 2 · 1.4 · 0.0025 = 0.007 s; l = ((0.9 − 0.1 − 0.04 − 0.24) + (1.2
    − 0.1 − 0.03 − 0.35)) / 10 = 0.124 s. Predicted: (1 + 0.7 + 0.7) / (0.007 + 0.05868 + 0.124); measured 22 / 1.9."""
    two = batch_of_two_curve(build(tmp_path / "runs.duckdb"), 0.06)
    assert two["emitted"] == pytest.approx(2.4)
    assert two["predicted_tokens_per_s"] == pytest.approx(2.4 / (0.007 + 0.05868 + 0.124))
    assert two["measured_tokens_per_s"] == pytest.approx(22 / 1.9)


def test_a_shared_pass_counts_once_for_each_member_it_carried(tmp_path):
    """As above, but the last pass, code-02 alone with its 2 drafts, takes 0.03 s: v(3) = 0.03, so alone verify =
    0.05 + 0.7 · (0.03 − 0.05) = 0.036 s. A member pays the passes it is in, so the live counts weigh each pass by its
    members: 8 member-passes of 10 at 2 live, 2 alone: verify = 0.8 · 0.0591 + 0.2 · 0.036 = 0.05448 s (by pass, 4 of
    6 shared, (4 · 0.0591 + 2 · 0.036) / 6 = 0.0514 would give the late, lone member's cheap passes a whole pass's
    say). Drafting 0.007 s; l = ((0.9 − 0.1 − 0.04 − 0.24) + (1.2 − 0.1 − 0.03 − 0.32)) / 10 = 0.127 s."""
    two = batch_of_two_curve(build(tmp_path / "runs.duckdb"), 0.03)
    assert two["predicted_tokens_per_s"] == pytest.approx(2.4 / (0.007 + 0.05448 + 0.127))
    assert two["measured_tokens_per_s"] == pytest.approx(22 / 1.9)
