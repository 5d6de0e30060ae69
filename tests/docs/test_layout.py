"""The code's map and grain: every module has its line in docs/architecture.md, no module imports one from a layer
above its own (nor runner.vllm our engine), no two modules import each other in a cycle (lazy imports included),
and no two modules share a file name."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("runner", "dashboard", "bench")
# Bottom up; a module may import its own layer and those below. engine and store share a layer but never import
# each other, and neither do sweep and train. Inside the engine the wings are layered too: weights, then the round,
# then the drafters, then the pair.
LAYERS = (
    ("runner.records",),
    ("runner.engine.weights",),
    ("runner.engine.round",),
    ("runner.engine.drafters",),
    ("runner.engine", "runner.store"),
    ("runner.speed_bench_files",),
    ("runner.prompts", "runner.cells", "runner.engines", "runner.pair_engine", "runner.vllm"),
    ("runner.sweep", "runner.train"),
    ("runner.cli", "runner.serve", "runner.report", "runner.__main__", "dashboard", "bench"),
)
APART = (("runner.engine", "runner.store"), ("runner.sweep", "runner.train"), ("runner.engine.weights", "runner.store"),
         ("runner.engine.round", "runner.store"), ("runner.engine.drafters", "runner.store"),
         ("runner.pair_engine", "runner.vllm"))
# Another engine (vLLM's) needs none of our engine's torch-heavy code: not its pair, rounds or models.
NEVER = {"runner.vllm": ("runner.pair_engine", "runner.engine.pair", "runner.engine.round",
                         "runner.engine.weights.models")}


def modules(*packages: str) -> list[Path]:
    return sorted(p.relative_to(ROOT) for package in packages for p in (ROOT / package).rglob("*.py"))


def mapped() -> set[str]:
    """The files docs/architecture.md's table names: a row's first cell holds a path, then names in that folder."""
    named = set()
    for row in re.findall(r"^\| (.+?) \|", (ROOT / "docs" / "architecture.md").read_text(), flags=re.M):
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
    assert "runner/engine/drafters/registry.py" in mapped()


def layer(module: str) -> tuple[int, str] | None:
    """The layer of the longest name that holds the module."""
    found = [(level, name) for level, names in enumerate(LAYERS) for name in names
             if module == name or module.startswith(name + ".")]
    return max(found, key=lambda f: len(f[1])) if found else None


def imports(source: str) -> set[str]:
    """The project modules a source imports, lazily imported ones included (`from a import b`: a, and a.b)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {m for m in found if m.split(".")[0] in PACKAGES}


def name_of(path: Path) -> str:
    parts = path.with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def existing() -> set[str]:
    return {name_of(p) for p in modules(*PACKAGES)}


def against_the_grain(path: Path, source: str | None = None) -> list[str]:
    parts = path.with_suffix("").parts
    if parts[1:] == ("__init__",):  # a top-level package's own file: nothing to place
        return []
    me = name_of(path)
    own = layer(me)
    if own is None:
        return [f"{path}: in no layer"]
    known = existing()
    wrong = []
    for module in sorted(imports((ROOT / path).read_text() if source is None else source)):
        theirs = layer(module)
        if theirs is None or module not in known and module.rpartition(".")[0] in known:
            continue  # a name imported from a module, not a module
        never = NEVER.get(own[1], ())
        if theirs[0] > own[0] or tuple(sorted((own[1], theirs[1]))) in APART or any(
                module == n or module.startswith(n + ".") for n in never):
            wrong.append(f"{path} imports {module}")
    return wrong


def test_no_module_imports_against_the_grain():
    assert [line for path in modules(*PACKAGES) for line in against_the_grain(path)] == []


def test_the_grain_check_notices_an_import_from_above_or_beside():
    probe = Path("runner/train/probe.py")
    assert against_the_grain(probe, "from runner.sweep.plan import SweepConfig\nimport runner.cells\n") == [
        "runner/train/probe.py imports runner.sweep.plan"]
    assert against_the_grain(Path("runner/store/probe.py"),
                             "def f():\n    from runner.engine.weights import models\n") == [
        "runner/store/probe.py imports runner.engine.weights",
        "runner/store/probe.py imports runner.engine.weights.models"]
    assert against_the_grain(Path("runner/engine/round/probe.py"), "from runner.engine.pair import Pair\n") == [
        "runner/engine/round/probe.py imports runner.engine.pair"]


def test_another_engine_never_imports_ours():
    probe = Path("runner/vllm/probe.py")
    ok = "from runner.engines import Engine, Workload\nfrom runner.cells import Cell\nimport runner.prompts\n"
    assert against_the_grain(probe, ok) == []
    assert against_the_grain(probe, "from runner.engine.weights import models\nfrom runner import pair_engine\n") == [
        "runner/vllm/probe.py imports runner.engine.weights.models", "runner/vllm/probe.py imports runner.pair_engine"]


def graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """Module -> the project modules it imports anywhere in its file (at import time, in a function, or for types)."""
    known = set(sources)
    return {me: {m for m in imports(source) if m in known and m != me} for me, source in sources.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(root: str) -> None:
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))
            elif child not in index:
                index[child] = low[child] = counter[0]
                counter[0] += 1
                stack.append(child)
                on.add(child)
                work.append((child, iter(sorted(edges[child]))))
            elif child in on:
                low[node] = min(low[node], index[child])

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycles():
    sources = {name_of(p): (ROOT / p).read_text() for p in modules(*PACKAGES)}
    assert cycles(graph(sources)) == []


def test_the_cycle_check_notices_a_lazy_cycle():
    sources = {"runner.a": "import runner.b\n", "runner.b": "def f():\n    from runner.c import x\n",
               "runner.c": "from runner import a\n", "runner.d": "import runner.a\n"}
    assert cycles(graph(sources)) == [["runner.a", "runner.b", "runner.c"]]


def test_no_two_modules_share_a_file_name():
    names = Counter(p.name for p in modules(*PACKAGES) if p.name not in ("__init__.py", "__main__.py"))
    assert [name for name, count in names.items() if count > 1] == []


def test_the_longest_first_files_exist():
    from tests.conftest import LONGEST_FIRST, TESTS

    assert [name for name in LONGEST_FIRST if not (TESTS / name).is_file()] == []


def unresolved(source: str, known: set[str]) -> list[str]:
    """The project modules a source imports from (lazily included) that do not exist: a lazy import left behind by a
    move fails only when its line runs."""
    named = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            named.add(node.module)
        elif isinstance(node, ast.Import):
            named |= {alias.name for alias in node.names}
    return sorted(m for m in named if m.split(".")[0] in PACKAGES and m not in known)


def test_every_import_names_a_module_that_exists():
    known = existing()
    assert [f"{p}: {m}" for p in modules(*PACKAGES, "tests") for m in unresolved((ROOT / p).read_text(), known)] == []


def test_the_import_check_notices_a_module_moved_away():
    known = existing()
    assert unresolved("def f():\n    from runner.engine.models import dequantized\n", known) == ["runner.engine.models"]
    assert unresolved("from runner.engine.weights.models import dequantized\nimport runner.cells\n", known) == []
