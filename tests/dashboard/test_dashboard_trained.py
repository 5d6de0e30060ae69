"""The Trained drafts page over a hand-built database: a recorded training and greedy runs of its head,
with every shown number worked out by hand below."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.records import Generation, RunRecord
from runner.store.runs import write_run
from runner.store.trainings import TrainingLog
from tests.dashboard.test_dashboard_app import app, chart_data
from tests.helpers.dashboard_fixtures import PROMPTS, SWEEP, TARGET, build, speculative_rounds

DRAFT = "eagle:heads/tiny"
# epoch -> (train loss, held-out loss, per held-out category (judged, accepted) at positions 1 and 2); pooled:
# epoch 0 (100, 10), (10, 1); epoch 1 (100, 50), (50, 20); epoch 2 (100, 60), (60, 30)
EPOCHS = {0: (None, 5.0, {"code": [(60, 9), (9, 1)], "poem": [(40, 1), (1, 0)]}),
          1: (3.0, 3.5, {"code": [(60, 40), (40, 20)], "poem": [(40, 10), (10, 0)]}),
          2: (2.5, 3.0, {"code": [(60, 45), (45, 27)], "poem": [(40, 15), (15, 3)]})}
# Greedy runs of the head, k = 2. code-01 rounds accept 2, 1, 2, 2 (then a k = 0 round): position 1 judged 4,
# accepted 4; position 2 judged 4, accepted 3; α = 7 / 8. poem-01 rounds accept 1, 0, 2, 0, 1, 0 at k = 2, then
# 0 at k = 1 (and a k = 0 round): position 1 judged 7, accepted 3; position 2 judged 3, accepted 1; α = 4 / 10.
SCHEDULES = {"code-01": [2, 1, 2, 2, 0], "poem-01": [1, 0, 2, 0, 1, 0, 0, 0]}


def add_training(db: Path) -> Path:
    log = TrainingLog(db, "t1")
    log.start({"target": TARGET, "draft": DRAFT, "out_dir": "heads/tiny", "train_prompts": 18, "heldout_prompts": 2,
               "epochs": 2, "draft_vocab": 256, "layers": [2, 2, 1], "unroll": 2, "device": "cpu", "threads": 2,
               "load_before": 1.0, "command": f"python -m runner train-draft --out heads/tiny --target {TARGET}"})
    for epoch, (train, heldout, positions) in EPOCHS.items():
        log.epoch(epoch, train, heldout, 1.0, None if epoch == 0 else 0.002, positions)
    log.finish("ok", {"saved_epoch": 2, "train_tokens": 1000, "heldout_tokens": 100, "vocab_coverage": 0.9,
                      "data_cached": False, "data_s": 10.0, "train_s": 20.0, "wall_s": 31.0, "load_after": 1.5})
    for prompt_id, schedule in SCHEDULES.items():
        rounds = speculative_rounds(PROMPTS[prompt_id][1], 2, schedule, 0.005)
        output = tuple(t for r in rounds for t in (r.draft_tokens[:r.accepted] + r.target_tokens[r.accepted:][:1]))
        generation = Generation((1, 2, 3), output, tuple(rounds), 0.1, 0.6, sum(r.k > 0 for r in rounds),
                                "max_new_tokens")
        write_run(db, RunRecord(f"{prompt_id}-eagle", SWEEP, "2026-01-01T13:00:00", TARGET, DRAFT, "eagle",
                                PROMPTS[prompt_id][0], prompt_id, "p", 2, "greedy", 0.0, 1.0, 0, 12, "cpu", "float32",
                                "ok", None, generation, "", f"{prompt_id}-base", True))
    return db


def test_the_page_says_how_to_train_when_nothing_is_recorded(monkeypatch, tmp_path):
    at = app(monkeypatch, build(tmp_path / "runs.duckdb"), "trained.py")
    assert not at.exception and at.info[0].value.startswith("No draft training is recorded in this file.")


def test_the_page_shows_how_a_head_learned_and_how_it_drafts_per_category(monkeypatch, tmp_path):
    db = add_training(build(tmp_path / "runs.duckdb"))
    at = app(monkeypatch, db, "trained.py", train="t1")
    assert not at.exception and at.selectbox(key="train").value == "t1"
    listed = at.dataframe[0].value
    assert listed[["train_id", "saved_epoch", "heldout_first_acceptance", "runs"]].values.tolist() == [
        ["t1", 2, 0.6, 2]]
    loss, acceptance, by_category, positions = (chart_data(c)[1] for c in at.get("vega_lite_chart"))
    assert sorted(loss[["source", "epoch", "loss"]].values.tolist()) == [
        ["held-out", 0, 5.0], ["held-out", 1, 3.5], ["held-out", 2, 3.0], ["training", 1, 3.0], ["training", 2, 2.5]]
    assert acceptance[["epoch", "position", "acceptance"]].values.tolist() == [
        [0, 1, 0.1], [0, 2, 0.1], [1, 1, 0.5], [1, 2, 0.4], [2, 1, 0.6], [2, 2, 0.5]]
    assert by_category[["epoch", "category", "position", "acceptance"]].values.tolist() == [
        [0, "code", 1, 0.15], [0, "code", 2, 1 / 9], [0, "poem", 1, 0.025], [0, "poem", 2, 0.0],
        [1, "code", 1, 40 / 60], [1, "code", 2, 0.5], [1, "poem", 1, 0.25], [1, "poem", 2, 0.0],
        [2, "code", 1, 0.75], [2, "code", 2, 0.6], [2, "poem", 1, 0.375], [2, "poem", 2, 0.2]]
    per_category = at.dataframe[1].value
    assert per_category[["category", "alpha", "best_k"]].values.tolist() == [["code", 7 / 8, 2], ["poem", 0.4, 2]]
    got = {(s, p): a for s, p, a in positions[["series", "position", "acceptance"]].values.tolist()}
    assert got == pytest.approx({("code", 1): 1.0, ("code", 2): 0.75, ("poem", 1): 3 / 7, ("poem", 2): 1 / 3,
                                 ("held-out prompts (training)", 1): 0.6, ("held-out prompts (training)", 2): 0.5})


def test_the_page_opens_on_the_head_in_use_and_follows_the_url(monkeypatch, tmp_path):
    db = add_training(build(tmp_path / "runs.duckdb"))
    later = TrainingLog(db, "t2")  # a newer one-epoch test head that no run used
    later.start({"target": TARGET, "draft": "eagle:heads/scratch", "out_dir": "heads/scratch", "train_prompts": 2,
                 "heldout_prompts": 1, "epochs": 1, "draft_vocab": 256, "layers": [2], "unroll": 1, "device": "cpu",
                 "threads": 2, "load_before": 1.0, "command": "python -m runner train-draft --epochs 1 --learn-context",
                 "learn_context": True})
    later.epoch(0, None, 5.0, 1.0, None, {"code": [(10, 1)]})
    later.finish("ok", {"saved_epoch": 0, "train_tokens": 10, "heldout_tokens": 5, "vocab_coverage": 0.5,
                        "data_cached": False, "data_s": 1.0, "train_s": 1.0, "wall_s": 2.0, "load_after": 1.0})
    at = app(monkeypatch, db, "trained.py")
    assert not at.exception and at.selectbox(key="train").value == "t1"  # the head with recorded runs
    assert "layers 2, 2, 1 · unroll 2 · epoch" in at.caption[0].value  # plain numbers, not np.int32(2)
    at = app(monkeypatch, db, "trained.py", train="t2")
    assert at.selectbox(key="train").value == "t2"
    assert "layers 2 · unroll 1 · learned the prompts' text too · epoch 0 of 1" in at.caption[0].value
    at = app(monkeypatch, db, "trained.py", train="nope")
    assert [w.value for w in at.warning] == ["No training “nope” in this database: pick one below."]
