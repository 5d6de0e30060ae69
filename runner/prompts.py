"""The prompt suite: load prompts from JSON Lines, then pick categories and a count per category.

A prompts file holds one JSON object per non-blank line, in one of two formats, told apart by the first line's keys:

- the project's: `{"id": "code-01", "category": "code", "prompt": "..."}`; any category names are allowed; the
  built-in suite (`builtin_prompts.jsonl`) has `code`, `summary` and `poem`;
- Spec-Bench's `question.jsonl`, as published: `{"question_id": 81, "category": "writing", "turns": ["...", ...]}`
  (and an optional `reference`, not used). Each turn is a prompt of its own, `<question_id>-<turn>`, in the
  conversation `<question_id>`: turn n is asked after the earlier turns and the model's answers to them;
- SPEED-Bench's, as published: a directory of `qualitative.jsonl` and `throughput_<n>k.jsonl`, or any one of its
  files, each line `{"category": ..., "messages": [{"content": "..."}, ...], ...}` (`runner/speed_bench_files.py`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

BUILTIN_PATH = Path(__file__).parent / "builtin_prompts.jsonl"
FIELDS = ("id", "category", "prompt")
SPEC_BENCH_FIELDS = ("question_id", "category", "turns", "reference")


@dataclass(frozen=True)
class Prompt:
    """One user message of the suite, sent to the model through its chat template."""

    id: str  # unique within its file; the `prompt_id` column of `runs`
    category: str  # the group acceptance is compared across, e.g. 'code', 'summary', 'poem'
    text: str  # the user message itself, without any chat template
    # Out of repr, which a sweep's plan hash reads (`SweepConfig.plan_id`): plans recorded before turns keep their
    # hash, and a later turn differs from the others by its id and text already.
    turn: int = field(default=1, repr=False)  # 1-based turn of its conversation (MT-bench questions have two)
    conversation: str | None = field(default=None, repr=False)  # the question it belongs to; None: its own
    # the user messages of the earlier turns, each answered by the model before this one is asked
    history: tuple[str, ...] = field(default=(), repr=False)
    # the SPEED-Bench split it came from ('qualitative', 'throughput_2k'); None in the other formats. A directory's
    # throughput splits share category names, so a count per category counts within each split.
    split: str | None = field(default=None, repr=False)

    @property
    def thread(self) -> str:
        """The conversation this prompt belongs to (`runs.conversation`): its own id when it stands alone."""
        return self.conversation or self.id


class PromptError(ValueError):
    """A prompts file or a selection that cannot be used; the message is one line."""


def load_prompts(path: Path | None = None, splits: list[str] | None = None) -> list[Prompt]:
    """Read every prompt of `path` (the built-in suite if None), or raise on the first bad line. `splits` chooses
    files of a SPEED-Bench directory (None: all of them)."""
    from runner import speed_bench_files  # here: it builds on this module's Prompt

    path = BUILTIN_PATH if path is None else path
    try:
        if path.is_dir() or splits is not None or _first_is_speed_bench(path):
            return _checked(speed_bench_files.load(path, splits), path)
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise PromptError(f"{path.name}: no such file") from None
    prompts: list[Prompt] = []
    first_line: dict[str, int] = {}  # id -> line it first appeared on
    parse = None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path.name} line {number}"
        parse = parse or (_parse_question if _is_spec_bench(line) else _parse_line)
        for prompt in parse(line, where):
            if prompt.id in first_line:
                raise PromptError(f'{where}: duplicate id "{prompt.id}" (first on line {first_line[prompt.id]})')
            first_line[prompt.id] = number
            prompts.append(prompt)
    if not prompts:
        raise PromptError(f"{path.name}: no prompts")
    return prompts


def _first_is_speed_bench(path: Path) -> bool:
    """SPEED-Bench's format: a first non-blank line that is an object with `category` and `messages`."""
    from runner import speed_bench_files

    with path.open(encoding="utf-8") as lines:
        first = next((line for line in lines if line.strip()), "")
    try:
        return speed_bench_files.is_speed_bench_line(json.loads(first))
    except json.JSONDecodeError:
        return False


def _checked(prompts: list[Prompt], path: Path) -> list[Prompt]:
    if not prompts:
        raise PromptError(f"{path.name}: no prompts")
    return prompts


def _is_spec_bench(line: str) -> bool:
    """Spec-Bench's format: a first line that is an object with `question_id` and `turns`."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        return False
    return isinstance(obj, dict) and "question_id" in obj and "turns" in obj


def _json_object(line: str, where: str) -> dict:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise PromptError(f"{where}: not valid JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise PromptError(f"{where}: expected a JSON object")
    return obj


def _parse_question(line: str, where: str) -> list[Prompt]:
    """A Spec-Bench question: one prompt per turn, each after the turns before it."""
    obj = _json_object(line, where)
    extra = sorted(set(obj) - set(SPEC_BENCH_FIELDS))
    if extra:
        raise PromptError(f'{where}: unknown key "{extra[0]}" (allowed: {", ".join(SPEC_BENCH_FIELDS)})')
    for name in ("question_id", "category", "turns"):
        if name not in obj:
            raise PromptError(f'{where}: missing "{name}"')
    qid, category, turns = obj["question_id"], obj["category"], obj["turns"]
    if not isinstance(qid, int) or isinstance(qid, bool):
        raise PromptError(f'{where}: "question_id" must be an integer')
    if not isinstance(category, str) or not category.strip():
        raise PromptError(f'{where}: "category" must be a non-empty string')
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
        raise PromptError(f'{where}: "turns" must be a non-empty list of non-empty strings')
    return [Prompt(id=f"{qid}-{n}", category=category, text=text, turn=n, conversation=str(qid),
                   history=tuple(turns[:n - 1])) for n, text in enumerate(turns, 1)]


def _parse_line(line: str, where: str) -> list[Prompt]:
    obj = _json_object(line, where)
    extra = sorted(set(obj) - set(FIELDS))
    if extra:
        raise PromptError(f'{where}: unknown key "{extra[0]}" (allowed: {", ".join(FIELDS)})')
    for name in FIELDS:
        if name not in obj:
            raise PromptError(f'{where}: missing "{name}"')
        if not isinstance(obj[name], str) or not obj[name].strip():
            raise PromptError(f'{where}: "{name}" must be a non-empty string')
    return [Prompt(id=obj["id"], category=obj["category"], text=obj["prompt"])]


def select_prompts(
    prompts: list[Prompt], categories: list[str] | None, per_category: int | None
) -> list[Prompt]:
    """The first `per_category` conversations (None: all) of each of `categories` (of each SPEED-Bench split apart),
    grouped in that order: a question's turns go together (a prompt of the project's format is a conversation of one
    turn). The first N in file order: the same N prompts every time, and a larger N keeps them.

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
        kept: set[str] = set()
        for split in dict.fromkeys(p.split for p in in_category):
            kept.update(list(dict.fromkeys(p.thread for p in in_category if p.split == split))[:per_category])
        selected.extend(p for p in in_category if p.thread in kept)
    return selected
