"""Bad input against a database that already holds a recorded sweep: one line, exit code 2, the file untouched.

tests/end_to_end/test_cli.py checks most messages against an absent or non-specdash file; here every case runs against a
real specdash database, which must stay byte-identical (no migration, no checkpoint, no WAL, no spill), and the
cases that reach the model loader run against an absent file too, which must stay absent.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import duckdb
import pytest
from rich.console import Console
from typer.testing import CliRunner

from runner.cli import app
from runner.engine.drafters.registry import parse_draft
from runner.engine.round.decoding_rule import Decoding
from runner.prompts import load_prompts
from runner.sweep.loop import run_sweep
from runner.sweep.plan import SweepConfig
from tests.helpers.reliability_helpers import write_prompts

BAD_PROMPT_FILES = {
    "empty.jsonl": "",
    "blank.jsonl": "\n\n   \n",
    "not-json.jsonl": "not json\n",
    "array.jsonl": '["code", "x"]\n',
    "no-prompt.jsonl": '{"id": "a", "category": "code"}\n',
    "huge.jsonl": json.dumps({"id": "huge", "category": "code", "prompt": "word " * 600}) + "\n",  # context: 512
}

# (what is wrong, extra sweep options, the message's telling part). Later options override the defaults.
SWEEP_CASES = [
    ("unknown model directory", ["--target", "/no/such/model"], "no such model directory: /no/such/model"),
    ("unknown repo id", ["--target", "nobody/no-such-model"], "not in the local Hugging Face cache"),
    ("mismatched tokenizers", ["--draft", "model:FOREIGN"], "use different tokenizers"),
    ("unknown draft", ["--draft", "medusa"], 'unknown draft "medusa"'),
    ("layer-skip deeper than the target", ["--draft", "layerskip:4"], "layerskip:L needs 1 <= L < 4"),
    ("k = 0", ["--k", "0"], "k must be between 1 and 64, got 0"),
    ("k = 1000", ["--k", "1000"], "k must be between 1 and 64, got 1000"),
    ("k not a number", ["--k", "1,x"], "--k must be comma-separated integers, got 1,x"),
    ("negative temperature", ["--mode", "sample", "--temperature", "-1"], "temperature must be >= 0, got -1.0"),
    ("top-p = 0", ["--mode", "sample", "--top-p", "0"], "top-p must be in (0, 1], got 0.0"),
    ("unknown mode", ["--mode", "beam"], 'unknown mode "beam"'),
    ("unknown device", ["--device", "tpu"], 'unknown device "tpu"'),
    ("max-new-tokens = 0", ["--max-new-tokens", "0"], "max-new-tokens must be >= 1, got 0"),
    ("unknown category", ["--categories", "poems"], 'unknown category "poems"'),
    ("empty prompts file", ["--prompts", "empty.jsonl"], "empty.jsonl: no prompts"),
    ("prompts file of blank lines", ["--prompts", "blank.jsonl"], "blank.jsonl: no prompts"),
    ("prompts file that is not JSON", ["--prompts", "not-json.jsonl"], "not-json.jsonl line 1: not valid JSON"),
    ("prompt that is not an object", ["--prompts", "array.jsonl"], "array.jsonl line 1: expected a JSON object"),
    ("prompt without its text", ["--prompts", "no-prompt.jsonl"], 'no-prompt.jsonl line 1: missing "prompt"'),
    ("missing prompts file", ["--prompts", "nowhere.jsonl"], "nowhere.jsonl: no such file"),
    ("prompt longer than the context", ["--prompts", "huge.jsonl"], "exceeds the model's context of 512"),
    ("resume of an unknown sweep", ["--resume", "20990101-000000-beef"], 'no sweep "20990101-000000-beef"'),
]
# The cases that pass option parsing and fail only once the models are loaded, after the database is opened.
LATE_CASES = ["unknown model directory", "unknown repo id", "mismatched tokenizers",
              "layer-skip deeper than the target", "unknown device", "prompt longer than the context"]


def assert_one_line_error(code: int, stderr: str, expected: str) -> None:
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert expected in lines[0], lines[0]


def state(folder: Path) -> dict[str, str]:
    """Every file in the database's folder with its digest: a refused command leaves it exactly so."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("inputs")
    for name, content in BAD_PROMPT_FILES.items():
        (folder / name).write_text(content)
    write_prompts(folder / "good.jsonl", 2)
    return folder


@pytest.fixture(scope="module")
def recorded(inputs: Path, tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A specdash database holding one real sweep (2 prompts × baseline + ngram k=1)."""
    db = tmp_path_factory.mktemp("recorded") / "runs.duckdb"
    config = SweepConfig(target=str(tiny_dir), drafts=(parse_draft("ngram"),), ks=(1,),
                         decodings=(Decoding("greedy", 0.0, 1.0),), prompts=tuple(load_prompts(inputs / "good.jsonl")),
                         max_new_tokens=4, seed=0, db=db, device=None, dtype=None)
    run_sweep(config, Console(quiet=True))
    return db


def sweep(db: Path, tiny_dir: Path, foreign_dir: Path, inputs: Path, extra: list[str]) -> tuple[int, str]:
    extra = [a.replace("FOREIGN", str(foreign_dir)) for a in extra]
    extra = [str(inputs / a) if a.endswith(".jsonl") else a for a in extra]
    args = ["sweep", "--target", str(tiny_dir), "--draft", "ngram", "--k", "2", "--max-new-tokens", "4",
            "--prompts", str(inputs / "good.jsonl"), "--db", str(db), *extra]
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.stderr


@pytest.mark.parametrize(("extra", "expected"), [case[1:] for case in SWEEP_CASES], ids=[c[0] for c in SWEEP_CASES])
def test_a_refused_sweep_leaves_a_recorded_database_byte_identical(recorded, tiny_dir, foreign_dir, inputs, tmp_path,
                                                                   extra, expected):
    db = tmp_path / "runs.duckdb"
    shutil.copy(recorded, db)
    before = state(tmp_path)
    code, stderr = sweep(db, tiny_dir, foreign_dir, inputs, extra)
    assert_one_line_error(code, stderr, expected)
    assert state(tmp_path) == before


@pytest.mark.parametrize("name", LATE_CASES)
def test_a_refused_sweep_creates_no_database(tiny_dir, foreign_dir, inputs, tmp_path, name):
    (extra, expected), = [case[1:] for case in SWEEP_CASES if case[0] == name]
    db = tmp_path / "runs.duckdb"
    code, stderr = sweep(db, tiny_dir, foreign_dir, inputs, extra)
    assert_one_line_error(code, stderr, expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "a refused sweep left a database behind"


def _newer(recorded: Path, folder: Path) -> Path:
    db = folder / "runs.duckdb"
    shutil.copy(recorded, db)
    with duckdb.connect(str(db)) as con:
        con.execute("INSERT INTO schema_migrations VALUES (99, 'from_the_future', now())")
    return db


def _parquet(recorded: Path, folder: Path) -> Path:
    db = folder / "runs.duckdb"  # named like a database, holding a Parquet export
    with duckdb.connect() as con:
        con.execute(f"COPY (SELECT 1 AS run_id) TO '{folder / 'runs.duckdb'}' (FORMAT parquet)")
    return db


def _directory(recorded: Path, folder: Path) -> Path:
    db = folder / "runs.duckdb"
    db.mkdir()
    return db


# (the file --db names, the command, the message's telling part)
DB_CASES = [
    ("newer schema", "sweep", "has schema version 99, newer than this specdash"),
    ("newer schema", "list", "has schema version 99, newer than this specdash"),
    ("newer schema", "resume", "has schema version 99, newer than this specdash"),
    ("parquet", "sweep", "is not a specdash database (not a DuckDB file)"),
    ("parquet", "list", "is not a specdash database (not a DuckDB file)"),
    ("parquet", "sql", "is not a specdash database (not a DuckDB file)"),
    ("directory", "sweep", "Is a directory"),
    ("directory", "list", "Is a directory"),
    ("directory", "sql", "no database at"),
]
MAKE_DB = {"newer schema": _newer, "parquet": _parquet, "directory": _directory}


@pytest.mark.parametrize(("kind", "command", "expected"), DB_CASES, ids=[f"{c[1]}-{c[0]}" for c in DB_CASES])
def test_a_file_that_is_not_a_usable_database_is_refused_and_kept(recorded, tiny_dir, tmp_path, kind, command,
                                                                   expected):
    db = MAKE_DB[kind](recorded, tmp_path)
    before = state(tmp_path)
    args = {"sweep": ["sweep", "--target", str(tiny_dir), "--draft", "ngram", "--k", "2", "--db", str(db)],
            "resume": ["sweep", "--target", str(tiny_dir), "--draft", "ngram", "--db", str(db), "--resume", "x"],
            "list": ["list", "--db", str(db)],
            "sql": ["sql", "--db", str(db), "SELECT count(*) FROM runs"]}[command]
    result = CliRunner().invoke(app, args)
    assert_one_line_error(result.exit_code, result.stderr, expected)
    assert state(tmp_path) == before


@pytest.mark.parametrize("command", ["sweep", "sql"])
def test_a_database_in_a_directory_nobody_can_write_is_refused(tiny_dir, command):
    db = Path("/proc/specdash-runs.duckdb")  # root ignores chmod; /proc refuses new files even to root
    args = {"sweep": ["sweep", "--target", str(tiny_dir), "--draft", "ngram", "--k", "2", "--db", str(db)],
            "sql": ["sql", "--db", str(db), "SELECT 1"]}[command]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith("error: ") and str(db) in result.stderr
    assert not db.exists()
