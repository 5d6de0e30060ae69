"""The prompt suite: load prompts from JSON Lines, then pick categories and a count per category.

A prompts file holds one JSON object per non-blank line:
`{"id": "code-01", "category": "code", "prompt": "..."}`. Any category names are allowed; the
built-in suite (`builtin_prompts.jsonl`) has `code`, `summary` and `poem`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

BUILTIN_PATH = Path(__file__).parent / "builtin_prompts.jsonl"
FIELDS = ("id", "category", "prompt")


@dataclass(frozen=True)
class Prompt:
    """One user message of the suite, sent to the model through its chat template."""

    id: str  # unique within its file; the `prompt_id` column of `runs`
    category: str  # the group acceptance is compared across, e.g. 'code', 'summary', 'poem'
    text: str  # the user message itself, without any chat template


class PromptError(ValueError):
    """A prompts file or a selection that cannot be used; the message is one line."""


def load_prompts(path: Path | None = None) -> list[Prompt]:
    """Read every prompt of `path` (the built-in suite if None), or raise on the first bad line."""
    path = BUILTIN_PATH if path is None else path
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise PromptError(f"{path.name}: no such file") from None
    prompts: list[Prompt] = []
    first_line: dict[str, int] = {}  # id -> line it first appeared on
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path.name} line {number}"
        prompt = _parse_line(line, where)
        if prompt.id in first_line:
            raise PromptError(f'{where}: duplicate id "{prompt.id}" (first on line {first_line[prompt.id]})')
        first_line[prompt.id] = number
        prompts.append(prompt)
    if not prompts:
        raise PromptError(f"{path.name}: no prompts")
    return prompts


def _parse_line(line: str, where: str) -> Prompt:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise PromptError(f"{where}: not valid JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise PromptError(f"{where}: expected a JSON object")
    extra = sorted(set(obj) - set(FIELDS))
    if extra:
        raise PromptError(f'{where}: unknown key "{extra[0]}" (allowed: {", ".join(FIELDS)})')
    for name in FIELDS:
        if name not in obj:
            raise PromptError(f'{where}: missing "{name}"')
        if not isinstance(obj[name], str) or not obj[name].strip():
            raise PromptError(f'{where}: "{name}" must be a non-empty string')
    return Prompt(id=obj["id"], category=obj["category"], text=obj["prompt"])


def select_prompts(
    prompts: list[Prompt], categories: list[str] | None, per_category: int | None
) -> list[Prompt]:
    """The first `per_category` prompts (None: all) of each of `categories`, grouped in that order.

    `categories` None means every category, in the order each first appears in the file.
    """
    available = list(dict.fromkeys(p.category for p in prompts))
    if per_category is not None and per_category < 1:
        raise PromptError(f"per_category must be at least 1, got {per_category}")
    for category in categories or []:
        if category not in available:
            raise PromptError(f'unknown category "{category}"; available: {", ".join(sorted(available))}')
    selected: list[Prompt] = []
    for category in available if categories is None else dict.fromkeys(categories):
        in_category = [p for p in prompts if p.category == category]
        selected.extend(in_category[:per_category])
    return selected
