"""Training data as users bring it: the formats told apart by their fields, bad records counted and skipped, the
target answering turn by turn with its own earlier answers in the context, and the answers cached in chunks."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import duckdb
import pytest
import torch
from typer.testing import CliRunner

from runner.cli import app
from runner.engine.weights import models
from runner.train import data
from runner.train.conversations import Conversation, DataError, read_all, read_data

MIXED = [
    {"id": "sg-1", "conversations": [{"from": "human", "value": "What is a prime?"},
                                     {"from": "gpt", "value": "A number with two divisors."},
                                     {"from": "human", "value": "Name three."}]},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."},
                  {"role": "assistant", "content": "Hi."}], "category": "greeting"},
    {"id": "p-1", "category": "code", "prompt": "Fix: def f(: pass"},
    {"id": 7, "category": "math", "turns": ["What is 2 + 2?", "And times 3?"]},
    {"conversations": [{"from": "gpt", "value": "Only the model spoke."}]},  # no user turn
    {"messages": [{"role": "user", "content": "   "}]},  # an empty one
    {"conversations": "not a list"},
    {"text": "a pretraining record"},
    [1, 2],
    {"id": "p-1", "prompt": "the same id again"},
    {"id": "x", "category": "all", "prompt": "a reserved category"},
]


def write(path: Path, records: list, extra_lines: tuple[str, ...] = ()) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + "".join(f"{line}\n" for line in extra_lines))
    return path


def test_every_format_is_told_apart_by_its_fields_and_bad_records_are_counted(tmp_path):
    read = read_data(write(tmp_path / "mixed.jsonl", MIXED, ("{not json", "")))
    assert read.conversations == [
        Conversation("sg-1", "chat", ("What is a prime?", "Name three.")),
        Conversation("mixed-2", "greeting", ("Say hi.",)),  # no id: the file's name and the record's line
        Conversation("p-1", "code", ("Fix: def f(: pass",)),
        Conversation("7", "math", ("What is 2 + 2?", "And times 3?")),
    ]
    assert read.skipped == Counter({"without a user turn": 2, "of no known format": 2, "not a JSON object": 1,
                                    "with a repeated id": 1, 'in category "all" (reserved)': 1, "not JSON": 1})
    assert read.summary("mixed.jsonl") == (
        'mixed.jsonl: 4 conversations (6 user turns); skipped 8: 1 in category "all" (reserved), 1 not JSON, '
        "1 not a JSON object, 2 of no known format, 1 with a repeated id, 2 without a user turn")


def test_a_json_array_is_read_as_one_record_per_item(tmp_path):
    path = tmp_path / "dump.json"
    path.write_text(json.dumps(MIXED[:2], indent=2))
    assert [c.id for c in read_data(path).conversations] == ["sg-1", "dump-2"]


def test_a_file_with_nothing_usable_is_refused_with_what_was_skipped(tmp_path):
    with pytest.raises(DataError, match=r"^bad.jsonl: 0 conversations \(0 user turns\); skipped 2: 1 not JSON, "
                                        r"1 without a user turn: nothing to train on$"):
        read_data(write(tmp_path / "bad.jsonl", [MIXED[4]], ("oops",)))


def test_several_files_are_read_one_after_another_and_an_id_an_earlier_file_gave_is_skipped(tmp_path):
    first = write(tmp_path / "a.jsonl", [MIXED[0], MIXED[2]])
    second = write(tmp_path / "b.jsonl", [MIXED[3], {"id": "sg-1", "category": "code", "prompt": "Again."}])
    read = read_all((first, second))
    assert [c.id for c in read.conversations] == ["sg-1", "p-1", "7"]
    assert read.skipped == Counter({"with a repeated id": 1})
    with pytest.raises(DataError, match=r"^bad.jsonl: .*nothing to train on$"):  # each file must hold some
        read_all((first, write(tmp_path / "bad.jsonl", [MIXED[4]])))


def test_train_draft_exits_2_on_a_file_with_no_usable_record(tmp_path, tiny_dir, monkeypatch):
    monkeypatch.setattr(models, "load", lambda *a, **k: pytest.fail("a model was loaded"))
    path = write(tmp_path / "bad.jsonl", MIXED[4:9])
    result = CliRunner().invoke(app, ["train-draft", "--target", str(tiny_dir), "--out", str(tmp_path / "head"),
                                      "--data", str(path), "--db", str(tmp_path / "runs.duckdb")])
    assert result.exit_code == 2 and result.stderr.strip().splitlines() == [
        "error: bad.jsonl: 0 conversations (0 user turns); skipped 5: 1 not a JSON object, 2 of no known format, "
        "2 without a user turn: nothing to train on"]
    assert not (tmp_path / "runs.duckdb").exists()


def test_later_turns_are_answered_after_the_targets_own_earlier_answers(tiny):
    """Each turn's context is the chat template over the user turns so far and the target's decoded answers to
    them; each answer is the target's greedy continuation of exactly that context."""
    conversations = [Conversation("a", "chat", ("Name a colour.", "And another?", "One more.")),
                     Conversation("b", "chat", ("Count to three.",))]
    samples = data.answer_conversations(tiny, conversations, (2, 4), max_new_tokens=6)
    assert [(s.prompt_id, s.turn) for s in samples] == [("a", 0), ("b", 0), ("a", 1), ("a", 2)]
    a = [s for s in samples if s.prompt_id == "a"]
    messages = []
    for turn, sample in enumerate(a):
        messages.append({"role": "user", "content": conversations[0].turns[turn]})
        assert sample.tokens[: sample.answer_start].tolist() == models.encode_messages(tiny, messages)
        with torch.inference_mode():
            logits = tiny.model(input_ids=sample.tokens[None]).logits[0]
        assert logits[sample.answer_start - 1 : -1].argmax(-1).tolist() == sample.tokens[sample.answer_start :].tolist()
        answer = tiny.tokenizer.decode(sample.tokens[sample.answer_start :], skip_special_tokens=True)
        messages.append({"role": "assistant", "content": answer})


def test_the_answers_are_cached_chunk_by_chunk_so_a_stopped_generation_resumes(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDASH_CACHE", str(tmp_path / "cache"))
    conversations = [Conversation(f"c{i}", "chat", (f"Tell me a fact about the number {i}.",)) for i in range(5)]
    made: list[int] = []
    real = data.answer_conversations

    def stopping(loaded: models.Loaded, batch: list, *args: object) -> list:
        made.append(len(batch))
        if len(made) == 2:
            raise KeyboardInterrupt  # killed while making the second chunk
        return real(loaded, batch, *args)

    monkeypatch.setattr(data, "answer_conversations", stopping)
    with pytest.raises(KeyboardInterrupt):
        data.corpus(tiny, conversations, (2, 4), 10**9, 5, 2, lambda n: None)
    assert len(list((tmp_path / "cache" / "distill").glob("*.safetensors"))) == 1
    made.clear()
    monkeypatch.setattr(data, "answer_conversations", lambda loaded, batch, *args: made.append(len(batch))
                        or real(loaded, batch, *args))
    resumed, cached = data.corpus(tiny, conversations, (2, 4), 10**9, 5, 2, lambda n: None)
    assert made == [2, 1] and not cached  # the first chunk read back, the other two made
    again, cached = data.corpus(tiny, conversations, (2, 4), 10**9, 5, 2, lambda n: None)
    assert cached and made == [2, 1]
    assert [(s.prompt_id, s.tokens.tolist()) for s in again] == [(s.prompt_id, s.tokens.tolist()) for s in resumed]
    assert sorted(s.prompt_id for s in resumed) == [f"c{i}" for i in range(5)]


def test_a_head_trains_on_two_sharegpt_files_and_is_scored_per_category(tmp_path, tiny_dir, monkeypatch):
    from rich.console import Console

    from runner.train.pipeline import train_draft
    from tests.train.test_train import tiny_config

    monkeypatch.setenv("SPECDASH_CACHE", str(tmp_path / "cache"))
    records = [{"id": f"{c}-{i}", "category": c, "conversations": [
        {"from": "human", "value": f"Tell me about {c} number {i}."}, {"from": "gpt", "value": "Someone else's."},
        {"from": "human", "value": "Say more."}]} for c in ("code", "poem") for i in range(10)]
    files = (write(tmp_path / "code.jsonl", records[:10]), write(tmp_path / "poem.jsonl", records[10:]))
    config = tiny_config(tmp_path, tiny_dir, data=files, epochs=1)
    trained = train_draft(config, Console(quiet=True))
    con = duckdb.connect(str(config.db), read_only=True)
    assert con.execute("SELECT train_prompts, heldout_prompts, prompts_file FROM trainings").fetchall() == [
        (18, 2, f"{files[0]}, {files[1]}")]
    rows = con.execute("SELECT epoch, category, position, judged, accepted FROM training_positions "
                       "ORDER BY ALL").fetchall()
    con.close()
    expected = [(e.number, c, j + 1, *counts[j]) for e in trained.epochs
                for c, counts in sorted({"all": e.positions, **e.categories}.items()) for j in range(2)]
    assert rows == expected and {c for _, c, *_ in rows} == {"all", "code", "poem"}
    # every user turn of every conversation answered, the second after the first (the cached chunks hold them)
    answered = [s for path in (tmp_path / "cache" / "distill").glob("*.safetensors") for s in data.load_corpus(path)]
    assert sorted((s.prompt_id, s.turn) for s in answered) == sorted((r["id"], t) for r in records for t in (0, 1))
