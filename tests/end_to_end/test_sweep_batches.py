"""`sweep --batch`: a category's prompts decoded B at a time, each run against plain decoding of its own batch, the
batch's runs linked, and `batch_stats` computed from them."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import duckdb
import pytest
from rich.console import Console

from runner.cells import checked
from runner.engine.drafters.registry import parse_draft
from runner.engine.round.decoding_rule import Decoding
from runner.prompts import Prompt, load_prompts
from runner.records import Divergence
from runner.sweep.loop import run_sweep
from runner.sweep.plan import SweepConfig, batches_of, plan
from tests.helpers.dashboard_fixtures import baseline_record

PROMPTS = [
    {"id": "c1", "category": "code", "prompt": "def add(a, b): return a + b. Add type hints to add(a, b)."},
    {"id": "c2", "category": "code", "prompt": "Write a function that reverses a list."},
    {"id": "c3", "category": "code", "prompt": "Write a loop that prints 1 to 10."},
    {"id": "s1", "category": "summary", "prompt": "Summarize: the bridge closes for six weeks; a ferry runs."},
]


def rows(db: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql).fetchall()


def test_batches_take_a_categorys_prompts_in_order_and_reuse_the_first_to_fill_the_last():
    p = [Prompt(f"c{i}", "code", "x") for i in range(1, 4)] + [Prompt("s1", "summary", "y")]
    ids = [[q.id for q in b] for b in batches_of(tuple(p), 2)]
    assert ids == [["c1", "c2"], ["s1", "s1"], ["c3", "c1"]]  # every category's first batch, then the second
    assert [[q.id for q in b] for b in batches_of(tuple(p), 4)] == [["c1", "c2", "c3", "c1"], ["s1"] * 4]


@pytest.fixture(scope="module")
def swept(tiny_dir: Path, tmp_path_factory) -> SweepConfig:
    tmp = tmp_path_factory.mktemp("batches")
    (tmp / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    config = SweepConfig(
        target=str(tiny_dir), drafts=(parse_draft("ngram:2"),), ks=(2,), decodings=(Decoding("greedy", 0.0, 1.0),),
        prompts=tuple(load_prompts(tmp / "prompts.jsonl")), max_new_tokens=12, seed=0, db=tmp / "runs.duckdb",
        device=None, dtype=None, kernels="stock", batches=(1, 2))
    sweep_id, recorder = run_sweep(config, Console(quiet=True))
    assert recorder.errors == [] and recorder.lossless_failures == []
    return replace(config, sweep_id=sweep_id)


def test_a_batched_sweep_records_every_slot_against_its_own_batchs_plain_run(swept):
    # batch 1: 4 prompts × (plain, ngram); batch 2: 3 batches × 2 slots × (plain, ngram)
    assert rows(swept.db, "SELECT batch_size, count(*) FROM runs GROUP BY ALL ORDER BY ALL") == [(1, 8), (2, 12)]
    linked = rows(swept.db, """
        SELECT r.prompt_id, r.batch_slot, b.prompt_id, b.batch_slot, b.batch_size, r.lossless
        FROM runs r JOIN runs b ON b.run_id = r.baseline_run_id WHERE r.batch_size = 2 ORDER BY ALL""")
    assert linked == [("c1", 0, "c1", 0, 2, True), ("c1", 1, "c1", 1, 2, True), ("c2", 1, "c2", 1, 2, True),
                      ("c3", 0, "c3", 0, 2, True), ("s1", 0, "s1", 0, 2, True), ("s1", 1, "s1", 1, 2, True)]
    # the runs of one batch share its id, and each batch's slots hold its prompts
    batches = rows(swept.db, """SELECT draft, list(prompt_id ORDER BY batch_slot) FROM runs WHERE batch_size = 2
                               GROUP BY draft, batch_id ORDER BY ALL""")
    assert batches == [("ngram:2", ["c1", "c2"]), ("ngram:2", ["c3", "c1"]), ("ngram:2", ["s1", "s1"]),
                       ("none", ["c1", "c2"]), ("none", ["c3", "c1"]), ("none", ["s1", "s1"])]
    assert rows(swept.db, "SELECT count(*) FROM runs WHERE batch_size = 1 AND batch_id IS NOT NULL") == [(0,)]
    # plain decoding at batch 2 is checked against the prompt's plain decoding alone, and stays unlinked
    plain = rows(swept.db, """SELECT prompt_id, batch_slot, lossless, baseline_run_id FROM runs
                             WHERE draft = 'none' ORDER BY batch_size, prompt_id, batch_slot""")
    assert plain == [("c1", 0, None, None), ("c2", 0, None, None), ("c3", 0, None, None), ("s1", 0, None, None),
                     ("c1", 0, True, None), ("c1", 1, True, None), ("c2", 1, True, None), ("c3", 0, True, None),
                     ("s1", 0, True, None), ("s1", 1, True, None)]
    # greedy and the same ids: a slot's text is the prompt's text alone
    assert rows(swept.db, """SELECT count(DISTINCT output_tokens) FROM runs WHERE prompt_id = 'c1'""") == [(1,)]


def test_batch_stats_pools_each_batch_by_its_slowest_member(swept):
    expected = rows(swept.db, """
        WITH b AS (SELECT batch_id, sum(new_tokens) / max(wall_s) AS rate FROM runs
                   WHERE draft = 'ngram:2' AND category = 'code' AND batch_size = 2 GROUP BY batch_id)
        SELECT avg(rate) FROM b""")[0][0]
    speedup = rows(swept.db, """SELECT avg(s.measured_speedup) FROM run_stats s JOIN runs r USING (run_id)
                               WHERE r.draft = 'ngram:2' AND r.category = 'code' AND r.batch_size = 2""")[0][0]
    got = rows(swept.db, """SELECT batches, runs, tokens_per_s_per_batch, measured_speedup FROM batch_stats
                           WHERE draft = 'ngram:2' AND category = 'code' AND batch_size = 2""")
    assert got == [(2, 4, pytest.approx(expected), pytest.approx(speedup))]


def test_a_resumed_batched_sweep_has_nothing_left_and_its_plan_covers_each_slot(swept):
    cells = list(plan(swept))
    assert len(cells) == 20 and len({c.key(swept.seed) for c in cells}) == 20
    _, recorder = run_sweep(swept, Console(quiet=True))
    assert rows(swept.db, "SELECT count(*) FROM runs") == [(20,)]


def test_plain_decoding_at_b_that_differs_from_it_alone_is_a_lossless_failure():
    record = baseline_record("code-01")
    alone = record.generation.output_tokens
    tie = Divergence(at=3, gap=0.5, tolerance=1.0, kind="tie")
    seen = []

    def classify(prompt, expected, ours):
        seen.append((prompt, expected, ours))
        return tie

    assert checked(record, alone, classify).lossless is True and seen == []
    other = (*alone[:3], alone[3] + 1, *alone[4:])
    failed = checked(record, other, classify)
    assert seen == [(record.generation.prompt_tokens, other, alone)]
    assert (failed.lossless, failed.divergence_at, failed.divergence, failed.baseline_run_id) == (False, 3, "tie", None)
    sampled = replace(record, mode="sample")
    assert checked(sampled, other, classify) == sampled  # sampling is not judged token for token
