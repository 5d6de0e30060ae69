"""`runner merge`: runs, their rounds and benchmarks from other databases, by run_id and bench_id, once."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from dashboard import filter_queries, queries
from runner.cli import app
from runner.store import run_facts
from runner.store.connect import init_db
from runner.store.schema import SCHEMA_VERSION, migrate
from tests.helpers.dashboard_fixtures import add_benches, build

TABLES = ("runs", "rounds", "run_totals", "round_counts", "run_facts", "bench_results", "trainings",
          "training_epochs", "training_positions")
PER_RUN = ("runs", "rounds", "run_totals", "round_counts", "run_facts")


def counts(db: Path) -> dict[str, int]:
    with duckdb.connect(str(db), read_only=True) as con:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}


def merge(*args: str | Path) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["merge", *map(str, args)])
    return result.exit_code, result.stdout, result.stderr


def recorded_elsewhere(db: Path, prefix: str, host: str, sweep: str) -> Path:
    """The fixture database as another machine would have recorded it: its own run ids, host and sweep."""
    build(db)
    with duckdb.connect(str(db)) as con:
        for table in ("rounds", "run_totals", "round_counts"):
            con.execute(f"UPDATE {table} SET run_id = ? || run_id", [prefix])
        con.execute("UPDATE runs SET run_id = ? || run_id, baseline_run_id = ? || baseline_run_id, host = ?, "
                    "sweep_id = ?", [prefix, prefix, host, sweep])
        run_facts.refresh_all(con)
    return db


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The two source databases, made once for the module (each test merges copies of them)."""
    folder = tmp_path_factory.mktemp("sources")
    a = add_benches(recorded_elsewhere(folder / "a.duckdb", "a-", "host-a", "sweep-a"))  # benches b-old, b-new
    b = recorded_elsewhere(folder / "b.duckdb", "b-", "host-b", "sweep-b")
    add_benches(b)
    with duckdb.connect(str(b)) as con:  # b holds b-new (also in a) and b-later, its own
        con.execute("DELETE FROM bench_results WHERE bench_id = 'b-old'")
        con.execute("UPDATE bench_results SET bench_id = 'b-later' WHERE metric = 'verify_ms'")
        # and one draft-head training: its row, two epochs, two positions of each
        con.execute("INSERT INTO trainings (train_id, status, draft) VALUES ('t-b', 'ok', 'eagle:heads/x')")
        con.execute("INSERT INTO training_epochs (train_id, epoch) VALUES ('t-b', 0), ('t-b', 1)")
        con.execute("INSERT INTO training_positions (train_id, epoch, position, judged, accepted) "
                    "VALUES ('t-b', 0, 1, 10, 2), ('t-b', 0, 2, 2, 0), "
                    "('t-b', 1, 1, 10, 6), ('t-b', 1, 2, 6, 3)")
    return a, b


@pytest.fixture
def sources(recorded: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    """This test's own copies of the source databases: a test may write to them."""
    return tuple(Path(shutil.copyfile(path, tmp_path / path.name)) for path in recorded)


def test_merge_adds_every_run_once_and_its_counts_add_up(sources, tmp_path):
    a, b = sources
    into = tmp_path / "all.duckdb"
    code, out, err = merge(a, b, "--into", into)
    assert code == 0, err
    assert counts(into) == {t: counts(a)[t] + counts(b)[t] for t in PER_RUN} | {
        "bench_results": counts(a)["bench_results"] + 4,  # b-later's 4 rows; b-new was in a already
        "trainings": 1, "training_epochs": 2, "training_positions": 4}
    assert counts(a)["runs"] == 13 and counts(a)["rounds"] > 13
    assert out.splitlines() == [
        f"{a}: +13 runs (1 sweeps), +{counts(a)['round_counts']} round_counts, +{counts(a)['rounds']} rounds, "
        "+12 run_facts, +12 run_totals, +2 benchmarks, "
        "+0 trainings; 0 runs already there",
        f"{b}: +13 runs (1 sweeps), +{counts(b)['round_counts']} round_counts, +{counts(b)['rounds']} rounds, "
        "+12 run_facts, +12 run_totals, +1 benchmarks, "
        "+1 trainings; 0 runs already there",
    ]
    merged = counts(into)
    code, out, _ = merge(b, a, "--into", into)  # again, in the other order: nothing new
    assert code == 0 and counts(into) == merged
    assert out.splitlines()[0] == f"{b}: +0 runs (0 sweeps), +0 round_counts, +0 rounds, +0 run_facts, " \
                                  "+0 run_totals, +0 benchmarks, +0 trainings; 13 runs already there"


def test_merged_runs_keep_their_rows_and_the_dashboard_filters_them_by_host(sources, tmp_path):
    a, b = sources
    into = tmp_path / "all.duckdb"
    assert merge(a, b, "--into", into)[0] == 0
    with duckdb.connect(str(into), read_only=True) as merged, duckdb.connect(str(b), read_only=True) as source:
        for table in PER_RUN:
            ours = merged.execute(f"SELECT * FROM {table} WHERE run_id LIKE 'b-%' ORDER BY ALL").fetchall()
            assert ours == source.execute(f"SELECT * FROM {table} ORDER BY ALL").fetchall()
    picked = queries.read(into, queries.runs, queries.Filters(host=("host-b",)), 100)
    assert sorted(picked["run_id"]) == sorted(f"b-{run_id}" for run_id in (
        "c1-ng-k2", "c1-ng-k4", "c2-ng-k2", "c1-ls-k2", "c1-ls-k4", "p1-ng-k2", "p1-ng-k4", "p1-ls-k2", "p1-ls-k4"))
    assert queries.read(into, filter_queries.filter_options)["host"] == ["host-a", "host-b"]


def test_an_older_file_is_upgraded_on_a_copy_and_merged(sources, tmp_path):
    a, _ = sources
    old = tmp_path / "old.duckdb"
    with duckdb.connect(str(old)) as con:
        migrate(con, to_version=4)  # before run_totals and concurrent_workers existed
        con.execute(f"ATTACH '{a}' AS a (READ_ONLY)")
        con.execute("INSERT INTO runs BY NAME SELECT * EXCLUDE (concurrent_workers, divergence_at, divergence_gap, "
                    "divergence_tolerance, divergence, kernels, threads, k_policy, turn, conversation, batch_size, "
                    "batch_slot, batch_id, tree_nodes, repeat, engine, engine_version, engine_config, engine_report, "
                    "ttft_s) "
                    "REPLACE ('old-' || run_id AS run_id) FROM a.runs")
        con.execute("INSERT INTO rounds BY NAME SELECT * EXCLUDE (draft_parents, accepted_path, depth, draft_p, "
                    "draft_q, draft_u, from_residual, batch_seqs, pass_rows) "
                    "REPLACE ('old-' || run_id AS run_id) FROM a.rounds")
    before = old.read_bytes()
    into = tmp_path / "all.duckdb"
    code, out, err = merge(old, "--into", into)
    assert code == 0, err
    assert old.read_bytes() == before  # upgraded on a copy, never in place
    with duckdb.connect(str(into), read_only=True) as con:
        con.execute(f"ATTACH '{a}' AS a (READ_ONLY)")
        # run_totals and round_counts, which the old file lacked, equal those write_run wrote for the same runs in a
        for table in ("run_totals", "round_counts"):
            assert con.execute(f"SELECT * REPLACE (substr(run_id, 5) AS run_id) FROM {table} ORDER BY ALL").fetchall() \
                == con.execute(f"SELECT * FROM a.{table} ORDER BY ALL").fetchall()
        assert con.execute("SELECT DISTINCT concurrent_workers FROM runs").fetchall() == [(1,)]
        assert con.execute("SELECT max(version) FROM schema_migrations").fetchone()[0] == SCHEMA_VERSION


def _newer(path: Path) -> Path:
    init_db(path)
    with duckdb.connect(str(path)) as con:
        con.execute("INSERT INTO schema_migrations VALUES (?, 'from the future', now())", [SCHEMA_VERSION + 1])
    return path


def _foreign(path: Path) -> Path:
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE measurements (x INTEGER)")
    return path


def _text(path: Path) -> Path:
    path.write_text("run_id,sweep_id\nx,y\n")
    return path


@pytest.mark.parametrize(("make", "expected"), [
    (_newer, "newer than this specdash"),
    (_foreign, "is not a specdash database"),
    (_text, "not a DuckDB file"),
    (lambda path: path, "does not exist"),
])
def test_a_bad_source_exits_2_and_merges_nothing(sources, tmp_path, make, expected):
    a, b = sources
    into = tmp_path / "all.duckdb"
    assert merge(a, "--into", into)[0] == 0
    before = into.read_bytes()
    bad = make(tmp_path / "bad.duckdb")
    code, out, err = merge(b, bad, "--into", into)  # b first: it must not be merged either
    assert code == 2 and out == ""
    assert err.startswith("error: ") and expected in err and len(err.strip().splitlines()) == 1, err
    assert into.read_bytes() == before
    code, _, _ = merge(bad, "--into", tmp_path / "absent.duckdb")
    assert code == 2 and not (tmp_path / "absent.duckdb").exists()


def test_merging_a_file_into_itself_is_refused(sources):
    a, _ = sources
    before = a.read_bytes()
    code, _, err = merge(a, "--into", a)
    assert code == 2 and err.strip() == f"error: {a} is the database merged into"
    assert a.read_bytes() == before
