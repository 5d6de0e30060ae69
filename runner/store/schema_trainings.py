"""A migration of the trainings tables, kept beside `schema.py` (which lists it in MIGRATIONS) to keep that file
short."""

from __future__ import annotations

import duckdb


def add_training_categories(con: duckdb.DuckDBPyConnection) -> None:
    # A training scores its held-out prompts per category as well as pooled, so a head that learns only some kinds
    # of text shows it while it trains. The pooled rows are category 'all' (a name data files may not use); every
    # row before this was pooled. The key changes, so the table is rebuilt.
    con.execute("ALTER TABLE training_positions RENAME TO training_positions_old")
    con.execute("""CREATE TABLE training_positions (
        train_id TEXT, epoch INTEGER, position INTEGER, judged BIGINT, accepted BIGINT,
        category TEXT NOT NULL DEFAULT 'all', PRIMARY KEY (train_id, epoch, category, position))""")
    con.execute("INSERT INTO training_positions BY NAME SELECT *, 'all' AS category FROM training_positions_old")
    con.execute("DROP TABLE training_positions_old")
    # A training interrupted after an epoch continues from it when its command is run again; the row says after
    # which epoch it last did. Every training before this ran straight through (NULL).
    con.execute("ALTER TABLE trainings ADD COLUMN resumed_epoch INTEGER")
