"""`sweep --repeats N`: every cell recorded N times, the baseline again before each repetition of a prompt's cells, so
each speculative run is timed against the plain run made just before it."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
from rich.console import Console

from runner.engine.drafters.registry import parse_draft
from runner.engine.round.decoding_rule import Decoding
from runner.prompts import Prompt, load_prompts
from runner.sweep.loop import run_sweep
from runner.sweep.plan import SweepConfig, plan

GREEDY = Decoding("greedy", 0.0, 1.0)


def _config(prompts: tuple[Prompt, ...], db: Path, target: str = "t", repeats: int = 2) -> SweepConfig:
    return SweepConfig(target=target, drafts=(parse_draft("ngram:2"),), ks=(2, 3), decodings=(GREEDY,),
                       prompts=prompts, max_new_tokens=8, seed=0, db=db, device=None, dtype=None, kernels="stock",
                       repeats=repeats)


def test_each_repetition_records_the_baseline_then_the_prompts_cells(tmp_path):
    prompts = (Prompt("c1", "code", "x"), Prompt("s1", "summary", "y"))
    order = [(c.prompt.id, c.repeat, c.k) for c in plan(_config(prompts, tmp_path / "r.duckdb"))]
    assert order == [("c1", 0, None), ("c1", 0, 2), ("c1", 0, 3), ("c1", 1, None), ("c1", 1, 2), ("c1", 1, 3),
                     ("s1", 0, None), ("s1", 0, 2), ("s1", 0, 3), ("s1", 1, None), ("s1", 1, 2), ("s1", 1, 3)]
    cells = list(plan(_config(prompts, tmp_path / "r.duckdb")))
    assert len({c.key(0) for c in cells}) == len(cells)  # the repeat tells the cells apart
    assert _config(prompts, tmp_path / "r.duckdb").plan_id() != _config(prompts, tmp_path / "r.duckdb",
                                                                         repeats=1).plan_id()


def test_a_repeated_sweep_links_each_run_to_the_baseline_of_its_own_repetition(tiny_dir: Path, tmp_path):
    (tmp_path / "p.jsonl").write_text(json.dumps({"id": "c1", "category": "code", "prompt": "def f(x): return x"})
                                      + "\n")
    config = _config(tuple(load_prompts(tmp_path / "p.jsonl")), tmp_path / "runs.duckdb", str(tiny_dir), 3)
    _, recorder = run_sweep(config, Console(quiet=True))
    assert recorder.errors == [] and recorder.lossless_failures == []
    with duckdb.connect(str(config.db), read_only=True) as con:
        linked = con.execute("""
            SELECT r.repeat, b.repeat, b.started_at <= r.started_at FROM runs r JOIN runs b
                ON b.run_id = r.baseline_run_id ORDER BY r.started_at""").fetchall()
        counts = con.execute("SELECT draft, repeat, count(*) FROM runs GROUP BY ALL ORDER BY ALL").fetchall()
    assert linked == [(r, r, True) for r in (0, 0, 1, 1, 2, 2)]
    assert counts == [("ngram:2", r, 2) for r in range(3)] + [("none", r, 1) for r in range(3)]
