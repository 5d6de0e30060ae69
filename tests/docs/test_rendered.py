"""Every measured table in the docs is what `runner report docs` renders from the shipped runs.duckdb: rendering
again changes nothing, a stale figure is caught, and a rendered figure equals the same number worked out by hand."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
from typer.testing import CliRunner

from runner.cli import app
from runner.store import doc_tables

ROOT = Path(__file__).resolve().parents[2]
DB = ROOT / "runs.duckdb"
DOCS = ROOT / "docs"
SWEEPS = ROOT / "bench" / "results" / "shipped-sweeps.txt"


def _shipped(tmp_path: Path) -> Path:
    """A copy of the shipped file, so that nothing here touches the repository's."""
    shutil.copy(DB, tmp_path / "runs.duckdb")
    return tmp_path / "runs.duckdb"


def test_the_docs_say_what_the_shipped_file_holds(tmp_path):
    db = _shipped(tmp_path)
    result = CliRunner().invoke(app, ["report", "docs", "--db", str(db), "--docs", str(DOCS), "--sweeps", str(SWEEPS),
                                      "--check"])
    assert result.exit_code == 0, f"run `python -m runner report docs`:\n{result.output}"


def test_a_stale_figure_is_caught_and_rendered_again(tmp_path):
    db = _shipped(tmp_path)
    docs = tmp_path / "docs"
    shutil.copytree(DOCS, docs)
    page = docs / "drafters.md"
    text = page.read_text()
    stale = re.sub(r"\| (\d+\.\d\d)× \|", "| 9.99× |", text, count=1)
    assert stale != text
    page.write_text(stale)
    args = ["report", "docs", "--db", str(db), "--docs", str(docs), "--sweeps", str(SWEEPS)]
    checked = CliRunner().invoke(app, [*args, "--check"])
    assert checked.exit_code == 1 and "drafters.md: stale" in checked.output
    assert CliRunner().invoke(app, args).exit_code == 0
    assert page.read_text() == text


def test_every_marked_table_is_a_known_one_and_every_table_is_shown():
    names = [name for page in DOCS.rglob("*.md")
             for name in re.findall(r"<!-- render:([a-z0-9-]+) -->", page.read_text())]
    assert sorted(set(names)) == sorted(doc_tables.TABLES)


def test_an_unknown_table_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "page.md").write_text("<!-- render:nothing -->\n<!-- /render:nothing -->\n")
    result = CliRunner().invoke(app, ["report", "docs", "--db", str(_shipped(tmp_path)), "--docs", str(tmp_path)])
    assert result.exit_code == 2 and "unknown table" in result.output


def test_a_rendered_speedup_is_the_geometric_mean_worked_out_by_hand():
    """Prompt lookup at k = 4 on summaries: every greedy fixed-k batch-1 run of it ran the four prompts that every
    compared cell ran, so its figure is the plain geometric mean of those runs' own speedups, each worked out from
    the runs table (baseline seconds per token over the run's)."""
    con = duckdb.connect(str(DB), read_only=True)
    rows = con.execute("""
        SELECT (b.wall_s / b.new_tokens) / (r.wall_s / r.new_tokens) FROM runs r JOIN runs b
            ON b.run_id = r.baseline_run_id
        WHERE r.draft = 'ngram' AND r.k = 4 AND r.category = 'summary' AND r.mode = 'greedy'
            AND r.k_policy = 'fixed' AND coalesce(r.batch_size, 1) = 1 AND r.kernels = 'skinny'
            AND r.status = 'ok'""").fetchall()
    con.close()
    assert len(rows) > 1
    by_hand = math.exp(sum(math.log(s) for (s,) in rows) / len(rows))
    table = (DOCS / "drafters.md").read_text()
    greedy = table[table.index("<!-- render:best-greedy -->"):table.index("<!-- /render:best-greedy -->")]
    row = next(line for line in greedy.splitlines() if line.startswith("| summary | `ngram` |"))
    assert row.split(" | ")[2] == "4"
    assert row.split(" | ")[5] == f"{by_hand:.2f}×"


def test_the_command_runs_without_torch_in_a_real_process(tmp_path):
    """As a user runs it: the check passes on the shipped file, and neither torch nor transformers is imported."""
    script = ("import sys\nfrom runner.cli import main\nsys.argv = ['runner', *sys.argv[1:]]\ntry:\n    main()\n"
              "except SystemExit as exit:\n    print(exit.code, 'torch' in sys.modules, 'transformers' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script, "report", "docs", "--db", str(_shipped(tmp_path)), "--docs",
                           str(DOCS), "--sweeps", str(SWEEPS), "--check"], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert done.stdout.split()[-3:] == ["0", "False", "False"], done.stderr


def _a_later_sweep(db: Path) -> None:
    """A copy of the first shipped sweep under a new id, every run twice as slow: what `make run` adds to the file."""
    con = duckdb.connect(str(db))
    new_id = "'later-' || run_id"
    con.execute(f"""INSERT INTO runs SELECT * REPLACE ({new_id} AS run_id, 'later' AS sweep_id, 2 * wall_s AS wall_s,
        CASE WHEN baseline_run_id IS NOT NULL THEN 'later-' || baseline_run_id END AS baseline_run_id)
        FROM runs WHERE sweep_id = (SELECT min(sweep_id) FROM runs)""")
    for table in ("rounds", "run_totals", "round_counts", "run_facts"):
        con.execute(f"INSERT INTO {table} SELECT * REPLACE ({new_id} AS run_id) FROM {table} "
                    "WHERE run_id IN (SELECT substr(run_id, 7) FROM runs WHERE sweep_id = 'later')")
    con.execute("UPDATE run_facts SET sweep_id = 'later' WHERE run_id LIKE 'later-%'")
    con.close()


def test_a_sweep_recorded_later_leaves_the_docs_as_they_are(tmp_path):
    db = _shipped(tmp_path)
    _a_later_sweep(db)
    args = ["report", "docs", "--db", str(db), "--docs", str(DOCS), "--check"]
    assert CliRunner().invoke(app, [*args, "--sweeps", str(SWEEPS)]).exit_code == 0
    every_sweep = CliRunner().invoke(app, [*args, "--sweeps", str(tmp_path / "no-list.txt")])
    assert every_sweep.exit_code == 1 and "getting-started.md: stale" in every_sweep.output


def test_a_listed_sweep_missing_from_the_file_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "sweeps.txt").write_text("20990101-000000-beef\n")
    result = CliRunner().invoke(app, ["report", "docs", "--db", str(_shipped(tmp_path)), "--docs", str(DOCS),
                                      "--sweeps", str(tmp_path / "sweeps.txt"), "--check"])
    assert result.exit_code == 2 and "sweep 20990101-000000-beef is listed but not in the file" in result.output
