"""Bad input on the command line: one clear line on stderr, exit code 2, nothing recorded or lost."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from runner.cli import app

LONG_PROMPT = "word " * 600  # the tiny test models have a 512-token context


def invoke(args: list[str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.stdout, result.stderr


def assert_one_line_error(code: int, stderr: str, expected: str) -> None:
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert expected in lines[0], lines[0]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--target", "/no/such/model"], "no such model directory: /no/such/model"),
        (["--target", "nobody/no-such-model"], "not in the local Hugging Face cache"),
        (["--target", "missing.gguf"], "no such GGUF file: missing.gguf"),
        (["--draft", "model:FOREIGN"], "use different tokenizers"),
        (["--k", "0"], "k must be between 1 and 64, got 0"),
        (["--k", "1000"], "k must be between 1 and 64, got 1000"),
        (["--mode", "sample", "--temperature", "-1"], "temperature must be >= 0, got -1.0"),
        (["--mode", "sample", "--temperature", "0"], "temperature 0 means greedy"),
        (["--top-p", "0"], "top-p must be in (0, 1], got 0.0"),
        (["--top-p", "1.5"], "top-p must be in (0, 1], got 1.5"),
        (["--mode", "beam"], 'unknown mode "beam"'),
        (["--draft", "medusa"], 'unknown draft "medusa"'),
        (["--draft", "layerskip:4"], "layerskip:L needs 1 <= L < 4"),
        (["--max-new-tokens", "0"], "max-new-tokens must be >= 1, got 0"),
        (["--prompt", "  "], "the prompt is empty"),
        (["--prompt", LONG_PROMPT], "exceeds the model's context of 512 tokens"),
        (["--device", "tpu"], 'unknown device "tpu"'),
        (["--dtype", "int3"], 'unknown dtype "int3"'),
    ],
)
def test_generate_refuses_bad_input(tiny_dir, foreign_dir, args, expected):
    args = [a.replace("FOREIGN", str(foreign_dir)) for a in args]
    base = ["generate", "--target", str(tiny_dir), "--prompt", "hello", "--max-new-tokens", "4"]
    code, _, stderr = invoke(base + args)
    assert_one_line_error(code, stderr, expected)


def cells(stdout: str, first: str) -> list[list[str]]:
    """The cells of the printed table rows whose first cell passes `first` (rich draws │ between cells)."""
    rows = [[c.strip() for c in line.strip("│ ").split("│")] for line in stdout.splitlines() if line.startswith("│")]
    return [row for row in rows if re.fullmatch(first, row[0])]


def test_generate_prints_a_summary_that_adds_up_the_printed_rounds(tiny_dir):
    code, stdout, stderr = invoke(["generate", "--target", str(tiny_dir), "--prompt", "hi", "--draft", "layerskip:3",
                                   "--k", "3", "--max-new-tokens", "24"])
    assert code == 0, stderr
    rounds = [[int(c) for c in row[:6]] for row in cells(stdout, r"\d+")]  # round, k, acc, rej, thrown, emitted
    summary = dict(row[:2] for row in cells(stdout, r"[^\d].*"))
    assert [r[0] for r in rounds] == list(range(len(rounds)))
    assert all(k == a + r + t for _, k, a, r, t, _ in rounds)
    accepted, rejected, thrown = (sum(r[i] for r in rounds) for i in (2, 3, 4))
    emitted = sum(r[5] for r in rounds)
    assert accepted > 0 and rejected > 0  # the layer-skip draft is sometimes right, sometimes not
    assert summary["rounds"] == str(len(rounds))
    assert summary["drafts accepted / rejected / thrown"] == f"{accepted} / {rejected} / {thrown}"
    assert summary["α (accepted / judged)"] == f"{accepted / (accepted + rejected):.3f}"
    assert summary["τ (tokens per round)"] == f"{emitted / len(rounds):.2f}"
    assert summary["tokens: speculative / baseline"] == f"{1 + emitted} / 24"  # 1: the prefill's token
    assert summary["tokens: speculative / baseline"] == "24 / 24"
    assert summary["lossless"] == "✓ identical to plain greedy"
    # The speedups from the printed figures, within their rounding.
    spec_s, base_s = (float(t.removesuffix(" s")) for t in summary["time: speculative / baseline"].split(" / "))
    low, high = (base_s - 0.005) / (spec_s + 0.005), (base_s + 0.005) / max(spec_s - 0.005, 1e-9)
    assert low - 0.005 <= float(summary["measured speedup"].removesuffix("×")) <= high + 0.005
    alpha, c = accepted / (accepted + rejected), float(summary["c (draft token / target pass)"])
    predicted = (1 - alpha ** 4) / ((1 - alpha) * (1 + 3 * c))  # Leviathan et al. at k = 3
    assert float(summary["formula's prediction"].removesuffix("×")) == pytest.approx(predicted, abs=0.01)


@pytest.fixture
def recorded(tmp_path: Path) -> Path:
    """A database with one recorded run, to prove a refused command leaves it as it was."""
    db = tmp_path / "runs.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute("CREATE TABLE keep AS SELECT 42 AS answer")
    return db


def _sweep(db: Path, *extra: str) -> tuple[int, str, str]:
    return invoke(["sweep", "--draft", "ngram", "--k", "2", "--db", str(db), *extra])


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--k", "1,x"], "--k must be comma-separated integers, got 1,x"),
        (["--k", "2,0"], "k must be between 1 and 64, got 0"),
        (["--categories", "poems"], 'unknown category "poems"; available: code, poem, summary'),
        (["--prompts-per-category", "0"], "per_category must be at least 1, got 0"),
        (["--draft", "none"], "every sweep records its baselines"),
        (["--mode", "sample", "--top-p", "0"], "top-p must be in (0, 1], got 0.0"),
        (["--max-new-tokens", "0"], "max-new-tokens must be >= 1, got 0"),
        (["--k-policy", "adaptive"], 'unknown k-policy "adaptive"'),
        (["--k-policy", "confidence:0.5"], 'k-policy "confidence:0.5" needs a draft with probabilities'),
    ],
)
def test_sweep_refuses_bad_options_before_touching_the_database(tmp_path, extra, expected):
    db = tmp_path / "runs.duckdb"
    code, _, stderr = _sweep(db, *extra)
    assert_one_line_error(code, stderr, expected)
    assert not db.exists()


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("", "prompts.jsonl: no prompts"),
        ('{"id": "a", "category": "code", "prompt": "x"}\n{"id": "b", "category": "code"}\n',
         'prompts.jsonl line 2: missing "prompt"'),
        ("not json\n", "prompts.jsonl line 1: not valid JSON"),
    ],
)
def test_sweep_refuses_bad_prompt_files(tmp_path, recorded, content, expected):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(content)
    code, _, stderr = _sweep(recorded, "--prompts", str(prompts))
    assert_one_line_error(code, stderr, expected)
    with duckdb.connect(str(recorded), read_only=True) as con:
        assert con.execute("SELECT answer FROM keep").fetchall() == [(42,)]
        assert [t for (t,) in con.execute("SHOW TABLES").fetchall()] == ["keep"]


def test_sweep_refuses_a_file_that_is_not_duckdb(tmp_path):
    db = tmp_path / "notes.duckdb"
    db.write_text("these are my notes\n")
    code, _, stderr = _sweep(db)
    assert_one_line_error(code, stderr, "not a specdash database")
    assert db.read_text() == "these are my notes\n"


def test_sweep_refuses_a_foreign_duckdb_database(recorded):
    code, _, stderr = _sweep(recorded)
    assert_one_line_error(code, stderr, "not a specdash database")


def test_sweep_refuses_a_database_from_a_newer_schema(tmp_path):
    db = tmp_path / "runs.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT, applied_at TIMESTAMP)")
        con.execute("INSERT INTO schema_migrations VALUES (99, 'from the future', now())")
    code, _, stderr = _sweep(db)
    assert_one_line_error(code, stderr, "has schema version 99, newer than this specdash")


def test_sweep_refuses_a_directory_it_cannot_write(tmp_path):
    code, _, stderr = _sweep(Path("/proc/runs.duckdb"))
    assert code == 2 and len(stderr.strip().splitlines()) == 1 and stderr.startswith("error: ")


def test_sweep_refuses_to_resume_an_unknown_sweep(tmp_path):
    code, _, stderr = _sweep(tmp_path / "runs.duckdb", "--resume", "20990101-000000-beef")
    assert_one_line_error(code, stderr, 'no sweep "20990101-000000-beef"')


def test_sql_refuses_writes_in_a_real_process(tmp_path, recorded):
    """The whole process, as a user runs it: exit code 2 and one line."""
    result = subprocess.run([sys.executable, "-m", "runner", "sql", "--db", str(recorded), "DROP TABLE keep"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: refused: only read statements (SELECT, WITH, VALUES, DESCRIBE, SHOW, EXPLAIN) are allowed"
    ]
    with duckdb.connect(str(recorded), read_only=True) as con:
        assert con.execute("SELECT answer FROM keep").fetchall() == [(42,)]


IMPORTS_OF = ("import sys; from runner.cli import loaded; loaded(sys.argv[1]); "
              "print(' '.join(m for m in ('torch', 'transformers') if m in sys.modules))")


@pytest.mark.parametrize(("command", "heavy"), [("sql", ""), ("list", ""), ("merge", ""), ("serve", ""),
                                                ("report", ""), ("sweep", "torch transformers")])
def test_a_command_over_recorded_files_imports_neither_torch_nor_transformers(command, heavy):
    """Only the group of the command that runs is imported; a decoding command is the control that needs both."""
    done = subprocess.run([sys.executable, "-c", IMPORTS_OF, command], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == heavy


def test_the_whole_command_line_lists_its_commands_in_the_groups_order():
    from runner.cli import GROUPS

    assert [c.name or c.callback.__name__ for c in app.registered_commands] + [
        g.name for g in app.registered_groups] == list(GROUPS)
