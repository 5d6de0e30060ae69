"""SPEED-Bench's files as published (NVIDIA, read by `vllm bench serve --dataset-name speed_bench`): a directory
holding `qualitative.jsonl` and `throughput_<n>k.jsonl`, its splits, one prompt a line. A line is an object with
`category` and `messages` (and its own fields beside them, such as `question_id`); the prompt is the first
message's `content`, as vLLM's `SpeedBench` reads it.

Each prompt's id is `<split>-<line>` (`qualitative-12`, `throughput_2k-3`): stable while the file is, and it says
where the prompt came from. A throughput split's input length bucket is the `<n>k` of its name.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from runner.prompts import Prompt, PromptError

QUALITATIVE = "qualitative"
# A split's file name: qualitative.jsonl or throughput_<n>k.jsonl (n thousand tokens of input, roughly)
SPLIT_FILE = re.compile(r"^(qualitative|throughput_(\d+)k)\.jsonl$")


def is_speed_bench_line(obj: object) -> bool:
    """SPEED-Bench's shape: an object with `messages` and `category`."""
    return isinstance(obj, dict) and "messages" in obj and "category" in obj


def split_name(path: Path) -> str:
    """The split a file holds: its name without `.jsonl` (a file renamed by its user keeps its own name)."""
    return path.name.removesuffix(".jsonl")


def parse_line(obj: dict, split: str, number: int, where: str) -> Prompt:
    """One line: its category kept, the first message's content the prompt."""
    category, messages = obj["category"], obj["messages"]
    if not isinstance(category, str) or not category.strip():
        raise PromptError(f'{where}: "category" must be a non-empty string')
    if not isinstance(messages, list) or not messages or not isinstance(messages[0], dict):
        raise PromptError(f'{where}: "messages" must be a non-empty list of objects')
    content = messages[0].get("content")
    if not isinstance(content, str) or not content.strip():
        raise PromptError(f'{where}: the first message has no "content" text')
    return Prompt(id=f"{split}-{number}", category=category, text=content, split=split)


def split_files(directory: Path) -> dict[str, Path]:
    """The directory's splits, qualitative first, then the throughput splits by input length."""
    found = {split_name(p): p for p in directory.iterdir() if SPLIT_FILE.match(p.name)}
    return dict(sorted(found.items(), key=lambda item: _split_order(item[0])))


def _split_order(split: str) -> tuple[int, int]:
    match = SPLIT_FILE.match(split + ".jsonl")
    return (0, 0) if match is None or match.group(2) is None else (1, int(match.group(2)))


def chosen_files(path: Path, splits: list[str] | None) -> list[Path]:
    """The files to read: a directory's splits (those named, in its order), or the one file given."""
    if not path.is_dir():
        if splits is not None:
            raise PromptError(f"--splits chooses files of a SPEED-Bench directory; {path.name} is one file")
        return [path]
    files = split_files(path)
    if not files:
        raise PromptError(f"{path.name}: no qualitative.jsonl or throughput_<n>k.jsonl in the directory")
    for split in splits or []:
        if split not in files:
            raise PromptError(f'no split "{split}" in {path.name}; available: {", ".join(files)}')
    return [files[s] for s in files if splits is None or s in splits]


def load(path: Path, splits: list[str] | None) -> list[Prompt]:
    """Every prompt of the chosen files, in file and line order."""
    prompts: list[Prompt] = []
    for file in chosen_files(path, splits):
        split = split_name(file)
        for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                where = f"{file.name} line {number}"
                prompts.append(parse_line(read_line(line, where), split, number, where))
    return prompts


def read_line(line: str, where: str) -> dict:
    """The object on a line, or a one-line error."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise PromptError(f"{where}: not valid JSON ({e.msg})") from None
    if not is_speed_bench_line(obj):
        raise PromptError(f'{where}: expected SPEED-Bench\'s object with "category" and "messages"')
    return obj
