"""A training's state after each finished epoch, kept aside so that an interrupted training continues from it.

The state (the head, the optimizer's moments, the schedule's step, the batch order's random state, the epochs
scored so far and the best weights) goes to one file under the specdash cache, written aside and renamed in, so an
interrupt never leaves half of it; `--out` is only ever written at the end. The file is named by everything that
defines the training, so running the same command again finds it, and is removed once the head is saved.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch

from runner.engine.weights import sources
from runner.train.conversations import Conversation

STATE_VERSION = 1  # bump when what the file holds changes


def state_path(config: object, conversations: list[Conversation]) -> Path:
    """Where the state of the training `config` (a TrainConfig) over `conversations` is kept. Where it is recorded
    and how many threads it runs on do not define it, so a rerun may change them."""
    fields = {k: str(v) for k, v in asdict(config).items() if k not in ("db", "command", "threads")}
    fields["out"] = str(Path(config.out).resolve())
    described = json.dumps([STATE_VERSION, fields, [(c.id, c.category, c.turns) for c in conversations]])
    return sources.cache_dir() / "train" / f"{hashlib.sha256(described.encode()).hexdigest()[:20]}.pt"


def save_state(state: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, staging = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    torch.save(state, staging)
    os.replace(staging, path)


def load_state(path: Path) -> dict | None:
    """The kept state, or None when there is none (or it cannot be read: then the training starts afresh)."""
    if not path.is_file():
        return None
    try:
        return torch.load(path, weights_only=True)
    except Exception:  # a state this version cannot read is not worth failing a training for
        return None
