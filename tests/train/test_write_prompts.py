"""`runner write-prompts`: each kind of task made into its prompt, repeats refused exactly and nearly, nothing near an
evaluation prompt kept, and a rerun adding to the file; the target's part scripted, then run for real."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from runner.prompts import load_prompts
from runner.train import seeds, write_prompts
from runner.train.conversations import read_data
from runner.train.write_prompts import Request, Seen, prompt_from


def test_each_kind_of_task_becomes_its_prompt():
    rng = random.Random(0)
    code = "def total(xs):\n    return sum(xs) + 0"
    made = {kind: prompt_from(Request(kind, "bees"), text, rng) for kind, text in [
        ("question", 'Question: "Why do bees dance?"\nMore text.'),
        ("multi-turn", "How do bees make honey?"),
        ("instruction", "Write a list of five flowers bees like."),
        ("summary", "Bees live in hives. They make honey. They dance to share where flowers are. Queens lay eggs."),
        ("code", f"```python\n{code}\n```"),
        ("translation", "Bees are small. They fly from flower to flower."),
        ("math", "A hive has 300 bees and 40 leave. How many stay?")]}
    assert made["question"] == {"category": "question", "prompt": "Why do bees dance?"}  # label, quotes, rest cut
    assert made["multi-turn"]["turns"][0] == "How do bees make honey?"
    assert made["multi-turn"]["turns"][1] in seeds.FOLLOW_UPS
    assert made["instruction"] == {"category": "instruction", "prompt": "Write a list of five flowers bees like."}
    assert made["summary"]["prompt"].endswith("\n\nBees live in hives. They make honey. They dance to share where "
                                              "flowers are. Queens lay eggs.")
    assert "return sum(xs) - 0" in made["code"]["prompt"] and "+" not in made["code"]["prompt"]  # the bug put in
    assert made["translation"]["prompt"].split(":\n\n")[1] == "Bees are small. They fly from flower to flower."
    assert made["math"] == {"category": "math", "prompt": "A hive has 300 bees and 40 leave. How many stay?"}
    # unusable: a question that is not one, too short, code with no function or nothing to break in it
    assert prompt_from(Request("question", "bees"), "Bees are nice.", rng) is None
    assert prompt_from(Request("summary", "bees"), "Bees.", rng) is None
    assert prompt_from(Request("code", "bees"), "print('hello world and more')", rng) is None
    assert prompt_from(Request("code", "bees"), "def f():\n    pass\n    print('x')", rng) is None


def test_repeats_are_found_exactly_and_nearly():
    seen = Seen()
    seen.add("Why is the sky blue during the day and red at sunset?")
    assert seen.match("why is the SKY blue during the day, and red at sunset") == "exact"
    # its 10 trigrams are all among these 11: Jaccard 10 / 11 >= 0.5
    assert seen.match("Why is the sky blue during the day and red at sunset time?") == "near"
    assert seen.match("Why do cats sleep during the day and hunt at night?") is None


def scripted(texts: list[str]):
    """A target that writes `texts` in order, whatever it is asked."""
    queue = list(texts)

    def write(loaded: object, requests: list[Request], seed: int) -> list[str]:
        return [queue.pop(0) for _ in requests]

    return write


def test_prompts_are_kept_deduplicated_away_from_the_evaluation_prompts_and_a_rerun_adds(tmp_path, monkeypatch):
    builtin = load_prompts()[0].text  # an evaluation prompt, written back word for word
    kinds = list(seeds.REQUESTS)  # requests cycle through the kinds in this order
    assert kinds[:3] == ["question", "instruction", "summary"]
    assert kinds[3:6] == ["code", "translation", "math"]
    texts = ["What makes volcanoes erupt so suddenly?", "Plan a one-day trip to see a volcano.", builtin,
             "x", builtin, "What makes volcanoes erupt so suddenly?"]
    monkeypatch.setattr(write_prompts, "write_texts", scripted(texts))
    out = tmp_path / "self.jsonl"
    written = write_prompts.write_prompts(None, out, count=10, seed=0, batch_size=3, requests=6)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["id"], r["category"], r["prompt"]) for r in records] == [
        ("self-question-00001", "question", "What makes volcanoes erupt so suddenly?"),
        ("self-instruction-00002", "instruction", "Plan a one-day trip to see a volcano.")]
    assert written.added == 2 and written.refused == {"near an evaluation prompt": 2, "exact duplicate": 1,
                                                      "unusable": 1}
    # a rerun keeps what the file holds, refuses its repeats, and numbers on
    monkeypatch.setattr(write_prompts, "write_texts", scripted(["What makes volcanoes erupt, so suddenly?", "How do "
                                                                "glaciers move downhill over many years?"]))
    again = write_prompts.write_prompts(None, out, count=3, seed=0, batch_size=1)
    assert again.already == 2 and again.added == 1 and again.refused == {"exact duplicate": 1}
    read = read_data(out)
    assert [c.id for c in read.conversations][-1] == "self-instruction-00003" and not read.skipped
    assert again.line(out) == f"{out}: +1 prompts (3 in all); refused: 1 exact duplicate"


def test_the_target_writes_one_text_per_request(tiny):
    texts = write_prompts.write_texts(tiny, [Request("question", "bees"), Request("summary", "tea")], seed=0)
    assert len(texts) == 2 and all(isinstance(t, str) for t in texts)
    assert texts == write_prompts.write_texts(tiny, [Request("question", "bees"), Request("summary", "tea")], seed=0)


@pytest.mark.parametrize("path", write_prompts.evaluation_files())
def test_every_evaluation_file_is_read_whole(path):
    assert not read_data(path).skipped


SHIPPED = Path(write_prompts.__file__).parent / "written_prompts.jsonl"  # what `make prompts` wrote


def test_the_shipped_written_prompts_are_near_no_evaluation_prompt_nor_each_other():
    """The target-written training set (`make prompts`), checked again by the rule write-prompts applies."""
    shipped = read_data(SHIPPED).conversations
    evaluation, taken = Seen(), Seen()
    for path in write_prompts.evaluation_files():
        for conversation in read_data(path).conversations:
            for turn in conversation.turns:
                evaluation.add(turn)
    for conversation in shipped:
        text = "\n".join(conversation.turns)
        assert evaluation.match(text, contained=True) is None and taken.match(text) is None, conversation.id
        taken.add(text)
    counts = {category: sum(c.category == category for c in shipped) for category, _, _ in seeds.REQUESTS.values()}
    assert len(shipped) == 1500 and min(counts.values()) >= 150, counts
