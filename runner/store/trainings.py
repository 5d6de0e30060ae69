"""Recording a draft head's training: its row in `trainings`, then one `training_epochs` row and its
`training_positions` per epoch, each written as it happens so the dashboard follows a training that runs.

A write that meets a file locked past the bound is kept and retried with the next one, so a busy dashboard
never costs an epoch's record; `close` insists longer.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from runner.store.connect import Locked, open_for_write

TRAINING_COLUMNS = (
    "train_id", "started_at", "finished_at", "status", "error", "target", "draft", "out_dir", "prompts_file",
    "train_prompts", "heldout_prompts", "train_tokens", "heldout_tokens", "max_new_tokens", "epochs", "draft_vocab",
    "vocab_coverage", "layers", "unroll", "lr", "seed", "saved_epoch", "head_bytes", "data_cached", "data_s",
    "train_s", "wall_s", "cpu_s", "threads", "load_before", "load_after", "device", "dtype", "command", "torch_version",
    "transformers_version", "python_version", "host", "git_commit", "resumed_epoch",
    "learn_context",
)
POOLED = "all"  # `training_positions.category` of the scores pooled over every held-out category
CLOSE_BOUND_S = 120.0  # the last write waits this long for a lock before giving up


def pooled(categories: dict[str, list[tuple[int, int]]]) -> list[tuple[int, int]]:
    """(judged, accepted) per draft position over every category."""
    return [(sum(j for j, _ in column), sum(a for _, a in column)) for column in zip(*categories.values(), strict=True)]


class TrainingLog:
    """The database side of one training (None db: nothing is recorded)."""

    def __init__(self, db: Path | None, train_id: str, bound_s: float = 30.0) -> None:
        self.db, self.train_id, self.bound_s = db, train_id, bound_s
        self.backlog: list[tuple[str, list]] = []  # statements not yet written, in order
        self.started_at = datetime.now(UTC)

    def start(self, row: dict) -> None:
        """The training's row, status 'running'; `row` holds any of TRAINING_COLUMNS. A resumed training writes
        its row again (with its first `started_at`), replacing the one its interrupted run left."""
        self.started_at = row.get("started_at", self.started_at)
        row = {"train_id": self.train_id, "started_at": self.started_at, "status": "running"} | row
        names = [c for c in TRAINING_COLUMNS if c in row]
        self._write([(f"INSERT OR REPLACE INTO trainings ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                      [row[c] for c in names])])

    def epoch(self, epoch: int, train_loss: float | None, heldout_loss: float, seconds: float, lr: float | None,
              categories: dict[str, list[tuple[int, int]]]) -> None:
        """One epoch (0: the head before training) and, per held-out category, its (judged, accepted) per draft
        position 1, 2, …; the pooled counts go in as category POOLED. Written again, it replaces itself."""
        self._write([("INSERT OR REPLACE INTO training_epochs VALUES (?, ?, ?, ?, ?, ?)",
                      [self.train_id, epoch, train_loss, heldout_loss, seconds, lr])]
                    + [("INSERT OR REPLACE INTO training_positions (train_id, epoch, category, position, judged, "
                        "accepted) VALUES (?, ?, ?, ?, ?, ?)", [self.train_id, epoch, category, position, judged,
                                                                 accepted])
                       for category, counts in [(POOLED, pooled(categories)), *categories.items()]
                       for position, (judged, accepted) in enumerate(counts, 1)])

    def finish(self, status: str, fields: dict) -> None:
        """The outcome ('ok', 'interrupted' or 'error') and what is known only at the end; waits longer for a lock."""
        values = {"finished_at": datetime.now(UTC), "status": status} | fields
        assignments = ", ".join(f"{name} = ?" for name in values)
        self.bound_s = CLOSE_BOUND_S
        self._write([(f"UPDATE trainings SET {assignments} WHERE train_id = ?", [*values.values(), self.train_id])])

    def _write(self, statements: list[tuple[str, list]]) -> None:
        self.backlog += statements
        if self.db is None:
            self.backlog = []
            return
        try:
            con, _ = open_for_write(self.db, self.bound_s)
        except Locked:
            if self.bound_s >= CLOSE_BOUND_S:
                raise
            return
        try:
            con.begin()
            for sql, params in self.backlog:
                con.execute(sql, params)
            con.commit()
            self.backlog = []
        finally:
            con.close()
