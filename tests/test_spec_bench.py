"""Spec-Bench: its question.jsonl read as-is, its leaderboard by its own definitions on hand-made runs, acceptance by
context length, and a two-turn sweep end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from rich.console import Console
from typer.testing import CliRunner

from runner.cli import app
from runner.engine import models
from runner.engine.pair import parse_draft
from runner.engine.sampling import Decoding
from runner.prompts import PromptError, load_prompts, select_prompts
from runner.records import Generation, Round, RunRecord
from runner.store import spec_bench
from runner.store.runs import write_run
from runner.sweep.plan import SweepConfig
from runner.sweep.run import run_sweep

SAMPLE = Path(__file__).parent / "data" / "spec_bench_sample.jsonl"


def write(tmp_path: Path, *objects: object) -> Path:
    path = tmp_path / "question.jsonl"
    path.write_text("".join(json.dumps(o) + "\n" for o in objects), encoding="utf-8")
    return path


def test_the_format_is_told_apart_by_its_fields_and_each_turn_is_a_prompt():
    prompts = load_prompts(SAMPLE)
    assert [p.id for p in prompts[:4]] == ["1-1", "1-2", "2-1", "2-2"]
    second = prompts[1]
    assert (second.category, second.turn, second.conversation, second.thread) == ("writing", 2, "1", "1")
    assert second.history == (prompts[0].text,)
    assert second.text.startswith("Now rewrite")
    assert [p.category for p in prompts if p.turn == 1] == [
        "writing", "math", "coding", "translation", "summarization", "qa", "math_reasoning", "rag"]
    assert len(prompts) == 11  # three two-turn questions, five of one turn


def test_a_selection_keeps_a_questions_turns_together():
    chosen = select_prompts(load_prompts(SAMPLE), ["math", "qa"], 1)
    assert [p.id for p in chosen] == ["2-1", "2-2", "31-1"]


@pytest.mark.parametrize("obj, message", [
    ({"question_id": "7", "category": "qa", "turns": ["x"]}, '"question_id" must be an integer'),
    ({"question_id": 7, "category": "qa", "turns": []}, '"turns" must be a non-empty list'),
    ({"question_id": 7, "category": "qa", "turns": ["x", 3]}, '"turns" must be a non-empty list'),
    ({"question_id": 7, "turns": ["x"]}, 'missing "category"'),
    ({"question_id": 7, "category": "qa", "turns": ["x"], "answer": "y"}, 'unknown key "answer"'),
])
def test_a_bad_question_is_one_line_naming_its_line(tmp_path, obj, message):
    path = write(tmp_path, {"question_id": 1, "category": "qa", "turns": ["fine"]}, obj)
    with pytest.raises(PromptError, match="question.jsonl line 2: " + message):
        load_prompts(path)


def test_a_repeated_question_id_is_refused(tmp_path):
    path = write(tmp_path, {"question_id": 1, "category": "qa", "turns": ["a"]},
                 {"question_id": 1, "category": "qa", "turns": ["b"]})
    with pytest.raises(PromptError, match='line 2: duplicate id "1-1"'):
        load_prompts(path)


def run(run_id: str, category: str, question: int, turn: int, emitted: list[int], seconds: float,
        draft: str = "ngram", k: int | None = 2, status: str = "ok", sweep: str = "s") -> RunRecord:
    """A run whose prefill made one token and whose rounds emitted `emitted`: new tokens 1 + Σemitted, target
    passes 1 + rounds. A plain run's rounds emit one token each."""
    drafted = k or 0
    rounds = tuple(Round(drafted, e - 1, int(e <= drafted), drafted - e + 1 - int(e <= drafted),
                         e == drafted + 1 and drafted > 0, e, 0.0, 0.01, (), ()) for e in emitted)
    tokens = 1 + sum(emitted)
    gen = Generation((1,) * 126, tuple(range(tokens)), rounds, 0.01, seconds, len(rounds), "max_new_tokens")
    plain = draft == "none"
    return RunRecord(
        run_id=run_id, sweep_id=sweep, started_at="2026-12-01T12:00:00+00:00", target="t", draft=draft,
        draft_kind="baseline" if plain else "ngram", category=category, prompt_id=f"{question}-{turn}",
        prompt_text="q", k=None if plain else k, mode="greedy", temperature=0.0, top_p=1.0, seed=0,
        max_new_tokens=64, device="cpu", dtype="float32", status=status, error=None if status == "ok" else "boom",
        generation=gen if status == "ok" else None, output_text="x",
        baseline_run_id=None if plain else f"b{question}-{turn}", lossless=None if plain else True,
        k_policy=None if plain else "fixed", turn=turn, conversation=str(question))


def plain(question: int, turn: int, category: str, tokens: int, seconds: float) -> RunRecord:
    return run(f"b{question}-{turn}", category, question, turn, [1] * (tokens - 1), seconds, draft="none", k=None)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("spec_bench") / "runs.duckdb"
    records = [
        # baselines: question 81 (writing) 20 tokens in 5 s = 4/s, 82 (math) 20 in 4 s = 5/s, 121 (translation)
        # 12 in 2 s = 6/s, 201 (summarization) 30 in 3 s = 10/s
        plain(81, 1, "writing", 10, 2.0), plain(81, 2, "writing", 10, 3.0),
        plain(82, 1, "math", 8, 1.0), plain(82, 2, "math", 12, 3.0),
        plain(121, 1, "translation", 12, 2.0), plain(201, 1, "summarization", 30, 3.0),
        # ngram k=2: 81: 20 tokens in 2.5 s = 8/s (4 + 5 passes); 82: 20 in 2 s = 10/s (4 + 5); 121: 12 in 1.5 s = 8/s
        # (6); 201: 30 in 1 s = 30/s (11)
        run("n81-1", "writing", 81, 1, [3, 3, 3], 1.0), run("n81-2", "writing", 81, 2, [2, 2, 2, 3], 1.5),
        run("n82-1", "math", 82, 1, [3, 2, 2], 0.5), run("n82-2", "math", 82, 2, [3, 3, 3, 2], 1.5),
        run("n121-1", "translation", 121, 1, [1, 2, 3, 3, 2], 1.5),
        run("n201-1", "summarization", 201, 1, [3] * 9 + [2], 1.0),
        # layerskip k=1 on question 201 only: 30 tokens in 2 s = 15/s, 16 passes; its failed run on 81 counts nowhere
        run("l201-1", "summarization", 201, 1, [2] * 14 + [1], 2.0, draft="layerskip:2", k=1),
        run("l81-1", "writing", 81, 1, [], 0.0, draft="layerskip:2", k=1, status="error"),
        # another sweep's run is not in this sweep's table
        run("x201-1", "summarization", 201, 1, [3] * 9 + [2], 0.1, sweep="other"),
    ]
    for record in records:
        write_run(path, record)
    return path


def test_the_leaderboard_equals_spec_benchs_definitions_by_hand(db):
    with duckdb.connect(str(db), read_only=True) as con:
        table = spec_bench.leaderboard(con, "s").set_index("method")
    ngram, layerskip, base = table.loc["ngram k=2"], table.loc["layerskip:2 k=1"], table.loc["plain decoding"]
    assert ngram["Multi-turn Conversation"] == pytest.approx(((8 + 10) / 2) / ((4 + 5) / 2))  # 2.0
    assert ngram["Translation"] == pytest.approx(8 / 6)
    assert ngram["Summarization"] == pytest.approx(30 / 10)
    assert math.isnan(ngram["Question Answering"]) and math.isnan(ngram["Retrieval-aug. Generation"])
    # Overall: the mean speed over the mean baseline speed, 14 / 6.25, not the geometric mean of the per-question
    # ratios 2, 2, 4/3 and 3 (which is exactly 2)
    assert ngram["Overall"] == pytest.approx(((8 + 10 + 8 + 30) / 4) / ((4 + 5 + 6 + 10) / 4))
    assert ngram["#Mean Accepted Tokens"] == pytest.approx((20 + 20 + 12 + 30) / (4 + 5 + 4 + 5 + 6 + 11))
    assert (ngram["questions"], ngram["turns"]) == (4, 6)
    # layerskip is set against the baselines of its own questions only
    assert layerskip["Summarization"] == pytest.approx(15 / 10)
    assert layerskip["Overall"] == pytest.approx(15 / 10)
    assert math.isnan(layerskip["Multi-turn Conversation"])
    assert layerskip["#Mean Accepted Tokens"] == pytest.approx(30 / 16)
    assert (base["Overall"], base["#Mean Accepted Tokens"]) == (1.0, 1.0)


def test_the_command_prints_the_table_as_markdown(db):
    result = CliRunner().invoke(app, ["report", "spec-bench", "--db", str(db), "--sweep", "s"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == ("| method | Multi-turn Conversation | Translation | Summarization | Question Answering | "
                        "Mathematical Reasoning | Retrieval-aug. Generation | #Mean Accepted Tokens | Overall |")
    assert lines[2] == "| plain decoding | 1.00x | 1.00x | 1.00x | 1.00x | 1.00x | 1.00x | 1.00 | 1.00x |"
    assert "| ngram k=2 | 2.00x | 1.33x | 3.00x | – | – | – | 2.34 | 2.24x |" in lines
    assert "| layerskip:2 k=1 | – | – | 1.50x | – | – | – | 1.88 | 1.50x |" in lines


@pytest.mark.parametrize("args, message", [
    (["--sweep", "nope"], 'no sweep "nope"'), (["--db", "/nonexistent.duckdb"], "no such file")])
def test_bad_input_to_the_command_is_one_line(db, args, message):
    result = CliRunner().invoke(app, ["report", "spec-bench", "--db", str(db), *args])
    assert result.exit_code == 2
    assert result.stderr.strip().startswith("error: ") and message in result.stderr


def test_acceptance_by_context_length_buckets_each_round_where_it_started(db):
    # n201-1: prompt 126 tokens; round i starts at 126 + 1 + 3i: round 0 at 127 (bucket 0..128), rounds 1-9 at
    # 130..154 (128..256). Each round of 3 accepted 2 of 2 drafts; the last (2) accepted 1 and rejected 1.
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT context_from, context_to, rounds, accepted, rejected, emitted, alpha, tau "
                           "FROM context_stats WHERE run_id = 'n201-1' ORDER BY context_from").fetchall()
        assert rows == [(0, 128, 1, 2, 0, 3, 1.0, 3.0), (128, 256, 9, 17, 1, 26, 17 / 18, 26 / 9)]
        assert con.execute("SELECT count(*) FROM context_stats WHERE draft = 'none'").fetchone() == (0,)
        curve = spec_bench.context_curve(con, "s").set_index(["draft", "category", "context_from"])
    assert curve.loc[("ngram", "summarization", 128), "alpha"] == pytest.approx(17 / 18)


def test_two_turns_are_swept_with_the_first_answer_in_the_second_prompt(tiny_dir, tmp_path, smollm2):
    prompts = select_prompts(load_prompts(SAMPLE), ["writing", "qa"], 1)
    cfg = SweepConfig(target=str(tiny_dir), drafts=(parse_draft("ngram"), parse_draft("layerskip:2")), ks=(2,),
                      decodings=(Decoding("greedy", 0.0, 1.0),), prompts=tuple(prompts), max_new_tokens=8, seed=0,
                      db=tmp_path / "runs.duckdb", device="cpu", dtype=None)
    sweep_id, recorder = run_sweep(cfg, Console(quiet=True))
    assert recorder.errors == [] and recorder.lossless_failures == []
    with duckdb.connect(str(cfg.db), read_only=True) as con:
        runs = con.execute("SELECT prompt_id, draft, turn, conversation, prompt_tokens, output_tokens, "
                           "baseline_run_id, (SELECT prompt_id FROM runs b WHERE b.run_id = r.baseline_run_id), "
                           "lossless FROM runs r ORDER BY prompt_id, draft").fetchall()
    assert [(r[0], r[1], r[2], r[3]) for r in runs] == [
        (p, d, t, c) for p, t, c in (("1-1", 1, "1"), ("1-2", 2, "1"), ("31-1", 1, "31"))
        for d in ("layerskip:2", "ngram", "none")]
    first, second = {r[1]: r for r in runs if r[0] == "1-1"}, {r[1]: r for r in runs if r[0] == "1-2"}
    answer = models.answer_text(smollm2, tuple(first["none"][5]))
    expected = models.encode_chat(smollm2, prompts[1].text, ((prompts[0].text, answer),))
    assert all(r[4] == expected for r in second.values())  # the target's turn-1 answer, through the chat template
    assert expected[:len(first["none"][4])] == first["none"][4]
    assert all(r[7] == r[0] and r[8] is True for r in runs if r[1] != "none")  # turn paired with turn, lossless


def test_the_dashboard_page_shows_the_table_and_the_context_chart(db, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("SPECDASH_DB", str(db))
    at = AppTest.from_file(str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py"), default_timeout=30)
    at.run()
    at.switch_page("spec_bench_page.py")
    at.query_params.update({"spec_sweep": "s"})
    at.run()
    assert not at.exception
    table = at.dataframe[0].value.set_index("method")
    assert table.loc["ngram k=2", "Overall"] == "2.24x"
    assert table.loc["layerskip:2 k=1", "Multi-turn Conversation"] == "–"
    assert "| ngram k=2 | 2.00x | 1.33x | 3.00x |" in at.code[0].value
    (dataset,) = at.get("vega_lite_chart")[0].proto.datasets
    data = pa.ipc.open_stream(dataset.data.data).read_pandas().set_index(["draft", "category", "bucket"])
    assert data.loc[("ngram", "summarization", "128–255"), "rounds"] == 9
    assert data.loc[("ngram", "summarization", "128–255"), "alpha"] == pytest.approx(17 / 18)


def test_generate_runs_a_later_turn_of_a_file_by_id(tiny_dir):
    base = ["generate", "--target", str(tiny_dir), "--draft", "ngram", "--k", "2", "--max-new-tokens", "4"]
    result = CliRunner().invoke(app, [*base, "--prompts", str(SAMPLE), "--prompt-id", "2-2"])
    assert result.exit_code == 0, result.output
    assert "identical to plain greedy" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["--prompts", str(SAMPLE), "--prompt-id", "2-3"], 'no prompt "2-3" in spec_bench_sample.jsonl'),
    (["--prompt", "hi", "--prompt-id", "2-1"], "give either --prompt or --prompt-id"),
    ([], "give either --prompt or --prompt-id"),
    (["--prompt", "hi", "--prompts", str(SAMPLE)], "--prompts goes with --prompt-id, not --prompt"),
])
def test_generate_refuses_an_ambiguous_or_unknown_prompt(tiny_dir, args, message):
    result = CliRunner().invoke(app, ["generate", "--target", str(tiny_dir), "--max-new-tokens", "4", *args])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: {message}"


def test_the_sql_example_is_the_docs_and_pools_by_bucket(db):
    from runner.store.sql import EXAMPLES, run_query

    example = EXAMPLES["acceptance by context length"]
    assert example in (Path(__file__).resolve().parents[1] / "docs" / "reference.md").read_text()
    frame = run_query(db, example).frame.set_index(["draft", "category", "context_from"])
    # summarization's bucket 128: ngram's run n201-1 only (the other sweep's x201-1 is the same rounds again)
    assert frame.loc[("ngram", "summarization", 128), "rounds"] == 18
    assert frame.loc[("ngram", "summarization", 128), "alpha"] == pytest.approx(34 / 36)
