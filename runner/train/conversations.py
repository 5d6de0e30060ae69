"""Training data as users bring it: conversations whose user turns are kept and whose assistant turns the target
writes again (EAGLE-3's advice: a head learns what this target says, not what another model wrote).

One record per line (JSON Lines), or one JSON array of records (as ShareGPT dumps ship). A record is told apart
by its fields:

- `{"conversations": [{"from": "human" | "gpt", "value": …}, …]}`: ShareGPT;
- `{"messages": [{"role": "user" | "assistant", "content": …}, …]}`: OpenAI / UltraChat;
- `{"turns": [user message, …]}`: user turns only, as Spec-Bench and `runner write-prompts` write them;
- `{"id", "category", "prompt"}`: the project's prompt JSONL, one user turn.

Any record may carry `id` and `category`; without them the id is the file's name and the record's number, and the
category is `chat`. Assistant and system turns are dropped; a record with no non-empty user turn, or that is not
one of these shapes, is counted and skipped.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from runner.store.trainings import POOLED  # the pooled held-out score's category: no file may use the name

USER_ROLES = {"human", "user"}  # ShareGPT's `from` and OpenAI's `role` for a user turn
DROPPED_ROLES = {"gpt", "assistant", "chatgpt", "bard", "bing", "model", "system", "tool", "function"}
DEFAULT_CATEGORY = "chat"


@dataclass(frozen=True)
class Conversation:
    """The user side of one conversation; the target answers each turn after the ones before."""

    id: str
    category: str
    turns: tuple[str, ...]  # user messages, in order, none empty


@dataclass(frozen=True)
class Read:
    """What a data file held: its usable conversations and why the others were skipped."""

    conversations: list[Conversation]
    skipped: Counter  # reason -> records

    def summary(self, name: str) -> str:
        turns = sum(len(c.turns) for c in self.conversations)
        line = f"{name}: {len(self.conversations)} conversations ({turns} user turns)"
        if self.skipped:
            reasons = ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items()))
            line += f"; skipped {sum(self.skipped.values())}: {reasons}"
        return line


class DataError(ValueError):
    """A data file with nothing usable in it; the message is one line."""


def read_data(path: Path) -> Read:
    """Every usable conversation of `path`, in file order; raises DataError when there is none."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"{path.name}: no such file") from None
    except (UnicodeDecodeError, IsADirectoryError):
        raise DataError(f"{path.name}: not a UTF-8 text file") from None
    records, skipped = _records(text)
    conversations: list[Conversation] = []
    seen: set[str] = set()
    for number, record in records:
        conversation, problem = parse_record(record, f"{path.stem}-{number}")
        if conversation is not None and conversation.id in seen:
            conversation, problem = None, "with a repeated id"
        if conversation is None:
            skipped[problem] += 1
            continue
        seen.add(conversation.id)
        conversations.append(conversation)
    read = Read(conversations, skipped)
    if not conversations:
        raise DataError(f"{read.summary(path.name)}: nothing to train on")
    return read


def data_name(paths: tuple[Path, ...]) -> str:
    return ", ".join(path.name for path in paths)


def read_all(paths: tuple[Path, ...]) -> Read:
    """The usable conversations of every file in `paths`, one file after another; a conversation whose id an
    earlier file already gave is skipped, as a repeated id within one file is."""
    conversations: list[Conversation] = []
    skipped: Counter = Counter()
    seen: set[str] = set()
    for path in paths:
        read = read_data(path)
        skipped.update(read.skipped)
        for conversation in read.conversations:
            if conversation.id in seen:
                skipped["with a repeated id"] += 1
                continue
            seen.add(conversation.id)
            conversations.append(conversation)
    return Read(conversations, skipped)


def _records(text: str) -> tuple[list[tuple[int, object]], Counter]:
    """(record number, parsed JSON) for each record, and the count of lines that are not JSON."""
    skipped: Counter = Counter()
    if text.lstrip().startswith("["):
        try:
            return list(enumerate(json.loads(text), 1)), skipped
        except json.JSONDecodeError:
            pass  # not one array after all: read it line by line
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append((number, json.loads(line)))
        except json.JSONDecodeError:
            skipped["not JSON"] += 1
    return records, skipped


def parse_record(record: object, fallback_id: str) -> tuple[Conversation | None, str]:
    """The conversation a record holds, or None and why it cannot be used."""
    if not isinstance(record, dict):
        return None, "not a JSON object"
    if "conversations" in record:
        turns = _user_turns(record["conversations"], "from", "value")
    elif "messages" in record:
        turns = _user_turns(record["messages"], "role", "content")
    elif "turns" in record:
        turns = record["turns"] if isinstance(record["turns"], list) else None
    elif "prompt" in record:
        turns = [record["prompt"]]
    else:
        return None, "of no known format"
    if turns is None or not all(isinstance(t, str) for t in turns):
        return None, "of no known format"
    turns = [t for t in turns if t.strip()]
    if not turns:
        return None, "without a user turn"
    category = record.get("category")
    category = category.strip() if isinstance(category, str) and category.strip() else DEFAULT_CATEGORY
    if category == POOLED:
        return None, f'in category "{POOLED}" (reserved)'
    raw_id = record.get("id", record.get("question_id"))
    conversation_id = str(raw_id) if isinstance(raw_id, (str, int)) and str(raw_id).strip() else fallback_id
    return Conversation(conversation_id, category, tuple(turns)), ""


def _user_turns(turns: object, role_key: str, text_key: str) -> list[str] | None:
    """The user messages of a list of turns; None when it is not such a list."""
    if not isinstance(turns, list):
        return None
    users = []
    for turn in turns:
        if not isinstance(turn, dict) or not isinstance(turn.get(role_key), str):
            return None
        role = turn[role_key].lower()
        if role in USER_ROLES:
            users.append(turn.get(text_key))
        elif role not in DROPPED_ROLES:
            return None
    return users
