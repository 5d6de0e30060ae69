"""`python -m runner …`: the command line only parses into configs and calls one function.

One module per group of commands, each registering its own on `common.app`: `decoding` (generate, sweep), `data`
(merge, sql, list, serve), `training` (write-prompts, train-draft), `check_head` (check-head) and `reports` (report
spec-bench); `common` holds the app, the shared options and the one-line errors, `inputs` the decoding commands'
checks. A command's group is imported only when it runs: `sql`, `merge`, `list` and `serve` never import torch or
transformers, and start in about a second. `--help` and `runner.cli.app` load every group, in the order listed.
"""

from __future__ import annotations

import importlib
import sys

import typer

from runner.cli import shared

GROUPS = {"generate": "decoding", "sweep": "decoding", "merge": "recorded", "sql": "recorded", "list": "recorded",
          "serve": "recorded", "write-prompts": "training", "train-draft": "training", "check-head": "check_head",
          "report": "reports"}


def loaded(command: str | None = None) -> typer.Typer:
    """The app with `command`'s group registered, or every group when `command` is not one of GROUPS."""
    groups = [GROUPS[command]] if command in GROUPS else dict.fromkeys(GROUPS.values())
    for group in groups:
        importlib.import_module(f"runner.cli.{group}")
    return shared.app


def __getattr__(name: str) -> typer.Typer:
    if name == "app":  # `from runner.cli import app`: the whole command line, for tests and embedding
        return loaded()
    raise AttributeError(f"module 'runner.cli' has no attribute {name!r}")


def main() -> None:
    loaded(sys.argv[1] if len(sys.argv) > 1 else None)(prog_name=f"{sys.executable.rsplit('/', 1)[-1]} -m runner")
