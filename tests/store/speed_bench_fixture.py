"""Writes tests/data/speed_bench/, a tiny SPEED-Bench directory in its published shape: `qualitative.jsonl` with a
few hand-written prompts in three categories, and `throughput_1k.jsonl` / `throughput_2k.jsonl` whose prompts are
long texts made here from a seeded generator (about 1,000 and 2,000 SmolLM2 tokens with the chat template).

`python -m tests.store.speed_bench_fixture` rewrites the files; a test checks they equal what this writes.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

DIRECTORY = Path(__file__).resolve().parents[1] / "data" / "speed_bench"

QUALITATIVE = (
    ("coding", "Write a Python function that returns the n-th Fibonacci number iteratively."),
    ("coding", "Write a Python function that reverses the words of a sentence."),
    ("summarization", "Summarize in two sentences: the library opens at nine, closes at five, and lends up to "
                      "six books per visit for three weeks; late books cost ten cents a day."),
    ("summarization", "Summarize in one sentence: the town council met on Monday, approved the new bridge, and "
                      "postponed the vote on the park until next month."),
    ("writing", "Write a four-line poem about a lighthouse in winter."),
    ("writing", "Write a short thank-you note to a neighbour who watered your plants."),
)
STATIONS = ("Alder", "Birch", "Cedar", "Dogwood", "Elm", "Fir", "Gorse", "Hazel")
READINGS = ("temperature", "pressure", "humidity", "wind speed", "rainfall")
WORDS = ("river", "lantern", "copper", "meadow", "signal", "harbour", "pencil", "orbit", "violet", "engine",
         "garden", "thunder", "marble", "compass", "ladder", "window", "falcon", "silver", "canvas", "bridge")
# (log records, sentences) per split, chosen so that each prompt lands near its split's length (a test measures it)
SIZES = {"throughput_1k": (36, 63), "throughput_2k": (73, 128)}


def question_id(split: str, number: int) -> str:
    """A 32-hex-digit id, as SPEED-Bench's lines carry (made from the split and line)."""
    return hashlib.md5(f"{split}-{number}".encode()).hexdigest()


def records_text(rng: random.Random, count: int) -> str:
    """A station log: low-entropy text that repeats its phrasing, as a document to summarise."""
    lines = []
    for n in range(1, count + 1):
        station, reading = rng.choice(STATIONS), rng.choice(READINGS)
        lines.append(f"Record {n}: station {station}-{rng.randint(1, 9)} reported {reading} "
                     f"{rng.randint(10, 99)}.{rng.randint(0, 9)} at {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}.")
    return "\n".join(lines)


def words_text(rng: random.Random, count: int) -> str:
    """Sentences of shuffled words: high-entropy text with little to copy."""
    return "\n".join(" ".join(rng.choice(WORDS) for _ in range(12)).capitalize() + "." for _ in range(count))


def throughput_lines(split: str) -> list[dict]:
    rng, (records, sentences) = random.Random(split), SIZES[split]
    low = records_text(rng, records) + "\n\nList every record of station Alder, one per line, as written above."
    high = words_text(rng, sentences) + "\n\nRepeat the last sentence above, then say which word is most common."
    return [_line(split, 1, "low_entropy", low), _line(split, 2, "high_entropy", high)]


def _line(split: str, number: int, category: str, content: str) -> dict:
    return {"question_id": question_id(split, number), "category": category,
            "messages": [{"role": "user", "content": content}]}


def files() -> dict[str, str]:
    """Each file's name and text."""
    qualitative = [_line("qualitative", n, c, text) for n, (c, text) in enumerate(QUALITATIVE, 1)]
    out = {"qualitative.jsonl": qualitative}
    out.update({f"{split}.jsonl": throughput_lines(split) for split in SIZES})
    return {name: "".join(json.dumps(line) + "\n" for line in lines) for name, lines in out.items()}


if __name__ == "__main__":
    DIRECTORY.mkdir(parents=True, exist_ok=True)
    for name, text in files().items():
        (DIRECTORY / name).write_text(text, encoding="utf-8")
