"""`generate --engine vllm[:<url>]`: one prompt decoded by vLLM speculatively and plainly, recorded as a sweep would
(in a throwaway file), then its text, its verify steps and the summary printed."""

from __future__ import annotations

import tempfile
from pathlib import Path

import duckdb
from rich.console import Console
from rich.table import Table

from runner.cli.shared import stderr, stdout
from runner.engine.drafters.spec import DraftSpec
from runner.engine.round.decoding_rule import Decoding
from runner.prompts import Prompt
from runner.report import frame_table
from runner.sweep.loop import run_sweep
from runner.sweep.plan import SweepConfig
from runner.vllm.process import VllmError

SUMMARY = ("draft", "k", "new_tokens", "n_rounds", "alpha", "tau", "tokens_per_s", "baseline_tokens_per_s",
           "measured_speedup", "lossless")


def generate_on_vllm(engine: str, target: str, prompt: Prompt, spec: DraftSpec, k: int, decoding: Decoding,
                     seed: int, max_new_tokens: int, threads: int, size: int) -> None:
    """The cell and its baseline on vLLM; a run vLLM could not make raises VllmError with its one-line reason."""
    with tempfile.TemporaryDirectory() as scratch:
        db = Path(scratch) / "runs.duckdb"
        config = SweepConfig(target=target, drafts=(spec,), ks=(k,), decodings=(decoding,), prompts=(prompt,),
                             max_new_tokens=max_new_tokens, seed=seed, db=db, device="cpu", dtype="float32",
                             threads=threads, batches=(size,), engine=engine)
        run_sweep(config, Console(stderr=True, quiet=True))
        with duckdb.connect(str(db), read_only=True) as con:
            text, run_id, error = con.execute("SELECT output_text, run_id, error FROM runs WHERE draft <> 'none' "
                                              "ORDER BY batch_slot LIMIT 1").fetchone()
            if error:
                raise VllmError(error)
            plain = con.execute("SELECT error FROM runs WHERE draft = 'none' AND error IS NOT NULL").fetchone()
            steps = con.execute("SELECT round, k, accepted, rejected, thrown, bonus, emitted FROM rounds "
                                "WHERE run_id = ? ORDER BY round", [run_id]).fetchall()
            summary = con.execute(f"SELECT {', '.join(SUMMARY)} FROM run_stats WHERE run_id = ?", [run_id]).df()
    stdout.print(text, markup=False, highlight=False)
    table = Table("round", "k", "accepted", "rejected", "thrown", "bonus", "emitted",
                  title="verify steps (vLLM reports counts, not tokens; k = 0: a step that drafted nothing)")
    for row in steps:
        table.add_row(*(str(v) for v in row))
    stdout.print(table)
    stdout.print(frame_table(summary))
    if plain:  # a server a team runs speculatively cannot decode plainly: no baseline, no speedup nor lossless check
        stderr.print(f"no plain run to compare with: {plain[0]}", markup=False, highlight=False, soft_wrap=True)
