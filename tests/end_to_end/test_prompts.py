"""The prompt suite: the built-in file's content, user files, their errors, and selection."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from runner.prompts import Prompt, PromptError, load_prompts, select_prompts


def write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def row(id: str, category: str, prompt: str) -> str:
    return json.dumps({"id": id, "category": category, "prompt": prompt})


def test_builtin_suite_has_three_categories_with_unique_ids():
    prompts = load_prompts()
    counts = Counter(p.category for p in prompts)
    assert list(counts) == ["code", "summary", "poem"]
    assert all(n >= 8 for n in counts.values())
    assert len({p.id for p in prompts}) == len(prompts)


def test_builtin_summaries_carry_their_passage():
    summaries = [p for p in load_prompts() if p.category == "summary"]
    for p in summaries:
        instruction, passage = p.text.split("\n\n", 1)
        assert instruction.startswith("Summarize")
        assert len(passage.split()) >= 60, p.id


def test_builtin_code_prompts_include_code_to_copy_from():
    code = [p for p in load_prompts() if p.category == "code"]
    with_block = [p.id for p in code if re.search(r"```python\n.+\n```", p.text, re.DOTALL)]
    assert len(with_block) >= 3


def test_user_file_with_custom_categories_loads_exactly(tmp_path: Path):
    path = write(tmp_path, row("q1", "math", "What is 2 + 2?"), "", "  ", row("t1", "translate", "Say hi in French."))
    assert load_prompts(path) == [
        Prompt(id="q1", category="math", text="What is 2 + 2?"),
        Prompt(id="t1", category="translate", text="Say hi in French."),
    ]


GOOD = row("a", "code", "Write a loop.")


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ('{"id": "b" "category": "code"}', "prompts.jsonl line 2: not valid JSON (Expecting ',' delimiter)"),
        ('["b", "code", "text"]', "prompts.jsonl line 2: expected a JSON object"),
        ('{"id": "b", "prompt": "text"}', 'prompts.jsonl line 2: missing "category"'),
        (row("b", "code", "   "), 'prompts.jsonl line 2: "prompt" must be a non-empty string'),
        ('{"id": 7, "category": "code", "prompt": "text"}', 'prompts.jsonl line 2: "id" must be a non-empty string'),
        (
            '{"id": "b", "category": "code", "prompt": "text", "lang": "en"}',
            'prompts.jsonl line 2: unknown key "lang" (allowed: id, category, prompt)',
        ),
        (row("a", "poem", "Another."), 'prompts.jsonl line 2: duplicate id "a" (first on line 1)'),
    ],
)
def test_malformed_line_is_named(tmp_path: Path, bad_line: str, message: str):
    with pytest.raises(PromptError) as info:
        load_prompts(write(tmp_path, GOOD, bad_line))
    assert str(info.value) == message


def test_error_counts_blank_lines(tmp_path: Path):
    with pytest.raises(PromptError, match=r'^prompts\.jsonl line 4: duplicate id "a" \(first on line 1\)$'):
        load_prompts(write(tmp_path, GOOD, "", "", GOOD))


def test_empty_and_missing_files(tmp_path: Path):
    with pytest.raises(PromptError, match=r"^prompts\.jsonl: no prompts$"):
        load_prompts(write(tmp_path, "", "   "))
    with pytest.raises(PromptError, match=r"^absent\.jsonl: no such file$"):
        load_prompts(tmp_path / "absent.jsonl")


SUITE = [
    Prompt("c1", "code", "x"),
    Prompt("p1", "poem", "x"),
    Prompt("c2", "code", "x"),
    Prompt("s1", "summary", "x"),
    Prompt("p2", "poem", "x"),
    Prompt("c3", "code", "x"),
]


def ids(prompts: list[Prompt]) -> list[str]:
    return [p.id for p in prompts]


def test_select_all_groups_by_category_in_file_order():
    assert ids(select_prompts(SUITE, None, None)) == ["c1", "c2", "c3", "p1", "p2", "s1"]
    assert ids(select_prompts(SUITE, None, 1)) == ["c1", "p1", "s1"]


def test_select_keeps_given_order_and_limit():
    assert ids(select_prompts(SUITE, ["summary", "code"], 2)) == ["s1", "c1", "c2"]
    assert ids(select_prompts(SUITE, ["poem", "poem"], None)) == ["p1", "p2"]


def test_select_rejects_unknown_category_and_bad_limit():
    with pytest.raises(PromptError, match=r'^unknown category "poems"; available: code, poem, summary$'):
        select_prompts(SUITE, ["code", "poems"], None)
    with pytest.raises(PromptError, match=r"^per_category must be at least 1, got 0$"):
        select_prompts(SUITE, None, 0)
