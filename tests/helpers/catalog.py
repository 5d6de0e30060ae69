"""A database file's schema as rows (`catalog`), and what differs between two (`differences`): what the schema tests
hold a new file and a migrated one to (tests/store/test_schema_now.py, tests/store/test_store.py)."""

from __future__ import annotations

import duckdb

# What `catalog` reads of a file, each as sorted rows: a change to any of these fields shows as a differing row.
QUERIES = {
    "columns": """SELECT table_name, column_index, column_name, data_type, is_nullable, column_default
        FROM duckdb_columns() WHERE NOT internal""",  # the views' columns too
    "constraints": """SELECT table_name, constraint_type, constraint_column_names, constraint_text
        FROM duckdb_constraints()""",
    "indexes": "SELECT table_name, index_name, is_unique, is_primary, expressions, sql FROM duckdb_indexes()",
    "views": "SELECT view_name, sql FROM duckdb_views() WHERE NOT internal",
    "macros": """SELECT function_name, function_type, parameters, macro_definition FROM duckdb_functions()
        WHERE function_type IN ('macro', 'table_macro') AND NOT internal""",
}

Catalog = dict[str, list[tuple]]


def catalog(con: duckdb.DuckDBPyConnection) -> Catalog:
    """The file's schema, by kind, and the migrations it records (not when they were applied)."""
    found = {kind: con.execute(f"{sql} ORDER BY ALL").fetchall() for kind, sql in QUERIES.items()}
    if not con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'schema_migrations'").fetchone()[0]:
        return found | {"schema_migrations": []}  # a hand-made schema
    return found | {"schema_migrations": con.execute("SELECT version, name FROM schema_migrations ORDER BY version")
                    .fetchall()}


def differences(one: Catalog, other: Catalog) -> list[tuple[str, str, tuple]]:
    """Every row of a catalog that the other lacks, as (kind, "one" or "other": the side it is on, row); [] when the
    two are the same."""
    return [(kind, side, row) for kind in one
            for side, rows, others in (("one", one[kind], other[kind]), ("other", other[kind], one[kind]))
            for row in rows if row not in others]
