"""SPEED-Bench's files as published, end to end: the fixture directory read as vLLM reads it (ids, categories, splits,
a count per category), its long prompts really ~1k / ~2k tokens, a sweep of the qualitative split and a throughput
split on the real SmolLM2 with prompt lookup (0 errors, 0 lossless failures) whose report equals the rounds, and a
prompt past the context refused in one line, by generate and sweep alike."""

from __future__ import annotations

import json

import duckdb
import pytest
from typer.testing import CliRunner

from runner.cli import app
from runner.engine.weights import models
from runner.prompts import PromptError, load_prompts, select_prompts
from runner.store import speed_bench
from tests.store import speed_bench_fixture

FIXTURE = speed_bench_fixture.DIRECTORY


def test_the_fixture_is_what_its_generator_writes():
    assert {p.name: p.read_text(encoding="utf-8") for p in FIXTURE.iterdir()} == speed_bench_fixture.files()


def test_a_directory_is_read_split_by_split_with_ids_of_split_and_line():
    prompts = load_prompts(FIXTURE)
    assert [p.id for p in prompts] == [*(f"qualitative-{n}" for n in range(1, 7)), "throughput_1k-1",
                                       "throughput_1k-2", "throughput_2k-1", "throughput_2k-2"]
    first = json.loads((FIXTURE / "throughput_2k.jsonl").read_text().splitlines()[1])
    assert (prompts[-1].category, prompts[-1].split, prompts[-1].text) == (
        "high_entropy", "throughput_2k", first["messages"][0]["content"])
    assert [p.category for p in prompts[:6]] == ["coding"] * 2 + ["summarization"] * 2 + ["writing"] * 2


def test_splits_and_a_count_per_category_choose_within_each_split():
    prompts = load_prompts(FIXTURE, ["throughput_2k", "throughput_1k"])
    assert [p.id for p in prompts] == ["throughput_1k-1", "throughput_1k-2", "throughput_2k-1", "throughput_2k-2"]
    # low_entropy is a category of both splits: one of each, not two of the first
    chosen = select_prompts(prompts, ["low_entropy"], 1)
    assert [p.id for p in chosen] == ["throughput_1k-1", "throughput_2k-1"]
    assert [p.id for p in select_prompts(load_prompts(FIXTURE / "qualitative.jsonl"), None, 1)] == [
        "qualitative-1", "qualitative-3", "qualitative-5"]


@pytest.mark.parametrize("path, splits, message", [
    (FIXTURE, ["throughput_4k"], 'no split "throughput_4k" in speed_bench; available: qualitative, '
                                 "throughput_1k, throughput_2k"),
    (FIXTURE / "qualitative.jsonl", ["qualitative"], "--splits chooses files of a SPEED-Bench directory"),
])
def test_a_split_not_there_is_refused(path, splits, message):
    with pytest.raises(PromptError, match=message):
        load_prompts(path, splits)


@pytest.mark.parametrize("line, message", [
    ({"category": "qa", "messages": []}, '"messages" must be a non-empty list of objects'),
    ({"category": "", "messages": [{"content": "x"}]}, '"category" must be a non-empty string'),
    ({"category": "qa", "messages": [{"role": "user"}]}, 'the first message has no "content" text'),
    ({"category": "qa", "turns": ["x"]}, "expected SPEED-Bench's object"),
])
def test_a_bad_line_is_one_line_naming_its_line(tmp_path, line, message):
    path = tmp_path / "qualitative.jsonl"
    path.write_text(json.dumps({"category": "qa", "messages": [{"content": "fine"}]}) + "\n" + json.dumps(line))
    with pytest.raises(PromptError, match=f"qualitative.jsonl line 2: {message}"):
        load_prompts(tmp_path)


def test_the_long_prompts_are_near_their_splits_length(smollm2):
    lengths = {p.id: len(models.encode_chat(smollm2, p.text)) for p in load_prompts(FIXTURE, ["throughput_1k",
                                                                                                "throughput_2k"])}
    assert all(900 <= n <= 1100 for i, n in lengths.items() if i.startswith("throughput_1k")), lengths
    assert all(1800 <= n <= 2100 for i, n in lengths.items() if i.startswith("throughput_2k")), lengths


def test_a_sweep_of_two_splits_on_smollm2_is_lossless_and_reported(tmp_path, smollm2):
    db = tmp_path / "runs.duckdb"
    result = CliRunner().invoke(app, [
        "sweep", "--prompts", str(FIXTURE), "--splits", "qualitative,throughput_1k", "--prompts-per-category", "1",
        "--categories", "coding,summarization,low_entropy", "--draft", "ngram", "--k", "3", "--max-new-tokens", "12",
        "--db", str(db)])
    assert result.exit_code == 0, result.output
    with duckdb.connect(str(db), read_only=True) as con:
        runs = con.execute("SELECT prompt_id, draft, status, lossless, len(prompt_tokens) FROM runs "
                           "ORDER BY prompt_id, draft").fetchall()
        (drafts, accepted), = con.execute("SELECT count(*), sum(o.accepted) FROM rounds o JOIN runs r USING (run_id) "
                                          "WHERE o.k > 0 AND r.prompt_id LIKE 'throughput%'").fetchall()
    assert [(r[0], r[1]) for r in runs] == [(p, d) for p in ("qualitative-1", "qualitative-3", "throughput_1k-1")
                                            for d in ("ngram", "none")]
    assert all(r[2] == "ok" for r in runs)  # 0 errors
    assert [r[3] for r in runs if r[1] == "ngram"] == [True, True, True]  # 0 lossless failures
    assert 900 <= runs[-1][4] <= 1100  # the ~1k prompt went in whole
    report = CliRunner().invoke(app, ["report", "speed-bench", "--db", str(db)])
    assert report.exit_code == 0, report.output
    with duckdb.connect(str(db), read_only=True) as con:
        (row,) = speed_bench.by_length(con, (speed_bench.sweeps(con)[0],)).itertuples()
    assert row.tau == pytest.approx(1 + accepted / drafts)
    assert f"| ngram k=3 | throughput_1k | {runs[-1][4]} | {row.tau:.2f} |" in report.stdout
    assert "| method | coding | summarization | all |" in report.stdout


def refusal(prompt_id: str, tokens: int, max_new_tokens: int, context: int) -> str:
    return (f'error: prompt "{prompt_id}" ({tokens:,} tokens) + max-new-tokens ({max_new_tokens}) exceeds the '
            f"model's context of {context} tokens")


def test_a_prompt_past_the_context_is_refused_alike_by_sweep_and_generate(tiny_dir, tmp_path, smollm2):
    # the tiny model reaches 512 positions: both ~1k prompts pass it
    ids = models.encode_chat(smollm2, load_prompts(FIXTURE)[6].text)
    db = tmp_path / "runs.duckdb"
    base = ["--target", str(tiny_dir), "--prompts", str(FIXTURE), "--draft", "ngram", "--max-new-tokens", "8"]
    swept = CliRunner().invoke(app, ["sweep", *base, "--splits", "throughput_1k", "--k", "2", "--db", str(db)])
    generated = CliRunner().invoke(app, ["generate", *base, "--prompt-id", "throughput_1k-1"])
    for result in (swept, generated):
        assert result.exit_code == 2
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(refusal("throughput_1k-1", len(ids), 8, 512))
        assert line.endswith("nothing is truncated: leave it out or lower --max-new-tokens")
    assert "(and 1 more prompt)" in swept.stderr
    if db.exists():  # the sweep may have made the file before loading the model: nothing was recorded in it
        with duckdb.connect(str(db), read_only=True) as con:
            assert con.execute("SELECT count(*) FROM runs").fetchone() == (0,)


@pytest.mark.parametrize("args, message", [
    (["--splits", "qualitative"], "--splits chooses files of a SPEED-Bench directory: give it as --prompts"),
    (["--prompts", str(FIXTURE), "--splits", "throughput_8k"], 'no split "throughput_8k" in speed_bench'),
    (["--prompts", str(FIXTURE), "--splits", " , "], "--splits is empty"),
    (["--prompts", str(FIXTURE), "--categories", "poem"], 'unknown category "poem"'),
])
def test_a_bad_choice_of_splits_is_one_line_before_any_model_loads(tmp_path, args, message):
    result = CliRunner().invoke(app, ["sweep", "--draft", "ngram", "--target", str(tmp_path / "absent"),
                                      "--db", str(tmp_path / "runs.duckdb"), *args])
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and message in line
