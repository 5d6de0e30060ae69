"""The docs site is the contract for SQL users: every column, every metric macro and every command is in it."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pytest

from runner.cli import app
from runner.store.schema import migrate
from runner.store.schema_now import METRIC_MACROS

DOCS = Path(__file__).resolve().parents[2] / "docs"
REFERENCE = (DOCS / "reference.md").read_text()
SITE = "\n".join(page.read_text() for page in sorted(DOCS.rglob("*.md")))


def _section(title: str) -> str:
    start = REFERENCE.index(title)
    end = REFERENCE.find("\n## ", start + len(title))
    return REFERENCE[start : end if end > 0 else None]


def _columns(relation: str) -> list[str]:
    con = duckdb.connect()
    migrate(con)
    return [name for name, *_ in con.execute(f"DESCRIBE {relation}").fetchall()]


@pytest.mark.parametrize("relation", ["runs", "rounds", "run_totals", "round_counts", "run_stats", "run_facts",
                                      "trainings", "training_epochs", "training_positions", "position_stats",
                                      "context_stats", "batch_stats"])
def test_the_reference_documents_every_column(relation):
    section = _section(f"## `{relation}`")
    documented = set(re.findall(r"\b[a-z_]+\b", section))
    missing = [c for c in _columns(relation) if c not in documented]
    assert missing == []


def test_the_docs_show_every_command():
    commands = sorted(c.name or c.callback.__name__ for c in app.registered_commands)
    assert commands == ["check-head", "generate", "list", "merge", "serve", "sql", "sweep", "train-draft",
                        "write-prompts"]
    for command in commands:
        assert f"python -m runner {command}" in SITE
    groups = {g.name: sorted(c.name for c in g.typer_instance.registered_commands) for g in app.registered_groups}
    assert groups == {"report": ["docs", "spec-bench", "speed-bench"]}
    for command in groups["report"]:
        assert f"python -m runner report {command}" in SITE


def test_the_reference_defines_every_metric_macro():
    section = _section("## Metric macros")
    for signature in METRIC_MACROS:
        assert f"`{signature}`" in section
