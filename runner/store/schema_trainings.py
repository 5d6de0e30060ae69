"""The migrations of the trainings tables, kept beside `schema.py` (which lists them in MIGRATIONS) to keep that
file short."""

from __future__ import annotations

import duckdb


def create_trainings(con: duckdb.DuckDBPyConnection) -> None:
    # `runner train-draft`: one row per training of a draft head, its epochs (0: the untrained head) and the
    # held-out acceptance of each epoch at each draft position, as counts so that rates pool exactly.
    con.execute("""CREATE TABLE trainings (
        train_id TEXT PRIMARY KEY, started_at TIMESTAMP, finished_at TIMESTAMP, status TEXT, error TEXT,
        target TEXT, draft TEXT, out_dir TEXT, prompts_file TEXT, train_prompts INTEGER, heldout_prompts INTEGER,
        train_tokens INTEGER, heldout_tokens INTEGER, max_new_tokens INTEGER, epochs INTEGER, draft_vocab INTEGER,
        vocab_coverage DOUBLE, layers INTEGER[], unroll INTEGER, lr DOUBLE, seed BIGINT, saved_epoch INTEGER,
        head_bytes BIGINT, data_cached BOOLEAN, data_s DOUBLE, train_s DOUBLE, wall_s DOUBLE, cpu_s DOUBLE,
        threads INTEGER, load_before DOUBLE, load_after DOUBLE, device TEXT, dtype TEXT, command TEXT,
        torch_version TEXT, transformers_version TEXT, python_version TEXT, host TEXT, git_commit TEXT)""")
    con.execute("""CREATE TABLE training_epochs (
        train_id TEXT, epoch INTEGER, train_loss DOUBLE, heldout_loss DOUBLE, seconds DOUBLE, lr DOUBLE,
        PRIMARY KEY (train_id, epoch))""")
    con.execute("""CREATE TABLE training_positions (
        train_id TEXT, epoch INTEGER, position INTEGER, judged BIGINT, accepted BIGINT,
        PRIMARY KEY (train_id, epoch, position))""")


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


def add_learn_context(con: duckdb.DuckDBPyConnection) -> None:
    # `train-draft --learn-context`: the head also learned to predict the prompts' own tokens, not only the target's
    # answers. Every training before it learned the answers alone.
    con.execute("ALTER TABLE trainings ADD COLUMN learn_context BOOLEAN")
    con.execute("UPDATE trainings SET learn_context = false")
