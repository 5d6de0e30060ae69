"""An interrupted training continues from its last finished epoch when the same command runs again, ending where an
uninterrupted one ends; and the per-category held-out rows that came with it, on files old and new."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
import torch
from rich.console import Console

from dashboard import queries
from runner.store.migrations import MIGRATIONS, add_training_categories
from runner.store.schema import migrate
from runner.train import fit, resume
from runner.train.pipeline import train_draft
from tests.train.test_train import tiny_config


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDASH_CACHE", str(tmp_path / "cache"))


def test_a_rerun_continues_from_the_last_finished_epoch_and_ends_where_a_straight_run_ends(
        tmp_path, tiny_dir, monkeypatch):
    straight = tiny_config(tmp_path, tiny_dir, epochs=2, out=tmp_path / "a", db=tmp_path / "a.duckdb")
    torch.manual_seed(0)  # the untrained head's random part, the same for both
    expected = train_draft(straight, Console(quiet=True))

    config = tiny_config(tmp_path, tiny_dir, epochs=2, out=tmp_path / "b", db=tmp_path / "b.duckdb")
    real, calls = fit.evaluate, []

    def stopped_in_epoch_2(*args: object) -> object:
        calls.append(1)
        if len(calls) == 3 and stopping:  # epoch 0's score, epoch 1's, then Ctrl-C while scoring epoch 2
            raise KeyboardInterrupt
        return real(*args)

    stopping = True
    monkeypatch.setattr(fit, "evaluate", stopped_in_epoch_2)
    torch.manual_seed(0)
    with pytest.raises(KeyboardInterrupt):
        train_draft(config, Console(quiet=True))
    assert not config.out.exists()  # nothing half-written into --out
    kept = list((tmp_path / "cache" / "train").glob("*.pt"))
    assert len(kept) == 1 and [e["number"] for e in resume.load_state(kept[0])["epochs"]] == [0, 1]

    stopping, calls = False, []
    torch.manual_seed(123)  # whatever the rerun's random state, the kept epoch decides
    resumed = train_draft(config, Console(quiet=True))
    assert len(calls) == 1  # only epoch 2 was scored again: epochs 0 and 1 came from the kept state
    assert [(e.number, e.train_loss, e.heldout_loss, e.categories) for e in resumed.epochs] == [
        (e.number, e.train_loss, e.heldout_loss, e.categories) for e in expected.epochs]
    assert {f.name: f.read_bytes() for f in config.out.iterdir()} == {
        f.name: f.read_bytes() for f in straight.out.iterdir()}
    assert not kept[0].exists()  # removed once the head is saved
    con = duckdb.connect(str(config.db), read_only=True)
    assert con.execute("SELECT train_id, status, resumed_epoch FROM trainings").fetchall() == [
        (resumed.train_id, "ok", 1)]
    assert con.execute("SELECT epoch FROM training_epochs ORDER BY epoch").fetchall() == [(0,), (1,), (2,)]
    con.close()


def old_file(path: Path) -> Path:
    """A database of the schema before per-category scores, with one training's pooled rows."""
    with duckdb.connect(str(path)) as con:
        migrate(con, MIGRATIONS.index(add_training_categories))
        con.execute("INSERT INTO trainings (train_id, status, draft, target, saved_epoch) "
                    "VALUES ('t', 'ok', 'eagle:h', 'm', 1)")
        con.execute("INSERT INTO training_epochs VALUES ('t', 0, NULL, 5.0, 1.0, NULL), ('t', 1, 3.0, 4.0, 1.0, 0.1)")
        con.execute("INSERT INTO training_positions VALUES ('t', 0, 1, 10, 1), ('t', 1, 1, 10, 4), ('t', 1, 2, 4, 1)")
    return path


def test_an_older_files_pooled_rows_read_before_and_after_the_migration(tmp_path):
    db = old_file(tmp_path / "old.duckdb")
    for migrated in (False, True):
        if migrated:
            with duckdb.connect(str(db)) as con:
                migrate(con)
                assert con.execute("SELECT DISTINCT category FROM training_positions").fetchall() == [("all",)]
        with duckdb.connect(str(db), read_only=True) as con:
            assert queries.trainings(con)["heldout_first_acceptance"].tolist() == [0.4]
            epochs = queries.training_epochs(con, "t")
            assert epochs[["epoch", "position", "acceptance"]].values.tolist() == [[0, 1, 0.1], [1, 1, 0.4],
                                                                                   [1, 2, 0.25]]
            assert queries.training_categories(con, "t").empty
