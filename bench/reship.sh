#!/usr/bin/env bash
# The shipped runs.duckdb, recorded again with today's engine (about an hour on an idle 2-core CPU, one thread):
#   bench/reship.sh [OLD] [NEW]     (default: runs.duckdb and runs.new.duckdb; move NEW over OLD when it is done)
# NEW gets the sweeps below, then everything of OLD but the sweeps they supersede (CHAINS, SAMPLED, STOCK): the
# draft-length policy sweeps the README's table quotes, the shipped head's training and the benchmarks.
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=${1:-runs.duckdb}
NEW=${2:-runs.new.duckdb}
PY=${PY:-.venv/bin/python}
SUPERSEDED="'20261130-101456-0992', '20261130-103103-2852', '20261130-103334-e49b'"  # CHAINS, SAMPLED, STOCK of OLD
H=heads/smollm2-135m
M=heads/medusa-smollm2
SWEEP="$PY -m runner sweep --threads 1 --max-new-tokens 64 --db $NEW"

# CHAINS: prompt lookup, layer skip and the head at k = 1-4, greedy.
$SWEEP --draft ngram --draft layerskip:24 --draft eagle:$H --k 1,2,3,4 --prompts-per-category 4
# TREES and the other published drafts, at depth 3 (the Medusa heads are 3).
$SWEEP --draft ngram-tree --draft eagle-tree:$H --draft hybrid:$H --draft recycling --draft medusa:$M \
    --draft medusa-tree:$M --draft lookahead --k 3 --prompts-per-category 4
# SAMPLED at T = 0.7: rounds with the sampling test's p, q and draw.
$SWEEP --draft ngram --draft eagle:$H --draft eagle-tree:$H --k 2,4 --prompts-per-category 2 --mode sample
# STOCK: the same passes on torch's own linears.
$SWEEP --draft ngram --draft eagle:$H --k 2,4 --prompts-per-category 2 --kernels stock
# BATCHES: 1, 2 and 4 prompts of a category decoded together, each against plain decoding at its batch size.
$SWEEP --draft ngram --draft eagle:$H --draft ngram-tree --k 3 --batch 1,2,4 --prompts-per-category 4

# What OLD keeps: a copy without the superseded sweeps, merged into NEW.
KEEP=$(mktemp -d)/kept.duckdb
cp "$OLD" "$KEEP"
$PY - "$KEEP" "$SUPERSEDED" <<'EOF'
import sys

import duckdb

from runner.store.schema import migrate

con = duckdb.connect(sys.argv[1])
migrate(con)
runs = f"SELECT run_id FROM runs WHERE sweep_id IN ({sys.argv[2]})"
tables = [t for (t,) in con.sql("SELECT table_name FROM duckdb_columns() WHERE column_name = 'run_id' "
                                "AND table_name <> 'runs' AND NOT internal "
                                "AND table_name IN (SELECT table_name FROM duckdb_tables())").fetchall()]
for table in tables:
    con.execute(f"DELETE FROM {table} WHERE run_id IN ({runs})")
con.execute(f"DELETE FROM runs WHERE run_id IN ({runs})")
con.close()
EOF
$PY -m runner merge "$KEEP" --into "$NEW"
rm -rf "$(dirname "$KEEP")"
