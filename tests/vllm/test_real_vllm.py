"""A real vLLM, started from .venv-vllm: plain decoding, prompt lookup and the shipped EAGLE-3 head swept on vLLM and
on our engine over the same prompts (greedy, k = 4; two of the built-in suite and one of SPEED-Bench's qualitative
split, from the fixture in its published shape), one vLLM engine per speculative config for the module.

What vLLM reports is held to its own totals and to the output; its plain outputs to ours; its prompt lookup to ours
with vLLM's match rule, step by step; the shipped head's acceptance per position to ours (the gap is printed).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import duckdb
import pytest
from rich.console import Console

from runner.engine.drafters.registry import parse_draft
from runner.engine.round import lossless
from runner.engine.weights import models
from runner.pair_engine import GREEDY
from runner.prompts import load_prompts, select_prompts
from runner.store import speed_bench
from runner.sweep.loop import run_sweep
from runner.sweep.plan import SweepConfig
from runner.vllm.drafts import parse
from runner.vllm.head_ids import for_vllm
from tests.store.speed_bench_fixture import DIRECTORY as SPEED_BENCH

HEAD = str(Path(__file__).resolve().parents[2] / "heads" / "smollm2-135m")
MAX_NEW_TOKENS = 24


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("vllm") / "runs.duckdb"
    prompts = (*select_prompts(load_prompts(), ["summary", "code"], 1),
               *select_prompts(load_prompts(SPEED_BENCH, ["qualitative"]), ["coding"], 1))
    common = dict(target=models.DEFAULT_MODEL, ks=(4,), decodings=(GREEDY,), prompts=prompts,
                  max_new_tokens=MAX_NEW_TOKENS, seed=0, db=path, device="cpu", dtype="float32", threads=1)
    began = time.monotonic()
    run_sweep(SweepConfig(drafts=(parse("ngram:3"), parse(f"eagle:{HEAD}")), engine="vllm", **common),
              Console(quiet=True))
    print(f"\nvLLM sweep, three configs in one vLLM process: {time.monotonic() - began:.0f} s")
    run_sweep(SweepConfig(drafts=(parse_draft("ngram:3:earliest"), parse_draft(f"eagle:{HEAD}")), **common),
              Console(quiet=True))
    return path


def rows(db: Path, sql: str, params: list | None = None) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql, params or []).fetchall()


def test_every_run_is_recorded_ok_with_its_engine(db):
    assert rows(db, "SELECT engine, draft, count(*), count(*) FILTER (status = 'ok') FROM runs GROUP BY ALL "
                    "ORDER BY ALL") == [
        ("specdash", f"eagle:{HEAD}", 3, 3), ("specdash", "ngram:3:earliest", 3, 3), ("specdash", "none", 3, 3),
        ("vllm", f"eagle:{HEAD}", 3, 3), ("vllm", "ngram:3", 3, 3), ("vllm", "none", 3, 3)]
    configs = {draft: (version, json.loads(config)) for draft, version, config in rows(
        db, "SELECT DISTINCT draft, engine_version, engine_config FROM runs WHERE engine = 'vllm'")}
    assert configs == {
        "none": ("0.32.0", None),
        "ngram:3": ("0.32.0", {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
                               "prompt_lookup_min": 1}),
        f"eagle:{HEAD}": ("0.32.0", {"method": "eagle3", "model": str(for_vllm(Path(HEAD))),
                                     "num_speculative_tokens": 4})}


def test_steps_sum_to_vllms_totals_and_rounds_to_the_output(db):
    runs = rows(db, "SELECT run_id, new_tokens, engine_report FROM runs WHERE engine = 'vllm' AND draft <> 'none'")
    for run_id, new_tokens, report in runs:
        report = json.loads(report)
        drafting = rows(db, "SELECT k, accepted FROM rounds WHERE run_id = ? AND k > 0 ORDER BY round", [run_id])
        assert [a for _, a in drafting] == report["per_step_accepted"]
        assert sum(a for _, a in drafting) == report["num_accepted_draft_tokens"]
        assert sum(k for k, _ in drafting) == report["num_draft_tokens"]
        (emitted, untimed), = rows(db, "SELECT sum(emitted), count(*) FILTER (draft_tokens IS NULL AND verify_s IS "
                                       "NULL) = count(*) FROM rounds WHERE run_id = ?", [run_id])
        assert (1 + emitted, untimed) == (new_tokens, True)
    assert rows(db, "SELECT count(*) FROM run_stats WHERE engine = 'vllm' AND c IS NOT NULL") == [(0,)]


def test_plain_outputs_equal_ours_token_for_token_or_at_a_tie(db):
    pairs = rows(db, """SELECT v.prompt_tokens, o.output_tokens, v.output_tokens FROM runs v JOIN runs o
        USING (prompt_id)
        WHERE v.engine = 'vllm' AND o.engine = 'specdash' AND v.draft = 'none' AND o.draft = 'none'""")
    assert len(pairs) == 3
    differ = [(p, ours, theirs) for p, ours, theirs in pairs if ours != theirs]
    if differ:
        target = models.load(models.DEFAULT_MODEL, "cpu", "float32")
        kinds = [lossless.classify(target, tuple(p), tuple(o), tuple(t)).kind for p, o, t in differ]
        assert kinds == ["tie"] * len(differ)


def same_steps(db: Path, theirs: str, ours: str) -> None:
    """Step by step in order. Our engine never drafts past max_new_tokens (k at most the tokens left - 1) where vLLM
    drafts its k and cuts the output: there ours accepted what vLLM did, up to its k, and where one token was left
    ours drafted nothing while vLLM drafted once more."""
    pairs = rows(db, """SELECT v.run_id, o.run_id FROM runs v JOIN runs o USING (prompt_id)
        WHERE v.engine = 'vllm' AND v.draft = ? AND o.engine = 'specdash' AND o.draft = ?""", [theirs, ours])
    assert len(pairs) == 3
    for vllm_run, our_run in pairs:
        steps, drafting = (rows(db, "SELECT k, accepted FROM rounds WHERE run_id = ? AND k > 0 ORDER BY round", [run])
                           for run in (vllm_run, our_run))
        assert [a for _, a in drafting] == [min(a, k) for (_, a), (k, _) in zip(steps, drafting, strict=False)]
        (last_k,), = rows(db, "SELECT k FROM rounds WHERE run_id = ? ORDER BY round DESC LIMIT 1", [our_run])
        assert len(steps) - len(drafting) in ((0, 1) if last_k == 0 else (0,))


def test_our_ngram_with_vllms_rule_accepts_what_vllm_did_at_every_step(db):
    same_steps(db, "ngram:3", "ngram:3:earliest")


def test_the_shipped_head_accepts_in_vllm_what_it_accepts_in_ours_at_every_step(db):
    """Given the head with its layer ids in vLLM's convention (runner/vllm/head_ids.py), vLLM's steps follow ours; the
    acceptance per position is printed (pooled, the steps cut by max_new_tokens make it differ: vLLM drafts its k
    there, ours fewer)."""
    same_steps(db, f"eagle:{HEAD}", f"eagle:{HEAD}")
    rates = rows(db, """SELECT p.position, sum(p.accepted) FILTER (r.engine = 'vllm')
            / sum(p.reached) FILTER (r.engine = 'vllm'),
            sum(p.accepted) FILTER (r.engine = 'specdash') / sum(p.reached) FILTER (r.engine = 'specdash')
        FROM position_stats p JOIN runs r USING (run_id) WHERE p.draft = ? GROUP BY p.position ORDER BY 1""",
                 [f"eagle:{HEAD}"])
    assert [position for position, *_ in rates] == [1, 2, 3, 4]
    print("\nacceptance per position, vLLM / ours: " + ", ".join(
        f"{position}: {theirs:.3f} / {ours:.3f}" for position, theirs, ours in rates if theirs is not None))


def test_the_engines_page_sets_vllms_own_figures_beside_ours_from_the_same_steps(db):
    from dashboard.engine_queries import differences, positions, side_by_side

    with duckdb.connect(str(db), read_only=True) as con:
        frame, by_position = side_by_side(con), positions(con)
    theirs = frame[frame["engine"] == "vllm"]
    assert len(theirs) == 6  # three categories × (ngram, eagle) at k = 4
    # vLLM's mean acceptance length and acceptance rate, as it reported them, are ours over the same steps
    assert (theirs["own_mean_acceptance_length"] - theirs["tau_drafting_steps"]).abs().max() < 1e-12
    assert (theirs["own_acceptance_rate"] - theirs["accepted_over_drafted"]).abs().max() < 1e-12
    # over every round (the steps without a match included) τ can only be lower
    assert (theirs["tau"] <= theirs["own_mean_acceptance_length"] + 1e-12).all()
    assert set(differences(frame).columns) >= {"alpha vLLM", "alpha ours", "alpha Δ", "tau Δ", "speedup Δ"}
    assert sorted(by_position["position"].unique()) == [1, 2, 3, 4]


def test_speed_bench_s_report_of_the_vllm_sweep_is_vllm_s_own_account(db):
    """SPEED-Bench's prompt runs in both engines, and the report's τ and acceptance rate for it on vLLM are vLLM's own
    per-request figures pooled over its drafting steps (1 + accepted / steps, accepted / drafted tokens)."""
    (prompt_id,) = {p for p, in rows(db, "SELECT prompt_id FROM runs WHERE prompt_id LIKE 'qualitative-%'")}
    assert rows(db, "SELECT engine, count(*) FILTER (status = 'ok') FROM runs WHERE prompt_id = ? GROUP BY 1 "
                    "ORDER BY 1", [prompt_id]) == [("specdash", 3), ("vllm", 3)]
    (sweep_id,), = rows(db, "SELECT DISTINCT sweep_id FROM runs WHERE engine = 'vllm'")
    with duckdb.connect(str(db), read_only=True) as con:
        report = speed_bench.acceptance(con, (sweep_id,))
    for draft in ("ngram:3", f"eagle:{HEAD}"):
        (own,), = rows(db, "SELECT engine_report FROM runs WHERE engine = 'vllm' AND prompt_id = ? AND draft = ?",
                       [prompt_id, draft])
        own = json.loads(own)
        (row,) = report[(report["category"] == "coding") & report["method"].str.contains(draft, regex=False)
                        ].to_dict("records")
        assert row["engine"] == "vllm" and row["drafts"] == len(own["per_step_drafted"])
        assert row["tau"] == pytest.approx(1 + own["num_accepted_draft_tokens"] / len(own["per_step_drafted"]))
        assert row["acceptance_rate"] == pytest.approx(own["num_accepted_draft_tokens"] / own["num_draft_tokens"])
