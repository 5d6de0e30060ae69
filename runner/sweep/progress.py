"""A sweep's progress beside its database, `<db>.sweep` (JSON): the dashboard shows that a sweep is recording and
how far it is, and `runner sweep --resume last` finds an interrupted sweep of the same plan to finish.

It is written atomically after every recorded cell and says whether the sweep is recording, interrupted or done.
"""

from __future__ import annotations

import hashlib
import json
import os
from datetime import UTC, datetime
from pathlib import Path

RECORDING, INTERRUPTED, DONE = "recording", "interrupted", "done"


def path(db: Path) -> Path:
    return db.with_name(db.name + ".sweep")


def write(db: Path, sweep_id: str, plan: str, done: int, total: int, state: str) -> None:
    """Record where the sweep stands; `plan` is the fingerprint of what it records."""
    final = path(db)
    temp = final.with_name(final.name + f".{os.getpid()}.tmp")
    temp.write_text(json.dumps({"sweep_id": sweep_id, "plan": plan, "done": done, "total": total, "state": state,
                                "pid": os.getpid(), "updated": datetime.now(UTC).isoformat()}))
    os.replace(temp, final)  # a reader never sees half a file


def read(db: Path) -> dict | None:
    """The last progress written beside `db`, with `state` RECORDING only while its process is alive."""
    try:
        progress = json.loads(path(db).read_text())
    except (OSError, ValueError):
        return None
    if progress.get("state") == RECORDING and not _alive(progress.get("pid")):
        progress["state"] = INTERRUPTED  # killed before it could say so
    return progress


def _alive(pid: object) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def fingerprint(*parts: object) -> str:
    """A short hash of what defines a sweep's plan (target, drafts, k, decodings, prompts, tokens, seed, device)."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def resumable(db: Path, plan: str) -> str | None:
    """The id of an interrupted sweep of exactly this plan in `db`, if the last one was."""
    progress = read(db)
    if progress and progress["state"] == INTERRUPTED and progress["plan"] == plan:
        return progress["sweep_id"]
    return None
