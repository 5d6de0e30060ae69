"""The replay of a sampled run shows each judged draft's test and names the residual draw; bad URL values are
named, not dropped."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from runner.store.runs import write_run
from tests.dashboard.test_dashboard_app import app, fates_in
from tests.helpers.dashboard_fixtures import build, speculative_record

ACCEPTED, REJECTED = (0.6, 1.0, 0.3), (0.2, 1.0, 0.9)  # (p, q, u) of an accepted and of the rejected draft


def _sampled(record):
    """The greedy fixture run as a sampled one: each round's judged drafts tested, a rejection's token residual."""
    rounds = []
    for r in record.generation.rounds:
        tests = [ACCEPTED] * r.accepted + [REJECTED] * r.rejected
        p, q, u = (tuple(t[i] for t in tests) for i in range(3)) if tests else ((), (), ())
        rounds.append(dataclasses.replace(r, draft_p=p or None, draft_q=q or None, draft_u=u or None,
                                          from_residual=bool(r.rejected)))
    generation = dataclasses.replace(record.generation, rounds=tuple(rounds))
    return dataclasses.replace(record, run_id="c1-ng-k2-sample", mode="sample", temperature=1.0,
                               generation=generation, lossless=None)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = build(tmp_path_factory.mktemp("sampled") / "runs.duckdb")
    # accepted per round 2, 1, 2, 2, then a k = 0 round: one rejection, in round 1
    write_run(path, _sampled(speculative_record("c1-ng-k2", "code-01", "ngram", 2, [2, 1, 2, 2, 0], 0.6)))
    return path


def test_the_replay_shows_the_sampling_test_per_draft(monkeypatch, db):
    at = app(monkeypatch, db, "replay.py", run="c1-ng-k2-sample")
    assert not at.exception
    rounds = at.get("html")[2].proto.body
    assert "sampling test: accept when u &lt; min(1, p/q)" in rounds
    second = rounds.split('<tr data-round="1">')[1].split("</tr>")[0]
    lines = second.split('<td class="test">')[1].split("</td>")[0].split("\n")
    assert [line.strip().split("  ", 1)[1] for line in lines] == [
        "p 0.600  q 1.000  min(1, p/q) 0.600  u 0.300  ✓ u < min",
        "p 0.200  q 1.000  min(1, p/q) 0.200  u 0.900  ✗ u ≥ min"]
    # the token after the rejection is the residual draw, in the text and in the round's row
    assert [fate for fate, _ in fates_in(second)] == ["accepted", "rejected", "residual"]
    assert "correction" not in [fate for fate, _ in fates_in(at.get("html")[1].proto.body)]


def test_a_bad_url_value_is_named(monkeypatch, db):
    at = app(monkeypatch, db, "replay.py", run="doesnotexist")
    assert [w.value for w in at.warning] == ["No run “doesnotexist” in this database: pick one below."]
    at = app(monkeypatch, db, draft="nosuch")
    assert "draft: no speculative run has “nosuch”; that filter value was left out." in [w.value for w in at.warning]
