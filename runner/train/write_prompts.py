"""`runner write-prompts`: training prompts the target writes itself, for a user who brings no data.

Each prompt starts from a topic and a kind of task (`seeds.py`): the target is asked, sampling, for the material
(a question, an instruction, a passage to summarise, a function, two sentences to translate, a word problem) and
the prompt is made from it. Prompts that repeat one already written, exactly or nearly (word-trigram Jaccard
similarity at least NEAR), or that share NEAR of the trigrams of the smaller with any evaluation prompt the project
ships (the built-in suite, the tests' prompt files), are refused. Prompts are appended to the file as they are
accepted, so a stopped run keeps them and a rerun adds to them.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from runner.engine.weights import models
from runner.prompts import BUILTIN_PATH
from runner.train import seeds
from runner.train.conversations import read_data
from runner.train.data import left_padded

NEAR = 0.5  # word-trigram Jaccard similarity from which two prompts count as the same
TEMPERATURE, TOP_P = 0.9, 0.95  # sampling, so one request written twice gives two texts


def evaluation_files() -> list[Path]:
    """Every prompt file the project evaluates on: the built-in suite and any prompts kept with the tests."""
    tests = Path(__file__).resolve().parents[2] / "tests"
    return [BUILTIN_PATH, *sorted(tests.glob("**/*.jsonl"))]


def normalised(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def shingles(text: str) -> set[str]:
    words = normalised(text).split()
    return {" ".join(words[i : i + 3]) for i in range(max(1, len(words) - 2))}


class Seen:
    """Texts already taken, found again by exact normal form or by trigram overlap (an index from trigram to texts,
    so a check costs the texts that share one, not all)."""

    def __init__(self) -> None:
        self.exact: set[str] = set()
        self.shingled: list[set[str]] = []
        self.index: dict[str, list[int]] = {}

    def add(self, text: str) -> None:
        self.exact.add(normalised(text))
        grams = shingles(text)
        for gram in grams:
            self.index.setdefault(gram, []).append(len(self.shingled))
        self.shingled.append(grams)

    def match(self, text: str, contained: bool = False) -> str | None:
        """'exact' or 'near' when `text` repeats one already taken, else None. Near: the trigrams shared are at
        least NEAR of all theirs (Jaccard), or with `contained` of the smaller text's (either holds much of the
        other)."""
        if normalised(text) in self.exact:
            return "exact"
        grams = shingles(text)
        shared = Counter(i for gram in grams for i in self.index.get(gram, ()))
        for i, common in shared.items():
            other = self.shingled[i]
            if common / (min(len(grams), len(other)) if contained else len(grams | other)) >= NEAR:
                return "near"
        return None


@dataclass(frozen=True)
class Request:
    kind: str
    topic: str


def cleaned(text: str, code: bool) -> str:
    """The target's answer without the frame it sometimes puts around it: labels and quotes, or for code the
    fence."""
    text = text.strip()
    if code:
        fenced = re.search(r"```(?:python)?\n(.*?)(?:```|$)", text, re.S)
        return fenced.group(1).strip() if fenced else text
    text = re.sub(r"^(question|instruction|problem|task)\s*:\s*", "", text, flags=re.I)
    return text.strip().strip('"').strip()


def prompt_from(request: Request, text: str, rng: random.Random) -> dict | None:
    """The record a written text makes for its request (None when the text is unusable for it)."""
    category = seeds.REQUESTS[request.kind][0]
    text = cleaned(text, request.kind == "code")
    if request.kind in ("question", "multi-turn", "instruction", "math"):
        text = text.splitlines()[0].strip().strip('"').strip() if text else ""
    words = len(text.split())
    if words < 4 or words > 220:
        return None
    if request.kind in ("question", "multi-turn") and not text.endswith("?"):
        return None
    if request.kind == "multi-turn":
        return {"category": category, "turns": [text, rng.choice(seeds.FOLLOW_UPS)]}
    if request.kind == "code":
        if "def " not in text:
            return None
        bug = next(((old, new) for old, new in seeds.BUGS if old in text), None)
        if bug is None:
            return None
        text = rng.choice(seeds.FIX).format(text=text.replace(*bug, 1))
    elif request.kind == "summary":
        text = rng.choice(seeds.SUMMARISE).format(text=text)
    elif request.kind == "translation":
        text = rng.choice(seeds.TRANSLATE).format(text=text)
    return {"category": category, "prompt": text}


def write_texts(loaded: models.Loaded, requests: list[Request], seed: int) -> list[str]:
    """The target's sampled answers to a batch of requests, in one left-padded batch."""
    rows = [models.encode_chat(loaded, seeds.REQUESTS[r.kind][1].format(topic=r.topic)) for r in requests]
    pad = next(iter(loaded.eos_ids))
    ids, mask = left_padded(rows, pad)
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = loaded.model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=TEMPERATURE,
                                    top_p=TOP_P, max_new_tokens=max(seeds.REQUESTS[r.kind][2] for r in requests),
                                    pad_token_id=pad)
    return [loaded.tokenizer.decode(row[ids.shape[1] :], skip_special_tokens=True) for row in out]


def refusal(record: dict | None, evaluation: Seen, taken: Seen) -> str | None:
    """Why a record is not kept, or None."""
    if record is None:
        return "unusable"
    if evaluation.match(text_of(record), contained=True):
        return "near an evaluation prompt"
    repeat = taken.match(text_of(record))
    return None if repeat is None else f"{repeat} duplicate"


def text_of(record: dict) -> str:
    return "\n".join(record["turns"]) if "turns" in record else record["prompt"]


@dataclass
class Written:
    """What a run of write-prompts did."""

    added: int = 0
    already: int = 0  # prompts the file held before
    refused: Counter = field(default_factory=Counter)  # reason -> texts written and not kept

    def line(self, out: Path) -> str:
        reasons = ", ".join(f"{n} {why}" for why, n in sorted(self.refused.items())) or "none"
        return f"{out}: +{self.added} prompts ({self.already + self.added} in all); refused: {reasons}"


def write_prompts(loaded: models.Loaded, out: Path, count: int, seed: int, batch_size: int,
                  advance: Callable[[int], None] = lambda n: None, requests: int | None = None) -> Written:
    """Append prompts to `out` until it holds `count`, or `requests` texts were asked for (default: 20 per prompt
    still wanted)."""
    evaluation, taken = Seen(), Seen()
    for path in evaluation_files():
        for conversation in read_data(path).conversations:
            for turn in conversation.turns:
                evaluation.add(turn)
    kept = read_data(out).conversations if out.is_file() and out.stat().st_size else []
    for conversation in kept:
        taken.add("\n".join(conversation.turns))
    written = Written(already=len(kept))
    rng = random.Random(f"{seed}-{len(kept)}")
    kinds = list(seeds.REQUESTS)
    budget = 20 * max(0, count - len(kept)) if requests is None else requests
    with out.open("a", encoding="utf-8") as file:
        for start in range(0, budget, batch_size):
            batch = [Request(kinds[(start + i) % len(kinds)], rng.choice(seeds.TOPICS))
                     for i in range(min(batch_size, budget - start))]
            for request, text in zip(batch, write_texts(loaded, batch, rng.randrange(2**31)), strict=True):
                record = prompt_from(request, text, rng)
                why = refusal(record, evaluation, taken)
                if why:
                    written.refused[why] += 1
                    continue
                taken.add(text_of(record))
                number = written.already + written.added + 1
                file.write(json.dumps({"id": f"self-{record['category']}-{number:05d}", **record}) + "\n")
                file.flush()
                written.added += 1
                advance(1)
                if written.already + written.added >= count:
                    return written
    return written
