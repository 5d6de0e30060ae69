"""The code's map and grain: every module has its line in the README's "Where things are", no file outgrows a
reader, and no module imports one from a layer above its own."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("runner", "dashboard", "bench")
# Bottom up; a module may import its own layer and those below. engine and store share a layer but never import
# each other, and neither do sweep and train.
LAYERS = (
    ("runner.records",),
    ("runner.engine", "runner.store"),
    ("runner.prompts", "runner.speed_bench_files", "runner.cells"),
    ("runner.sweep", "runner.train"),
    ("runner.cli", "runner.serve", "runner.report", "runner.__main__", "dashboard", "bench"),
)
APART = (("runner.engine", "runner.store"), ("runner.sweep", "runner.train"))


def modules(*packages: str) -> list[Path]:
    return sorted(p.relative_to(ROOT) for package in packages for p in (ROOT / package).rglob("*.py"))


def mapped() -> set[str]:
    """The files the README's table names: a row's first cell holds a path, then names in that path's folder."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Where things are"):readme.index("## What it measures")]
    named = set()
    for row in re.findall(r"^\| (.+?) \|", section, flags=re.M):
        names = re.findall(r"`([^`]+)`", row)
        if not names:
            continue
        folder = str(Path(names[0]).parent)
        named |= {name if "/" in name else f"{folder}/{name}" for name in names}
    return named


def test_every_module_has_its_line_on_the_map():
    named = mapped()
    missing = [str(p) for p in modules("runner", "dashboard")
               if p.name not in ("__init__.py", "__main__.py") and str(p) not in named]
    assert missing == []
    assert {n for n in named if n.endswith(".py") and not (ROOT / n).exists()} == set()  # no line for a file gone


def test_the_map_check_notices_a_missing_module():
    assert "runner/cells.py" in mapped() and "runner/nothing_here.py" not in mapped()


@pytest.mark.parametrize("path", modules(*PACKAGES), ids=str)
def test_no_file_outgrows_a_reader(path):
    assert len((ROOT / path).read_text().splitlines()) <= 300


def layer(module: str) -> tuple[int, str] | None:
    for level, names in enumerate(LAYERS):
        for name in names:
            if module == name or module.startswith(name + "."):
                return level, name
    return None


def imports(source: str) -> set[str]:
    """The project modules a source imports, lazily imported ones included."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {m for m in found if m.split(".")[0] in PACKAGES}


def against_the_grain(path: Path, source: str | None = None) -> list[str]:
    parts = path.with_suffix("").parts
    if parts[1:] == ("__init__",):  # a top-level package's own file: nothing to place
        return []
    own = layer(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    if own is None:
        return [f"{path}: in no layer"]
    wrong = []
    for module in sorted(imports((ROOT / path).read_text() if source is None else source)):
        theirs = layer(module)
        if theirs is None:
            continue
        if theirs[0] > own[0] or tuple(sorted((own[1], theirs[1]))) in APART:
            wrong.append(f"{path} imports {module}")
    return wrong


def test_no_module_imports_against_the_grain():
    assert [line for path in modules(*PACKAGES) for line in against_the_grain(path)] == []


def test_the_grain_check_notices_an_import_from_above_or_beside():
    probe = Path("runner/train/probe.py")
    assert against_the_grain(probe, "from runner.sweep.plan import SweepConfig\nimport runner.cells\n") == [
        "runner/train/probe.py imports runner.sweep.plan"]
    assert against_the_grain(Path("runner/store/probe.py"), "def f():\n    from runner.engine import models\n") == [
        "runner/store/probe.py imports runner.engine"]
