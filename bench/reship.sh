#!/usr/bin/env bash
# The shipped runs.duckdb, recorded again with today's engines (over an hour on a 2-core CPU, one thread):
#   bench/reship.sh [OLD] [NEW]     (default: runs.duckdb and runs.new.duckdb; move NEW over OLD when it is done)
# NEW gets the sweeps below, all from this machine, then OLD's draft-head trainings and benchmarks (none of its runs).
# Its sweeps are listed in bench/results/shipped-sweeps.txt, the ones the docs describe: once NEW is moved over OLD,
# `python -m runner report docs` renders the docs' tables from them again.
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=${1:-runs.duckdb}
NEW=${2:-runs.new.duckdb}
PY=${PY:-.venv/bin/python}
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
# POLICIES: the draft-length policies against fixed k (docs/policies.md), greedy and at T = 0.7.
P="--draft ngram --draft eagle:$H --prompts-per-category 3"
$SWEEP $P --k 1,2,3,4 --k-policy fixed --mode greedy
$SWEEP $P --k 2,4 --k-policy heuristic --k-policy auto --k-policy confidence:0.5 --mode greedy
$SWEEP $P --k 1,2,3,4 --k-policy fixed --mode sample --temperature 0.7
$SWEEP $P --k 2,4 --k-policy heuristic --k-policy auto --k-policy confidence:0.5 --mode sample --temperature 0.7

# ENGINES: vLLM beside ours on the same prompts at k = 4: plain decoding (each engine's own baseline), prompt lookup
# with vLLM's match rule (ours `ngram:3:earliest`, vLLM's `ngram:3`) and the head, which vLLM runs as EAGLE-3.
$SWEEP --draft ngram:3:earliest --draft eagle:$H --k 4 --prompts-per-category 4
$SWEEP --engine vllm --draft ngram:3 --draft eagle:$H --k 4 --prompts-per-category 4
# REPEATS: every cell three times, its baseline again before each, so a speedup's noise is measured, not guessed.
$SWEEP --draft ngram --draft eagle:$H --k 3 --repeats 3 --prompts-per-category 2
# BENCHMARK FORMATS: the tests' hand-written files in Spec-Bench's and SPEED-Bench's shapes (the project ships neither
# benchmark's prompts), so their pages show something; SPEED-Bench in both engines (vLLM on two of its splits).
$SWEEP --prompts tests/data/spec_bench_sample.jsonl --draft ngram --draft eagle:$H --k 4
$SWEEP --prompts tests/data/speed_bench --draft ngram:3:earliest --draft eagle:$H --k 4
$SWEEP --engine vllm --prompts tests/data/speed_bench --splits qualitative,throughput_1k --draft ngram:3 \
    --draft eagle:$H --k 4

# The sweeps just recorded, the ones the docs describe.
$PY -c "import duckdb, sys; print(*(row[0] for row in duckdb.connect(sys.argv[1], read_only=True).execute(
    'SELECT sweep_id FROM runs GROUP BY sweep_id ORDER BY min(started_at)').fetchall()), sep='\n')" "$NEW" \
    > bench/results/shipped-sweeps.txt

# What OLD keeps: a copy with every table keyed by run_id emptied, merged into NEW.
KEEP=$(mktemp -d)/kept.duckdb
cp "$OLD" "$KEEP"
$PY - "$KEEP" <<'PYTHON'
import sys

import duckdb

from runner.store.schema import migrate

con = duckdb.connect(sys.argv[1])
migrate(con)
tables = con.execute("SELECT DISTINCT table_name FROM duckdb_columns() WHERE column_name = 'run_id' AND NOT internal "
                     "AND table_name IN (SELECT table_name FROM duckdb_tables())").fetchall()
for (table,) in tables:
    con.execute(f"DELETE FROM {table}")
con.close()
PYTHON
$PY -m runner merge "$KEEP" --into "$NEW"
rm -rf "$(dirname "$KEEP")"
