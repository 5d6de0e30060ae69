"""SPEED-Bench's report on hand-made runs: the acceptance matrix (τ, α, acceptance rate, per-position acceptance) and
the throughput splits by input length, each number computed by hand; per engine; the command's Markdown and its
refusals."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from runner.cli import app
from runner.records import Generation, Round, RunRecord
from runner.store import speed_bench
from runner.store.runs import write_run


def rounds(k: int, accepted: list[int]) -> tuple[Round, ...]:
    """Chain rounds of `k` drafts accepting `accepted` each: a rejection where fewer than k were accepted, the
    rest thrown; k 0 is a round whose drafter proposed nothing."""
    made = []
    for a in accepted:
        rejected = int(a < k)
        made.append(Round(k, a, rejected, k - a - rejected, k > 0 and a == k, a + 1, 0.0, 0.01, (), ()))
    return tuple(made)


def run(run_id: str, prompt_id: str, category: str, made: tuple[Round, ...], seconds: float, draft: str = "ngram",
        k: int | None = 3, prompt_tokens: int = 40, status: str = "ok", baseline: str | None = None) -> RunRecord:
    """A run whose prefill made one token: new tokens 1 + Σemitted."""
    tokens = 1 + sum(r.emitted for r in made)
    gen = Generation((1,) * prompt_tokens, tuple(range(tokens)), made, 0.01, seconds, len(made), "max_new_tokens")
    plain = draft == "none"
    return RunRecord(
        run_id=run_id, sweep_id="s", started_at="2026-12-06T12:00:00+00:00", target="t", draft=draft,
        draft_kind="baseline" if plain else "ngram", category=category, prompt_id=prompt_id, prompt_text="q",
        k=None if plain else k, mode="greedy", temperature=0.0, top_p=1.0, seed=0, max_new_tokens=64, device="cpu",
        dtype="float32", status=status, error=None if status == "ok" else "boom",
        generation=gen if status == "ok" else None, output_text="x",
        baseline_run_id=None if plain else (baseline or f"b-{prompt_id}"), lossless=None if plain else True,
        k_policy=None if plain else "fixed")


def plain(prompt_id: str, category: str, tokens: int, seconds: float, prompt_tokens: int = 40) -> RunRecord:
    return run(f"b-{prompt_id}", prompt_id, category, rounds(0, [0] * (tokens - 1)), seconds, draft="none", k=None,
               prompt_tokens=prompt_tokens)


RUNS = [
    # ngram k=3 on the qualitative split: coding accepts 3, 1, 0 (and a round with nothing to draft) then 2, 3;
    # summarization 3, 3, 2
    run("n-q1", "qualitative-1", "coding", rounds(3, [3, 1]) + rounds(0, [0]) + rounds(3, [0]), 1.0),
    run("n-q2", "qualitative-2", "coding", rounds(3, [2, 3]), 1.0),
    run("n-q3", "qualitative-3", "summarization", rounds(3, [3, 3, 2]), 1.0),
    # layerskip:2 k=2 on coding: 2, 0
    run("l-q1", "qualitative-1", "coding", rounds(2, [2, 0]), 1.0, draft="layerskip:2", k=2),
    # throughput_1k: 9 tokens in 1 s against 9 in 3 s, 7 in 1 s against 7 in 2 s; prompts of 1,000 and 1,200 tokens
    run("n-t1", "throughput_1k-1", "low_entropy", rounds(3, [3, 3]), 1.0, prompt_tokens=1000),
    run("n-t2", "throughput_1k-2", "high_entropy", rounds(3, [3, 1]), 1.0, prompt_tokens=1200),
    # throughput_2k: 1, 0, 2 accepted; 7 tokens in 2 s against 7 in 3 s; 2,000 tokens
    run("n-t3", "throughput_2k-1", "low_entropy", rounds(3, [1, 0, 2]), 2.0, prompt_tokens=2000),
    # not counted: a failed run, and a prompt of another format
    run("n-x", "qualitative-4", "coding", (), 1.0, status="error"),
    run("n-c", "code-01", "code", rounds(3, [3, 3, 3]), 1.0, baseline="b-qualitative-1"),
    plain("qualitative-1", "coding", 4, 1.0), plain("qualitative-2", "coding", 8, 1.0),
    plain("qualitative-3", "summarization", 12, 1.0),
    plain("throughput_1k-1", "low_entropy", 9, 3.0, 1000), plain("throughput_1k-2", "high_entropy", 7, 2.0, 1200),
    plain("throughput_2k-1", "low_entropy", 7, 3.0, 2000),
]


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("speed_bench") / "runs.duckdb"
    for record in RUNS:
        write_run(path, record)
    return path


def matrix(db: Path) -> object:
    with duckdb.connect(str(db), read_only=True) as con:
        return speed_bench.acceptance(con, ("s",)).set_index(["engine", "method", "category"])


def test_the_matrix_equals_a_hand_computation(db):
    table = matrix(db)
    # coding: drafts 3 + 2 = 5 (the round with nothing to draft is none), accepted 3+1+0+2+3 = 9 of 15 drafted,
    # rejected 3 (the rounds that accepted 1, 0 and 2)
    coding = table.loc[("specdash", "ngram k=3", "coding")]
    assert coding["drafts"] == 5
    assert coding["tau"] == pytest.approx(1 + 9 / 5)
    assert coding["acceptance_rate"] == pytest.approx(9 / 15)
    assert coding["alpha"] == pytest.approx(9 / 12)
    assert [coding["p1"], coding["p2"], coding["p3"]] == pytest.approx([4 / 5, 3 / 5, 2 / 5])
    summary = table.loc[("specdash", "ngram k=3", "summarization")]
    assert (summary["tau"], summary["alpha"], summary["acceptance_rate"]) == pytest.approx((1 + 8 / 3, 8 / 9, 8 / 9))
    assert [summary["p1"], summary["p2"], summary["p3"]] == pytest.approx([1, 1, 2 / 3])
    pooled = table.loc[("specdash", "ngram k=3", "all")]
    assert (pooled["drafts"], pooled["tau"], pooled["alpha"]) == (8, pytest.approx(1 + 17 / 8), pytest.approx(17 / 21))
    assert [pooled["p1"], pooled["p2"], pooled["p3"]] == pytest.approx([7 / 8, 6 / 8, 4 / 8])
    layerskip = table.loc[("specdash", "layerskip:2 k=2", "coding")]
    assert (layerskip["tau"], layerskip["alpha"], layerskip["acceptance_rate"]) == pytest.approx((2, 2 / 3, 0.5))
    assert [layerskip["p1"], layerskip["p2"]] == pytest.approx([0.5, 0.5]) and math.isnan(layerskip["p3"])  # past its k
    # τ is 1 + the sum of the per-position rates, as vLLM's metrics have it
    assert pooled["tau"] == pytest.approx(1 + pooled["p1"] + pooled["p2"] + pooled["p3"])
    assert set(table.index.get_level_values("category")) == {"coding", "summarization", "all"}


def test_the_throughput_splits_by_input_length_equal_a_hand_computation(db):
    with duckdb.connect(str(db), read_only=True) as con:
        table = speed_bench.by_length(con, ("s",))
    assert list(table["split"]) == ["throughput_1k", "throughput_2k"]
    one, two = table.iloc[0], table.iloc[1]
    assert (one["bucket"], one["prompt_tokens"], one["drafts"]) == ("1k", 1100, 4)
    assert (one["tau"], one["alpha"], one["acceptance_rate"]) == pytest.approx((1 + 10 / 4, 10 / 11, 10 / 12))
    assert one["speedup"] == pytest.approx((16 / 2.0) / (16 / 5.0))  # pooled tokens per second, 8 / 3.2
    assert (two["prompt_tokens"], two["tau"], two["alpha"]) == (2000, pytest.approx(2.0), pytest.approx(0.5))
    assert two["speedup"] == pytest.approx((7 / 2.0) / (7 / 3.0))


def test_runs_of_another_engine_are_grouped_apart(db, tmp_path):
    copy = tmp_path / "engines.duckdb"
    shutil.copy(db, copy)
    with duckdb.connect(str(copy)) as con:
        con.execute("ALTER TABLE runs ADD COLUMN IF NOT EXISTS engine TEXT DEFAULT 'specdash'")
        con.execute("UPDATE runs SET engine = CASE WHEN run_id = 'n-q3' THEN 'vllm' ELSE 'specdash' END")
    table = matrix(copy)
    assert table.loc[("vllm", "ngram k=3", "summarization"), "tau"] == pytest.approx(1 + 8 / 3)
    assert table.loc[("specdash", "ngram k=3", "all"), "tau"] == pytest.approx(1 + 9 / 5)
    assert ("specdash", "ngram k=3", "summarization") not in table.index


def copied_as_vllm(con: duckdb.DuckDBPyConnection, sweep: str, hour: str) -> None:
    """Sweep s's runs, rounds and totals again as vLLM's sweep `sweep`, started at `hour`."""
    con.execute(f"""INSERT INTO runs SELECT * REPLACE ('{sweep}-' || run_id AS run_id, '{sweep}' AS sweep_id,
        'vllm' AS engine, TIMESTAMPTZ '2026-12-06 {hour}:00+00' AS started_at,
        CASE WHEN baseline_run_id IS NULL THEN NULL ELSE '{sweep}-' || baseline_run_id END AS baseline_run_id)
        FROM runs WHERE sweep_id = 's'""")
    for table in ("rounds", "run_totals"):
        con.execute(f"INSERT INTO {table} SELECT * REPLACE ('{sweep}-' || run_id AS run_id) FROM {table} "
                    "WHERE run_id IN (SELECT run_id FROM runs WHERE sweep_id = 's')")


def test_each_other_engine_s_newest_sweep_is_reported_beside_the_sweep(db, tmp_path):
    copy = tmp_path / "two-sweeps.duckdb"
    shutil.copy(db, copy)
    with duckdb.connect(str(copy)) as con:  # the same runs again as vLLM's sweep v2, and an older vLLM sweep v1
        copied_as_vllm(con, "v1", "11:00")
        copied_as_vllm(con, "v2", "13:00")
        con.execute("DELETE FROM rounds WHERE run_id = 'v2-n-q3'")  # so that v2's numbers are told from s's
        con.execute("DELETE FROM runs WHERE run_id = 'v2-n-q3'")
        assert speed_bench.beside_other_engines(con, "s") == ("s", "v2")
        assert speed_bench.beside_other_engines(con, "v1") == ("v1", "s")  # an older vLLM sweep, beside ours
        assert speed_bench.beside_other_engines(con) == ("v2", "s")  # the newest, then ours
        table = speed_bench.acceptance(con, ("s", "v2")).set_index(["engine", "method", "category"])
    assert table.loc[("specdash", "ngram k=3", "all"), "tau"] == pytest.approx(1 + 17 / 8)
    assert table.loc[("vllm", "ngram k=3", "all"), "tau"] == pytest.approx(1 + 9 / 5)  # coding alone
    result = CliRunner().invoke(app, ["report", "speed-bench", "--db", str(copy), "--sweep", "s"])
    assert result.exit_code == 0, result.output
    assert "## specdash: τ by category" in result.stdout and "## vllm: τ by category" in result.stdout
    assert result.stderr.strip() == "sweeps s, v2"


def test_the_command_prints_the_report_as_markdown(db):
    result = CliRunner().invoke(app, ["report", "speed-bench", "--db", str(db)])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "## specdash: τ by category (qualitative)\n\n| method | coding | summarization | all |" in out
    assert "| ngram k=3 | 2.80 | 3.67 | 3.12 |" in out
    assert "| layerskip:2 k=2 | 2.00 | – | 2.00 |" in out
    assert "| ngram k=3 | coding | 0.80 | 0.60 | 0.40 |" in out
    assert "| ngram k=3 | throughput_1k | 1100 | 3.50 | 0.91 | 0.83 | 2.50x |" in out
    assert "| ngram k=3 | throughput_2k | 2000 | 2.00 | 0.50 | 0.33 | 1.50x |" in out


def test_a_file_without_speed_bench_runs_says_what_it_needs(tmp_path):
    path = tmp_path / "other.duckdb"
    write_run(path, run("n-c", "code-01", "code", rounds(3, [3]), 1.0))
    result = CliRunner().invoke(app, ["report", "speed-bench", "--db", str(path)])
    assert result.exit_code == 2
    assert result.stderr.strip().startswith("error: no sweep in the file ran SPEED-Bench prompts")
    assert "--prompts <SPEED-Bench directory>" in result.stderr
    named = CliRunner().invoke(app, ["report", "speed-bench", "--db", str(path), "--sweep", "s"])
    assert named.exit_code == 2 and "sweep s has no speculative run of a SPEED-Bench prompt" in named.stderr


def test_spec_benchs_report_says_why_its_columns_are_empty(tmp_path):
    path = tmp_path / "builtin.duckdb"
    write_run(path, plain("code-01", "code", 4, 2.0))
    write_run(path, run("n-c", "code-01", "code", rounds(3, [3]), 1.0))
    result = CliRunner().invoke(app, ["report", "spec-bench", "--db", str(path)])
    assert result.exit_code == 0, result.output
    assert "| ngram k=3 | – | – | – | – | – | – | 2.50 | 2.50x |" in result.stdout  # 5 tokens / 2 passes; 2.5 / 2
    assert "None of this sweep's categories (code) is one of Spec-Bench's" in result.stderr
    assert "`runner sweep --prompts question.jsonl`" in result.stderr
