"""The store: exact schema, migrations, hand-computed run_stats, atomic writes, locks and spills."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import duckdb
import pytest

from runner.records import Generation, Round, RunRecord
from runner.store import connect, run_facts
from runner.store.connect import init_db
from runner.store.pending import record_from_dict, record_to_dict, spill
from runner.store.round_counts import FILL_RUN_TOTALS
from runner.store.runs import (
    baseline_for,
    count_columns,
    flush_pending,
    list_sweeps,
    recorded_runs,
    round_columns,
    run_row,
    totals_row,
    write_run,
)
from runner.store.schema import SCHEMA_VERSION, StoreError, migrate
from tests.helpers.catalog import catalog, differences

REPO = Path(__file__).resolve().parents[2]


def baseline_round(token: int) -> Round:
    # Plain decoding: one 1-token target pass per round, nothing drafted.
    return Round(0, 0, 0, 0, False, 1, 0.0, 0.05, (), (token,))


def record(run_id: str, rounds: tuple[Round, ...], wall_s: float, k: int | None = 4, draft: str = "ngram",
           baseline_run_id: str | None = "base", sweep_id: str = "s1", seed: int = 0) -> RunRecord:
    gen = Generation(prompt_tokens=(1, 2, 3), output_tokens=tuple(range(10, 20)), rounds=rounds,
                     prefill_s=0.1, wall_s=wall_s, draft_calls=len(rounds), stop_reason="max_new_tokens")
    return RunRecord(
        run_id=run_id, sweep_id=sweep_id, started_at="2025-03-01T12:00:00+00:00", target="smollm2",
        draft=draft, draft_kind="baseline" if draft == "none" else "ngram", category="code", prompt_id="p1",
        prompt_text="def f():", k=k, mode="greedy", temperature=0.0, top_p=1.0, seed=seed, max_new_tokens=10,
        device="cpu", dtype="float32", status="ok", error=None, generation=gen, output_text="x",
        baseline_run_id=baseline_run_id, lossless=None if draft == "none" else True, kernels="skinny", threads=2,
        k_policy=None if draft == "none" else "fixed",
        provenance={"torch_version": "2.13.0", "host": "h1", "git_commit": "abc"})


BASELINE = record("base", tuple(baseline_round(t) for t in range(10, 20)), wall_s=0.6, k=None, draft="none",
                  baseline_run_id=None)
# k=4: Σaccepted 7, Σrejected 2, Σthrown 3, emitted 5+2+3 = 10 tokens; 3 × 4 ms of drafting.
SPEC = record("spec", (
    Round(4, 4, 0, 0, True, 5, 0.004, 0.06, (10, 11, 12, 13), (10, 11, 12, 13, 14)),
    Round(4, 1, 1, 2, False, 2, 0.004, 0.06, (15, 9, 9, 9), (15, 16, 0, 0, 0)),
    Round(4, 2, 1, 1, False, 3, 0.004, 0.06, (17, 18, 9, 9), (17, 18, 19, 0, 0)),
), wall_s=0.3)


# A tree round: root → 20, 21; 20 → 22; 21 → 23, 24. The target took 21 then 24 (a leaf: the bonus 25); 20, 22, 23
# thrown. Greedy target_tokens: the argmax at the root and each node.
TREE = record("tree", (
    Round(5, 2, 0, 3, True, 3, 0.004, 0.06, (20, 21, 22, 23, 24), (21, 7, 24, 7, 7, 25), (-1, -1, 0, 1, 1), (1, 4)),
    Round(4, 3, 1, 0, False, 4, 0.004, 0.06, (26, 27, 28, 29), (26, 27, 28, 30, 31)),  # a chain in the same run
), wall_s=0.3, draft="ngram-tree")


def many_rounds(run_id: str, n: int) -> RunRecord:
    return record(run_id, tuple(Round(4, 2, 1, 1, False, 3, 0.001, 0.01, (1, 2, 3, 4), (1, 2, 5, 0, 0))
                                for _ in range(n)), wall_s=1.0)


def query(db: Path, sql: str, params: list | None = None) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, params or []).fetchall()
    finally:
        con.close()


def columns(db: Path, table: str) -> list[tuple[str, str]]:
    return query(db, "SELECT column_name, data_type FROM information_schema.columns "
                     "WHERE table_name = ? ORDER BY ordinal_position", [table])


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "runs.duckdb"


def test_runs_and_rounds_have_the_documented_columns(db):
    init_db(db)
    text, i, f, ints = "VARCHAR", "INTEGER", "DOUBLE", "INTEGER[]"
    assert columns(db, "runs") == [
        ("run_id", text), ("sweep_id", text), ("started_at", "TIMESTAMP"), ("target", text), ("draft", text),
        ("draft_kind", text), ("category", text), ("prompt_id", text), ("prompt_text", text), ("k", i),
        ("mode", text), ("temperature", f), ("top_p", f), ("seed", "BIGINT"), ("max_new_tokens", i),
        ("device", text), ("dtype", text), ("new_tokens", i), ("n_rounds", i), ("target_passes", i),
        ("draft_calls", i), ("wall_s", f), ("prefill_s", f), ("draft_s", f), ("verify_s", f),
        ("prompt_tokens", ints), ("output_tokens", ints), ("output_text", text), ("stop_reason", text),
        ("baseline_run_id", text), ("lossless", "BOOLEAN"), ("status", text), ("error", text),
        ("torch_version", text), ("transformers_version", text), ("python_version", text), ("host", text),
        ("git_commit", text), ("device_name", text), ("divergence_at", i), ("divergence_gap", f),
        ("divergence_tolerance", f), ("divergence", text), ("kernels", text), ("threads", i), ("concurrent_workers", i),
        ("k_policy", text), ("turn", i), ("conversation", text), ("batch_size", i), ("batch_slot", i),
        ("batch_id", text), ("tree_nodes", i), ("engine", text), ("engine_version", text),
        ("engine_config", text), ("engine_report", text), ("ttft_s", f), ("repeat", i)]
    assert columns(db, "rounds") == [
        ("run_id", text), ("round", i), ("k", i), ("accepted", i), ("rejected", i), ("thrown", i),
        ("bonus", "BOOLEAN"), ("emitted", i), ("draft_s", f), ("verify_s", f), ("draft_tokens", ints),
        ("target_tokens", ints), ("draft_parents", ints), ("accepted_path", ints), ("depth", i),
        ("draft_p", "DOUBLE[]"), ("draft_q", "DOUBLE[]"), ("draft_u", "DOUBLE[]"), ("from_residual", "BOOLEAN"),
        ("batch_seqs", i), ("pass_rows", i)]
    assert [name for name, _ in columns(db, "run_stats")] == [
        "run_id", "sweep_id", "target", "draft", "draft_kind", "category", "prompt_id", "k", "mode",
        "temperature", "top_p", "seed", "device", "dtype", "new_tokens", "n_rounds", "accepted", "rejected",
        "thrown", "drafted", "alpha", "tau", "thrown_share", "tokens_per_s", "baseline_tokens_per_s",
        "measured_speedup", "target_pass_s", "verify_pass_s", "draft_token_s", "c", "theoretical_speedup",
        "lossless", "divergence", "kernels", "threads", "k_policy", "batch_size", "engine",
            "engine_version", "ttft_s"]
    assert [name for name, _ in columns(db, "run_facts")] == [
        *(name for name, _ in columns(db, "run_stats")), "wall_s", "prefill_s", "draft_s",
        "verify_s", "drafting_rounds", "tree", "widths", "outcomes"]
    assert query(db, "SELECT version, name FROM schema_migrations ORDER BY version") == [
        (1, "create_runs_and_rounds"), (2, "create_run_stats"), (3, "add_device_name"), (4, "create_bench_results"),
        (5, "create_run_totals"), (6, "add_divergence"), (7, "add_kernels_and_threads"), (8, "define_metrics"),
        (9, "create_trainings"), (10, "add_concurrent_workers"), (11, "add_k_policy"), (12, "create_position_stats"),
        (13, "add_bench_k_policy"), (14, "add_tree_columns"), (15, "add_depth"), (16, "add_turns"),
        (17, "add_training_categories"), (18, "add_sampling_test"), (19, "add_batches"), (20, "count_rounds"),
        (21, "create_run_facts"), (22, "add_tree_nodes"), (23, "add_pass_rows"),
            (24, "add_learn_context"), (25, "add_engines"), (26, "add_repeat"),
            (27, "create_comparable_runs")]


@pytest.mark.parametrize("table, row", [("runs", run_row), ("rounds", round_columns), ("run_totals", totals_row),
                                        ("round_counts", count_columns)])
def test_a_run_is_written_by_the_schemas_column_names(db, table, row):
    init_db(db)
    assert sorted(row(SPEC)) == sorted(name for name, _ in columns(db, table))  # every column, no other name


def test_each_field_lands_in_its_own_column(db):
    # Distinct values in neighbouring fields: a value written under the wrong name would show in one of them.
    run = replace(SPEC, kernels="stock", threads=3, concurrent_workers=5, k_policy="auto", divergence_at=7,
                  divergence_gap=0.25, divergence_tolerance=0.5, divergence="tie", lossless=False,
                  provenance={"torch_version": "t", "transformers_version": "tf", "python_version": "py",
                              "host": "h", "git_commit": "g", "device_name": "d"})
    write_run(db, run)
    assert query(db, "SELECT kernels, threads, concurrent_workers, k_policy, divergence_at, divergence_gap, "
                     "divergence_tolerance, divergence, lossless, torch_version, transformers_version, "
                     "python_version, host, git_commit, device_name, prefill_s, wall_s, stop_reason FROM runs") == [
        ("stock", 3, 5, "auto", 7, 0.25, 0.5, "tie", False, "t", "tf", "py", "h", "g", "d", 0.1, 0.3,
         "max_new_tokens")]
    assert query(db, "SELECT round, k, accepted, rejected, thrown, bonus, emitted, draft_s, verify_s FROM rounds "
                     "ORDER BY round") == [(0, 4, 4, 0, 0, True, 5, 0.004, 0.06),
                                           (1, 4, 1, 1, 2, False, 2, 0.004, 0.06),
                                           (2, 4, 2, 1, 1, False, 3, 0.004, 0.06)]
    assert query(db, "SELECT accepted, rejected, thrown, drafted, emitted FROM run_totals") == [(7, 2, 3, 12, 10)]


def schema_differences(old: Path, fresh: Path) -> list[tuple]:
    with duckdb.connect(str(old), read_only=True) as one, duckdb.connect(str(fresh), read_only=True) as other:
        return differences(catalog(one), catalog(other))


@pytest.mark.parametrize("start", range(SCHEMA_VERSION))
def test_migrating_from_every_older_version_ends_identical(tmp_path, start):
    fresh, old = tmp_path / "fresh.duckdb", tmp_path / "old.duckdb"
    init_db(fresh)
    con = duckdb.connect(str(old))
    migrate(con, to_version=start)
    if start >= 1:  # data written under the old schema (v1 columns only) survives and shows in the new view
        con.execute("INSERT INTO runs (run_id, sweep_id, draft, status, new_tokens, n_rounds, wall_s) "
                    "VALUES ('base', 's1', 'none', 'ok', 1, 1, 0.1)")
        con.execute("INSERT INTO runs (run_id, sweep_id, draft, k, status, new_tokens, n_rounds, wall_s, "
                    "baseline_run_id) VALUES ('spec', 's1', 'ngram', 2, 'ok', 4, 2, 0.1, 'base')")
        con.execute("INSERT INTO rounds (run_id, round, k, accepted, rejected, thrown, bonus, emitted) "
                    "VALUES ('base', 0, 0, 0, 0, 0, true, 1), ('spec', 0, 2, 2, 0, 0, true, 3), "
                    "('spec', 1, 2, 0, 1, 1, false, 1)")
        if start >= 5:  # from version 5 on, a writer records each run's totals with its rounds
            con.execute(FILL_RUN_TOTALS)
        if start >= 7:  # from version 7 on, a writer records the kernels it ran on
            con.execute("UPDATE runs SET kernels = 'stock'")
        if start >= 23:  # from version 23 on, no migration works run_facts out again: a writer keeps it
            run_facts.refresh_all(con)
    migrate(con)
    migrate(con)  # a second run finds nothing to do
    con.close()
    assert schema_differences(old, fresh) == []
    if start >= 1:
        # Runs recorded before kernels were recorded ran stock F.linear, on a thread count nobody wrote down.
        assert query(old, "SELECT run_id, accepted, rejected, thrown, drafted, alpha, tau, kernels, threads "
                          "FROM run_stats ORDER BY run_id") == [("base", 0, 0, 0, 0, None, 1.0, "stock", None),
                                                               ("spec", 2, 1, 1, 4, 2 / 3, 2.0, "stock", None)]


def test_rounds_from_before_depth_was_recorded_get_it_from_their_shape(tmp_path):
    db = tmp_path / "old.duckdb"
    con = duckdb.connect(str(db))
    migrate(con, to_version=14)
    con.execute("INSERT INTO runs (run_id, sweep_id, draft, k, status) VALUES ('t', 's1', 'ngram-tree', 3, 'ok')")
    con.execute("INSERT INTO rounds (run_id, round, k, accepted, rejected, thrown, bonus, emitted, draft_parents) "
                "VALUES ('t', 0, 3, 1, 1, 1, false, 2, NULL), ('t', 1, 4, 0, 1, 3, false, 1, [-1, 0, -1, 2]), "
                "('t', 2, 5, 2, 1, 2, false, 3, [-1, -1, 1, 2, 3])")
    migrate(con)
    # a chain's depth is its k; a tree's is its longest branch: 0-1 and 2-3 are 2 deep, 1-2-3-4 is 4 deep
    assert con.execute("SELECT depth FROM rounds ORDER BY round").fetchall() == [(3,), (2,), (4,)]


def test_bench_rows_from_before_policies_drafted_a_fixed_k_and_keep_their_order(tmp_path):
    db = tmp_path / "old.duckdb"
    con = duckdb.connect(str(db))
    migrate(con, to_version=12)
    for metric in ("spec_tokens_per_s", "plain_tokens_per_s", "speedup"):  # not in the key's order
        con.execute("INSERT INTO bench_results (bench_id, draft, k, category, metric, ours, kernels) "
                    "VALUES ('b1', 'ngram', 4, 'all', ?, 1.0, 'skinny')", [metric])
    migrate(con)
    assert con.execute("SELECT metric, k_policy, kernels FROM bench_results ORDER BY rowid").fetchall() == [
        ("spec_tokens_per_s", "fixed", "skinny"), ("plain_tokens_per_s", "fixed", "skinny"),
        ("speedup", "fixed", "skinny")]
    # The same draft, k and category under another policy is another row; under the same policy it is refused.
    insert = ("INSERT INTO bench_results (bench_id, draft, k, category, metric, k_policy) "
              "VALUES ('b1', 'ngram', 4, 'all', 'spec_tokens_per_s', ?)")
    con.execute(insert, ["heuristic"])
    with pytest.raises(duckdb.ConstraintException):
        con.execute(insert, ["fixed"])
    con.close()


# run_stats as specdash wrote it into every file before the metric macros (schema versions 5 to 7).
LEGACY_RUN_STATS = """CREATE VIEW run_stats AS
    WITH per_run AS (SELECT t.run_id, t.accepted::BIGINT AS accepted, t.rejected::BIGINT AS rejected,
               t.thrown::BIGINT AS thrown, t.drafted::BIGINT AS drafted, t.emitted / r.n_rounds AS tau
        FROM run_totals t JOIN runs r USING (run_id)),
    measured AS (
        SELECT r.*, a.accepted, a.rejected, a.thrown, a.drafted, a.tau,
               a.accepted / nullif(a.accepted + a.rejected, 0) AS alpha
        FROM runs r LEFT JOIN per_run a USING (run_id) WHERE r.status = 'ok')
    SELECT run_id, alpha, tau FROM measured"""


def test_a_file_from_before_the_metric_macros_gets_them_and_the_new_view(tmp_path):
    fresh, old = tmp_path / "fresh.duckdb", tmp_path / "old.duckdb"
    init_db(fresh)
    con = duckdb.connect(str(old))
    migrate(con, to_version=7)
    con.execute(LEGACY_RUN_STATS)
    con.execute("INSERT INTO runs (run_id, sweep_id, draft, k, status, new_tokens, n_rounds, wall_s) "
                "VALUES ('spec', 's1', 'ngram', 2, 'ok', 4, 2, 0.1)")
    con.execute("INSERT INTO run_totals VALUES ('spec', 2, 1, 1, 4, 3)")
    migrate(con)
    con.close()
    assert schema_differences(old, fresh) == []
    # α = 2 / (2 + 1), τ = 3 emitted over 2 rounds, thrown share 1 of 4 drafted
    assert query(old, "SELECT alpha, tau, thrown_share FROM run_stats") == [(2 / 3, 1.5, 0.25)]


def test_runner_list_reads_a_file_of_an_older_specdash(tmp_path):
    old = tmp_path / "old.duckdb"
    con = duckdb.connect(str(old))
    migrate(con, to_version=5)  # before the divergence columns that the list counts
    con.execute("INSERT INTO runs (run_id, sweep_id, started_at, target, draft, k, status, lossless) VALUES "
                "('b', 's1', '2025-03-01 12:00', 't', 'none', NULL, 'ok', NULL), "
                "('x', 's1', '2025-03-01 12:01', 't', 'ngram', 2, 'ok', false)")
    con.close()
    sweeps = list_sweeps(old)
    # the failure has no class recorded (the file predates the divergence columns): unjudged
    assert sweeps[["sweep_id", "runs", "lossless_failures", "real_divergences", "unjudged"]].values.tolist() == [
        ["s1", 2, 1, 0, 1]]
    assert query(old, "SELECT max(version) FROM schema_migrations") == [(SCHEMA_VERSION,)]


def test_a_newer_database_is_refused(db):
    init_db(db)
    con = duckdb.connect(str(db))
    con.execute("INSERT INTO schema_migrations VALUES (?, 'from_the_future', NULL)", [SCHEMA_VERSION + 1])
    con.close()
    newer = SCHEMA_VERSION + 1
    message = f"runs.duckdb has schema version {newer}, newer than this specdash ({SCHEMA_VERSION}); upgrade specdash"
    with pytest.raises(StoreError, match=message.replace("(", r"\(").replace(")", r"\)")):
        write_run(db, SPEC)
    with pytest.raises(StoreError, match="newer than this specdash"):
        recorded_runs(db, "s1")
    assert query(db, "SELECT count(*) FROM runs") == [(0,)]


@pytest.mark.parametrize("content", [b"", b"run_id,alpha\nr1,0.5\n" * 100, b"SQLite format 3\x00" + bytes(4000)])
def test_a_file_that_is_not_duckdb_is_refused_and_left_alone(db, content):
    db.write_bytes(content)
    with pytest.raises(StoreError, match=r"runs\.duckdb is not a specdash database \(not a DuckDB file\)$"):
        write_run(db, SPEC)
    assert db.read_bytes() == content
    assert not db.with_name("runs.duckdb.pending").exists()


@pytest.mark.parametrize("setup", ["CREATE TABLE results (x INTEGER)",
                                   "CREATE TABLE schema_migrations (version INTEGER, name TEXT, applied_at TIMESTAMP);"
                                   "INSERT INTO schema_migrations VALUES (1, 'x', NULL)"])
def test_a_foreign_duckdb_database_is_refused(db, setup):
    con = duckdb.connect(str(db))
    con.execute(setup)
    con.close()
    with pytest.raises(StoreError, match=r"runs\.duckdb is not a specdash database$"):
        write_run(db, SPEC)
    with pytest.raises(StoreError, match="is not a specdash database"):
        list_sweeps(db)


def test_a_missing_or_unwritable_directory_is_a_clear_error(tmp_path):
    with pytest.raises(StoreError, match="is not a directory"):
        write_run(tmp_path / "nowhere" / "runs.duckdb", SPEC)
    if os.geteuid() == 0:
        locked_dir = Path("/proc")  # root ignores file modes; nobody can create files in /proc
    else:
        locked_dir = tmp_path / "ro"
        locked_dir.mkdir(mode=0o555)
    with pytest.raises(StoreError, match=f"^cannot open {locked_dir}/runs.duckdb: "):
        write_run(locked_dir / "runs.duckdb", SPEC)


def stats(db: Path, run_id: str) -> dict:
    con = duckdb.connect(str(db), read_only=True)
    try:
        cur = con.execute("SELECT * FROM run_stats WHERE run_id = ?", [run_id])
        return dict(zip([d[0] for d in cur.description], cur.fetchone(), strict=True))
    finally:
        con.close()


def test_run_stats_match_hand_computed_values(db):
    write_run(db, BASELINE)
    write_run(db, SPEC)
    s = stats(db, "spec")
    counts = (s["accepted"], s["rejected"], s["thrown"], s["drafted"], s["n_rounds"], s["new_tokens"])
    assert counts == (7, 2, 3, 12, 3, 10)
    assert s["alpha"] == pytest.approx(7 / 9)
    assert s["tau"] == pytest.approx(10 / 3)
    assert s["thrown_share"] == pytest.approx(0.25)
    assert s["tokens_per_s"] == pytest.approx(10 / 0.3)
    assert s["baseline_tokens_per_s"] == pytest.approx(10 / 0.6)
    assert s["measured_speedup"] == pytest.approx(2.0)  # 0.06 s/token against 0.03 s/token
    assert s["target_pass_s"] == pytest.approx(0.05)  # the baseline's 10 one-token passes
    assert s["verify_pass_s"] == pytest.approx(0.06)
    assert s["draft_token_s"] == pytest.approx(0.001)  # 12 ms over 12 drafts
    assert s["c"] == pytest.approx(0.02)
    # (1 − (7/9)^5) / ((2/9) · (1 + 4 · 0.02))
    assert s["theoretical_speedup"] == pytest.approx(2.9807165800, rel=1e-9)
    assert s["lossless"] is True


def test_a_run_and_its_rounds_are_stored_as_given(db):
    write_run(db, SPEC)
    assert query(db, "SELECT started_at, prompt_tokens, output_tokens, target_passes, draft_calls, prefill_s, "
                     "stop_reason, torch_version, transformers_version, host, git_commit, kernels, threads "
                     "FROM runs") == [
        (datetime(2025, 3, 1, 12), [1, 2, 3], list(range(10, 20)), 4, 3, 0.1, "max_new_tokens", "2.13.0", None,
         "h1", "abc", "skinny", 2)]
    assert query(db, "SELECT round, k, accepted, rejected, thrown, bonus, emitted, draft_s, verify_s, draft_tokens, "
                     "target_tokens FROM rounds ORDER BY round") == [
        (0, 4, 4, 0, 0, True, 5, 0.004, 0.06, [10, 11, 12, 13], [10, 11, 12, 13, 14]),
        (1, 4, 1, 1, 2, False, 2, 0.004, 0.06, [15, 9, 9, 9], [15, 16, 0, 0, 0]),
        (2, 4, 2, 1, 1, False, 3, 0.004, 0.06, [17, 18, 9, 9], [17, 18, 19, 0, 0])]


def test_baseline_rows_have_no_speculative_stats(db):
    write_run(db, BASELINE)
    s = stats(db, "base")
    assert (s["k"], s["drafted"], s["accepted"], s["tau"], s["verify_pass_s"]) == (None, 0, 0, 1.0, pytest.approx(0.05))
    assert [s[c] for c in ("alpha", "thrown_share", "measured_speedup", "draft_token_s", "c", "theoretical_speedup",
                           "lossless")] == [None] * 7


def test_alpha_of_one_uses_the_limit_of_the_formula(db):
    write_run(db, BASELINE)
    perfect = Round(2, 2, 0, 0, True, 3, 0.002, 0.06, (10, 11), (10, 11, 12))
    write_run(db, record("all", (perfect, perfect), wall_s=0.3, k=2))
    s = stats(db, "all")
    assert (s["alpha"], s["thrown_share"], s["c"]) == (1.0, 0.0, pytest.approx(0.02))
    assert s["theoretical_speedup"] == pytest.approx(3 / 1.04)  # (k + 1) / (1 + k·c)


def test_an_error_run_has_no_generation_and_no_stats(db):
    failed = replace(SPEC, run_id="bad", status="error", error="CUDA OOM", generation=None, output_text=None,
                     lossless=None)
    write_run(db, failed)
    assert query(db, "SELECT status, error, new_tokens, n_rounds, wall_s, output_tokens, stop_reason FROM runs") == [
        ("error", "CUDA OOM", None, None, None, None, None)]
    assert query(db, "SELECT count(*) FROM rounds") == [(0,)]
    assert query(db, "SELECT count(*) FROM run_stats") == [(0,)]
    assert recorded_runs(db, "s1") == set()


def test_a_write_that_fails_midway_leaves_nothing(db):
    init_db(db)
    con = duckdb.connect(str(db))
    con.execute("INSERT INTO rounds (run_id, round) VALUES ('spec', 2)")  # collides with SPEC's last round
    con.close()
    with pytest.raises(StoreError, match="^could not record run spec: Constraint Error"):
        write_run(db, SPEC)
    assert query(db, "SELECT count(*) FROM runs") == [(0,)]
    assert query(db, "SELECT run_id, round, k FROM rounds") == [("spec", 2, None)]


WRITER = """
import sys
sys.path.insert(0, sys.argv[2])
from runner.records import Generation, Round, RunRecord
from runner.store.runs import write_run
rounds = tuple(Round(4, 2, 1, 1, False, 3, 0.001, 0.01, (1, 2, 3, 4), (1, 2, 5, 0, 0)) for _ in range(400))
gen = Generation((1,), (7,) * 1200, rounds, 0.1, 1.0, 400, "max_new_tokens")
for i in range(10**6):
    write_run(sys.argv[1], RunRecord(f"{sys.argv[3]}-{i}", "s1", "2025-03-01T12:00:00", "t", "d", "ngram", "code",
        "p1", "x", 4, "greedy", 0.0, 1.0, i, 1200, "cpu", "float32", "ok", None, gen, "x", None, True))
    print("wrote", flush=True)
"""


def test_sigkill_during_writes_never_leaves_a_partial_run(db):
    chance = random.Random(7)
    for trial in range(5):
        child = subprocess.Popen([sys.executable, "-c", WRITER, str(db), str(REPO), f"t{trial}"],
                                 stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline() == "wrote\n"
        time.sleep(chance.uniform(0.0, 0.3))  # lands in open, insert, commit or the checkpoint on close
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert query(db, "SELECT count(*) >= 5 FROM runs") == [(True,)]
    broken = query(db, "SELECT r.run_id FROM runs r LEFT JOIN rounds x USING (run_id) "
                       "GROUP BY r.run_id, r.n_rounds HAVING count(x.round) <> r.n_rounds "
                       "UNION ALL SELECT run_id FROM rounds WHERE run_id NOT IN (SELECT run_id FROM runs)")
    assert broken == []
    assert query(db, "SELECT DISTINCT n_rounds FROM runs") == [(400,)]


HOLDER = """
import sys, duckdb
con = duckdb.connect(sys.argv[1], read_only=True)
print("held", flush=True)
sys.stdin.readline()  # until the test says so
con.close()
"""


def hold_read_only(db: Path) -> subprocess.Popen:
    """Another process with the file open read-only until a line arrives on its stdin."""
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    assert child.stdout.readline() == "held\n"
    return child


def release(holder: subprocess.Popen) -> None:
    holder.stdin.write("release\n")
    holder.stdin.flush()
    assert holder.wait() == 0


def test_a_locked_write_retries_until_the_reader_lets_go(db, monkeypatch):
    write_run(db, BASELINE)
    holder = hold_read_only(db)
    waits: list[float] = []

    class Clock:  # the store's clock, except that the third wait lets the reader go first
        monotonic = staticmethod(time.monotonic)

        @staticmethod
        def sleep(seconds: float) -> None:
            waits.append(seconds)
            if len(waits) == 3:
                release(holder)
            time.sleep(seconds)

    monkeypatch.setattr(connect, "time", Clock)
    retries = write_run(db, SPEC, lock_timeout_s=600)
    assert retries == len(waits) == 3  # three refusals while held, in the first try after the release
    assert holder.returncode == 0
    assert query(db, "SELECT run_id FROM runs ORDER BY run_id") == [("base",), ("spec",)]
    assert not (db.parent / "runs.duckdb.pending").exists()


def test_a_write_locked_past_its_bound_spills_and_is_flushed_exactly_once(db):
    write_run(db, many_rounds("first", 5))
    holder = hold_read_only(db)
    assert write_run(db, BASELINE, lock_timeout_s=0.2) > 0
    assert (db.parent / "runs.duckdb.pending" / "base.json").is_file()
    # Readers share the file with the holder, and see the spilled run as recorded.
    assert recorded_runs(db, "s1") == {("specdash", "p1", "ngram", 4, "greedy", 0.0, 1.0, 0, "fixed", 1, 0, 0),
                                             ("specdash", "p1", "none", None, "greedy", 0.0, 1.0, 0, None, 1, 0, 0)}
    assert baseline_for(db, "s1", ("specdash", "p1", "greedy", 0.0, 1.0, 0, [1, 2, 3], "cpu", "float32", 1, 0, 0)) == (
        "base", tuple(range(10, 20)))
    release(holder)
    assert flush_pending(db) == 1
    assert flush_pending(db) == 0
    assert query(db, "SELECT run_id, n_rounds FROM runs ORDER BY run_id") == [("base", 10), ("first", 5)]
    assert query(db, "SELECT count(*) FROM rounds WHERE run_id = 'base'") == [(10,)]
    assert list((db.parent / "runs.duckdb.pending").iterdir()) == []


def test_the_next_write_flushes_spills_and_skips_ones_already_stored(db):
    write_run(db, BASELINE)
    spill(db, BASELINE)  # as if a crash came between the commit and the delete
    spill(db, many_rounds("late", 4))
    write_run(db, SPEC)
    assert query(db, "SELECT run_id, n_rounds FROM runs ORDER BY run_id") == [("base", 10), ("late", 4), ("spec", 3)]
    assert list((db.parent / "runs.duckdb.pending").iterdir()) == []


def test_a_tree_round_keeps_its_shape_and_accepted_path_and_a_chain_leaves_them_null(db):
    write_run(db, TREE)
    assert query(db, "SELECT round, k, accepted, rejected, thrown, bonus, draft_parents, accepted_path FROM rounds "
                     "ORDER BY round") == [(0, 5, 2, 0, 3, True, [-1, -1, 0, 1, 1], [1, 4]),
                                           (1, 4, 3, 1, 0, False, None, None)]
    assert query(db, "SELECT accepted, rejected, thrown, drafted, emitted FROM run_totals") == [(5, 1, 3, 9, 7)]


def test_each_pass_keeps_its_rows_and_run_facts_counts_passes_by_them(db):
    # SPEC's rounds, the second carrying 3 rows beyond its drafts (as lookahead's window): 5, 8 and 5 rows
    rounds = SPEC.generation.rounds
    windowed = (*rounds[:1], replace(rounds[1], extra_rows=3), *rounds[2:])
    write_run(db, record("windowed", windowed, 0.3))
    assert query(db, "SELECT round, k, pass_rows FROM rounds ORDER BY round") == [(0, 4, 5), (1, 4, 8), (2, 4, 5)]
    assert query(db, "SELECT k, pass_rows, sum(rounds) FROM round_counts GROUP BY ALL ORDER BY ALL") == [
        (4, 5, 2), (4, 8, 1)]
    assert query(db, "SELECT widths FROM run_facts") == [(
        [{"k": 4, "rows": 5, "rounds": 2, "verify_s": 0.12}, {"k": 4, "rows": 8, "rounds": 1, "verify_s": 0.06}],)]
    assert record_from_dict(record_to_dict(record("windowed", windowed, 0.3))).generation.rounds == windowed


def test_records_survive_the_json_round_trip():
    for original in (BASELINE, SPEC, TREE):
        assert record_from_dict(record_to_dict(original)) == original


def test_reads_for_the_runner(db):
    assert recorded_runs(db, "s1") == set()
    assert baseline_for(db, "s1",
                        ("specdash", "p1", "greedy", 0.0, 1.0, 0, [1, 2, 3], "cpu", "float32", 1, 0, 0)) is None
    assert list_sweeps(db).empty
    write_run(db, BASELINE)
    write_run(db, SPEC)
    write_run(db, record("other", SPEC.generation.rounds, 0.3, sweep_id="s2", seed=5, baseline_run_id=None))
    failed = replace(SPEC, run_id="bad", k=8, status="error", generation=None)
    write_run(db, failed)
    assert recorded_runs(db, "s1") == {("specdash", "p1", "ngram", 4, "greedy", 0.0, 1.0, 0, "fixed", 1, 0, 0),
                                             ("specdash", "p1", "none", None, "greedy", 0.0, 1.0, 0, None, 1, 0, 0)}
    assert baseline_for(db, "s1", ("specdash", "p1", "greedy", 0.0, 1.0, 0, [1, 2, 3], "cpu", "float32", 1, 0, 0)) == (
        "base", tuple(range(10, 20)))
    assert baseline_for(db, "s1",
                        ("specdash", "p1", "greedy", 0.0, 1.0, 1, [1, 2, 3], "cpu", "float32", 1, 0, 0)) is None
    # the same cell fed other prompt ids, or on another device or dtype, has no baseline to compare with
    assert baseline_for(db, "s1",
                        ("specdash", "p1", "greedy", 0.0, 1.0, 0, [1, 2, 4], "cpu", "float32", 1, 0, 0)) is None
    assert baseline_for(db, "s1",
                        ("specdash", "p1", "greedy", 0.0, 1.0, 0, [1, 2, 3], "cuda", "float32", 1, 0, 0)) is None
    assert baseline_for(db, "s1",
                        ("specdash", "p1", "greedy", 0.0, 1.0, 0, [1, 2, 3], "cpu", "bfloat16", 1, 0, 0)) is None
    # nor a run at another batch size, or at another place in its batch
    assert baseline_for(db, "s1",
                        ("specdash", "p1", "greedy", 0.0, 1.0, 0, [1, 2, 3], "cpu", "float32", 4, 0, 0)) is None
    assert baseline_for(db, "s1",
                        ("specdash", "p1", "greedy", 0.0, 1.0, 0, [1, 2, 3], "cpu", "float32", 1, 2, 0)) is None
    # a vLLM run is never judged against our engine's baseline
    assert baseline_for(db, "s1", ("vllm", "p1", "greedy", 0.0, 1.0, 0, [1, 2, 3], "cpu", "float32", 1, 0, 0)) is None
    sweeps = list_sweeps(db)
    assert list(sweeps.columns) == ["sweep_id", "started", "target", "drafts", "runs", "errors", "lossless_failures",
                                    "real_divergences", "unjudged"]
    assert sweeps[["sweep_id", "target", "drafts", "runs", "errors", "lossless_failures"]].values.tolist() == [
        ["s1", "smollm2", "ngram, none", 3, 1, 0], ["s2", "smollm2", "ngram", 1, 0, 0]]


def test_a_read_torn_by_a_concurrent_checkpoint_is_read_again_and_other_errors_are_not(tmp_path):
    db = tmp_path / "runs.duckdb"
    init_db(db)
    calls = []

    def torn_once(con: duckdb.DuckDBPyConnection) -> int:
        calls.append(1)
        if len(calls) == 1:
            raise duckdb.IOException("IO Error: Could not read enough bytes from file \"runs.duckdb\"")
        return con.execute("SELECT count(*) FROM runs").fetchone()[0]

    assert connect.reading(db, torn_once, bound_s=5) == 0 and len(calls) == 2

    def broken(con: duckdb.DuckDBPyConnection) -> int:
        calls.append(1)
        raise duckdb.IOException("IO Error: No space left on device")

    calls.clear()
    with pytest.raises(duckdb.IOException, match="No space left"):
        connect.reading(db, broken, bound_s=5)
    assert len(calls) == 1
