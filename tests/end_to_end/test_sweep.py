"""A real sweep into a real DuckDB file: what it records, its invariants, resume and failing cells."""

from __future__ import annotations

import json
import re
from pathlib import Path

import duckdb
import pytest
import torch
from rich.console import Console

from runner.engine import pair
from runner.engine.drafters.registry import parse_draft
from runner.engine.round.decoding_rule import Decoding
from runner.pair_engine import provenance
from runner.prompts import load_prompts
from runner.store.runs import sweep_summary
from runner.sweep.loop import run_sweep
from runner.sweep.plan import SweepConfig

PROMPTS = [
    {"id": "c1", "category": "code", "prompt": "def add(a, b): return a + b. Add type hints to add(a, b)."},
    {"id": "c2", "category": "code", "prompt": "Write a function that reverses a list."},
    {"id": "s1", "category": "summary", "prompt": "Summarize: the bridge closes for six weeks; a ferry runs."},
]
DECODINGS = (Decoding("greedy", 0.0, 1.0), Decoding("sample", 0.7, 0.9))


def config(tiny_dir: Path, tmp_path: Path, sweep_id: str | None = None) -> SweepConfig:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return SweepConfig(
        target=str(tiny_dir), drafts=(parse_draft("ngram"), parse_draft("layerskip:2")), ks=(1, 3), decodings=DECODINGS,
        prompts=tuple(load_prompts(prompts)), max_new_tokens=10, seed=7, db=tmp_path / "runs.duckdb",
        device=None, dtype=None, sweep_id=sweep_id,
    )


def rows(db: Path, sql: str, params: list | None = None) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql, params or []).fetchall()


@pytest.fixture(scope="module")
def swept(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[SweepConfig, str]:
    cfg = config(tiny_dir, tmp_path_factory.mktemp("sweep"))
    sweep_id, recorder = run_sweep(cfg, Console(quiet=True))
    assert recorder.errors == [] and recorder.lossless_failures == []
    return cfg, sweep_id


def test_a_sweep_records_a_baseline_and_every_draft_and_k_per_prompt_and_mode(swept):
    cfg, sweep_id = swept
    # 3 prompts × 2 modes × (1 baseline + 2 drafts × 2 k)
    assert rows(cfg.db, "SELECT count(*) FROM runs WHERE sweep_id = ? AND status = 'ok'", [sweep_id]) == [(30,)]
    assert rows(cfg.db, "SELECT draft, k, count(*) FROM runs GROUP BY ALL ORDER BY ALL") == [
        ("layerskip:2", 1, 6), ("layerskip:2", 3, 6), ("ngram", 1, 6), ("ngram", 3, 6), ("none", None, 6),
    ]
    # every speculative run points at the baseline of its prompt and mode
    assert rows(cfg.db, """SELECT count(*) FROM runs r JOIN runs b ON b.run_id = r.baseline_run_id
        WHERE r.draft <> 'none' AND b.draft = 'none' AND b.prompt_id = r.prompt_id AND b.mode = r.mode""") == [(24,)]


def test_every_greedy_run_is_lossless_and_sampled_runs_are_not_judged(swept):
    cfg, _ = swept
    assert rows(cfg.db, "SELECT mode, lossless, count(*) FROM runs WHERE draft <> 'none' GROUP BY ALL ORDER BY ALL") \
        == [("greedy", True, 12), ("sample", None, 12)]


def test_recorded_rounds_keep_the_explainers_invariants(swept):
    cfg, _ = swept
    assert rows(cfg.db, "SELECT count(*) FROM rounds WHERE accepted + rejected + thrown <> k") == [(0,)]
    assert rows(cfg.db, "SELECT count(*) FROM rounds WHERE rejected NOT IN (0, 1) OR bonus <> (accepted = k)") == [(0,)]
    # emitted = accepted + 1, except in a run's last round, which max_new_tokens or EOS may cut
    assert rows(cfg.db, """SELECT count(*) FROM rounds r JOIN runs USING (run_id)
        WHERE r.emitted <> r.accepted + 1 AND r.round < runs.n_rounds - 1""") == [(0,)]
    assert rows(cfg.db, """SELECT count(*) FROM runs r WHERE status = 'ok' AND (new_tokens <> len(output_tokens)
        OR new_tokens <> 1 + (SELECT coalesce(sum(emitted), 0) FROM rounds WHERE run_id = r.run_id)  -- 1: the prefill's
        OR n_rounds <> (SELECT count(*) FROM rounds WHERE run_id = r.run_id))""") == [(0,)]
    assert rows(cfg.db, "SELECT DISTINCT rounds.k FROM rounds JOIN runs USING (run_id) WHERE draft = 'none'") == [(0,)]
    # run_totals holds each run's rounds summed, written in the same transaction
    assert rows(cfg.db, """SELECT count(*) FROM run_totals t FULL JOIN (SELECT run_id, sum(accepted) AS a,
            sum(rejected) AS r, sum(thrown) AS th, sum(k) AS d, sum(emitted) AS e FROM rounds GROUP BY run_id) x
        USING (run_id) WHERE (t.accepted, t.rejected, t.thrown, t.drafted, t.emitted) IS DISTINCT FROM
            (x.a, x.r, x.th, x.d, x.e)""") == [(0,)]


def test_alpha_from_the_rows_equals_the_summary(swept):
    cfg, sweep_id = swept
    summary = sweep_summary(cfg.db, sweep_id)
    by_rows = dict(((c, d, k, m), a) for c, d, k, m, a in rows(cfg.db, """
        SELECT category, draft, runs.k, mode, sum(accepted) / (sum(accepted) + sum(rejected))
        FROM rounds JOIN runs USING (run_id) WHERE draft <> 'none' GROUP BY ALL"""))
    assert len(summary) == len(by_rows) == 2 * 2 * 2 * 2
    for row in summary.itertuples():
        assert row.alpha == pytest.approx(by_rows[(row.category, row.draft, row.k, row.mode)], abs=5e-4, nan_ok=True)
    # α is undefined exactly where nothing was drafted: prompt lookup finding no match in a random model's text
    drafted = dict(((c, d, k, m), n) for c, d, k, m, n in rows(cfg.db, """
        SELECT category, draft, runs.k, mode, sum(rounds.k) FROM rounds JOIN runs USING (run_id)
        WHERE draft <> 'none' GROUP BY ALL"""))
    undefined = {(r.category, r.draft, r.k, r.mode) for r in summary.itertuples() if r.alpha != r.alpha}
    assert undefined == {cell for cell, n in drafted.items() if n == 0}
    assert all(n > 0 for (_, d, _, _), n in drafted.items() if d == "layerskip:2")


def test_provenance_is_filled(swept):
    cfg, _ = swept
    (torch_v, transformers_v, python_v, host, commit, device, dtype), = rows(cfg.db, """SELECT DISTINCT
        torch_version, transformers_version, python_version, host, git_commit, device, dtype FROM runs""")
    assert torch_v.startswith("2.") and transformers_v.startswith("5.") and python_v.startswith("3.")
    assert host and len(commit) in (0, 40) and device == "cpu" and dtype == "float32"


def test_resume_records_exactly_the_missing_cells(swept, tmp_path):
    cfg, sweep_id = swept
    db = tmp_path / "runs.duckdb"
    db.write_bytes(cfg.db.read_bytes())
    before = set(rows(db, "SELECT run_id FROM runs"))
    with duckdb.connect(str(db)) as con:  # as if the sweep died before these cells
        missing = con.execute("""SELECT prompt_id, draft, k, mode FROM runs
            WHERE (prompt_id = 'c2' AND draft = 'ngram') OR (prompt_id = 's1' AND draft = 'none' AND mode = 'sample')
            ORDER BY ALL""").fetchall()
        gone = {r for (r,) in con.execute("""SELECT run_id FROM runs
            WHERE (prompt_id = 'c2' AND draft = 'ngram') OR (prompt_id = 's1' AND draft = 'none' AND mode = 'sample')
            """).fetchall()}
        con.execute("DELETE FROM rounds WHERE run_id IN (SELECT unnest(?))", [list(gone)])
        con.execute("DELETE FROM runs WHERE run_id IN (SELECT unnest(?))", [list(gone)])
    resumed = SweepConfig(**{**cfg.__dict__, "db": db, "sweep_id": sweep_id})
    run_sweep(resumed, Console(quiet=True))
    after = rows(db, "SELECT run_id, prompt_id, draft, k, mode FROM runs")
    assert len(after) == 30
    new = sorted((p, d, k, m) for r, p, d, k, m in after if (r,) not in before)
    assert new == missing  # exactly the deleted cells, nothing else re-run
    assert {(r,) for r, *_ in after} >= before - {(g,) for g in gone}


def test_a_failing_cell_is_recorded_as_an_error_and_the_sweep_goes_on(tiny_dir, tmp_path, monkeypatch):
    real_run = pair.Pair.run

    def flaky(self, spec, prompt, k, decoding, max_new_tokens, seed, *policy):
        if spec.text == "layerskip:2" and k == 3 and max_new_tokens == 10:  # the cells, not the warm-up
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")
        return real_run(self, spec, prompt, k, decoding, max_new_tokens, seed, *policy)

    monkeypatch.setattr(pair.Pair, "run", flaky)
    cfg = config(tiny_dir, tmp_path)
    _, recorder = run_sweep(cfg, Console(quiet=True))
    assert len(recorder.errors) == 6
    assert rows(cfg.db, "SELECT status, count(*) FROM runs GROUP BY ALL ORDER BY ALL") == [("error", 6), ("ok", 24)]
    assert rows(cfg.db, "SELECT DISTINCT error, new_tokens FROM runs WHERE status = 'error'") == [
        ("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", None)
    ]
    assert rows(cfg.db, "SELECT count(*) FROM rounds JOIN runs USING (run_id) WHERE status = 'error'") == [(0,)]


def test_a_cpu_run_records_the_cpus_model_name():
    # platform.processor() is empty on Linux: runs from two CPUs could not be told apart
    names = re.findall(r"^model name\s*:\s*(.+?)\s*$", Path("/proc/cpuinfo").read_text(), re.MULTILINE)
    assert names and provenance(torch.device("cpu"))["device_name"] == names[0]
