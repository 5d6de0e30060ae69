"""Batched runs (runner/engine/batch.py) in the schema: their columns and `batch_stats`, which `schema.py`'s
migration `add_batches` creates (it is kept here to keep that file short)."""

from __future__ import annotations

import duckdb

# Per batch size: what a sweep's runs of one draft, k, policy and category gave, decoded B at a time. A batch is
# the runs of one `batch_id` (at batch 1, each run alone); its throughput is its new tokens over its slowest
# member's wall time, every member having started with the batch.
BATCH_STATS = """CREATE OR REPLACE VIEW batch_stats AS
    WITH batches AS (
        SELECT r.sweep_id, r.target, r.draft, r.draft_kind, r.k, r.k_policy, r.category, r.mode, r.temperature,
               r.top_p, r.device, r.dtype, r.kernels, r.threads, r.batch_size, coalesce(r.batch_id, r.run_id) AS batch,
               count(*) AS runs, sum(r.new_tokens) AS new_tokens, max(r.wall_s) AS wall_s,
               sum(s.measured_speedup) AS speedup_sum, count(s.measured_speedup) AS speedups,
               sum(s.tokens_per_s) AS tokens_per_s_sum, sum(s.accepted) AS accepted, sum(s.rejected) AS rejected
        FROM runs r JOIN run_stats s USING (run_id)
        GROUP BY ALL)
    SELECT sweep_id, target, draft, draft_kind, k, k_policy, category, mode, temperature, top_p, device, dtype,
           kernels, threads, batch_size, count(*) AS batches, sum(runs)::BIGINT AS runs,
           sum(speedup_sum) / nullif(sum(speedups), 0) AS measured_speedup,
           sum(tokens_per_s_sum) / sum(runs) AS tokens_per_s_per_seq,
           avg(new_tokens / nullif(wall_s, 0)) AS tokens_per_s_per_batch,
           alpha(sum(accepted), sum(rejected)) AS alpha
    FROM batches GROUP BY ALL"""


def batch_columns(con: duckdb.DuckDBPyConnection) -> None:
    # Runs decoded together: how many (1 for every run before), the batch they share and each one's place in it;
    # per round, the sequences still in its shared pass.
    con.execute("ALTER TABLE runs ADD COLUMN batch_size INTEGER DEFAULT 1")
    con.execute("ALTER TABLE runs ADD COLUMN batch_slot INTEGER DEFAULT 0")
    con.execute("ALTER TABLE runs ADD COLUMN batch_id TEXT")
    con.execute("ALTER TABLE rounds ADD COLUMN batch_seqs INTEGER DEFAULT 1")
