"""The README is the contract for SQL users: every column and every command must be in it."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pytest

from runner.cli import app
from runner.store.schema import METRIC_MACROS, MIGRATIONS

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def _section(title: str) -> str:
    start = README.index(title)
    end = README.find("\n### ", start + len(title))
    return README[start : end if end > 0 else None]


def _columns(relation: str) -> list[str]:
    con = duckdb.connect()
    for migration in MIGRATIONS:
        migration(con)
    return [name for name, *_ in con.execute(f"DESCRIBE {relation}").fetchall()]


@pytest.mark.parametrize("relation", ["runs", "rounds", "run_totals", "round_counts", "run_stats", "run_facts",
                                      "trainings", "training_epochs", "training_positions", "position_stats",
                                      "context_stats", "batch_stats"])
def test_the_readme_documents_every_column(relation):
    section = _section(f"### `{relation}`")
    documented = set(re.findall(r"\b[a-z_]+\b", section))
    missing = [c for c in _columns(relation) if c not in documented]
    assert missing == []


def test_the_readme_shows_every_command():
    commands = sorted(c.name or c.callback.__name__ for c in app.registered_commands)
    assert commands == ["check-head", "generate", "list", "merge", "serve", "sql", "sweep", "train-draft",
                        "write-prompts"]
    for command in commands:
        assert f"python -m runner {command}" in README
    groups = {g.name: sorted(c.name for c in g.typer_instance.registered_commands) for g in app.registered_groups}
    assert groups == {"report": ["spec-bench"]}
    assert "python -m runner report spec-bench" in README


def test_the_readme_defines_every_metric_macro():
    section = _section("### Metric macros")
    for signature in METRIC_MACROS:
        assert f"`{signature}`" in section
