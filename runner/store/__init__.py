"""runs.duckdb: connecting under DuckDB's locks, the schema and its migrations, runs written and read,
runs spilled while the file is locked, bench rows, and sandboxed user SQL."""
