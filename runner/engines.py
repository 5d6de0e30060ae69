"""The seam between a run and whatever decodes it: what a cell asks of an engine (`Engine`), what it is prepared for
(`Workload`), and what every run of one sweep shares to become a `RunRecord` (`RunContext`).

Our engine is a target paired with its drafts (runner/pair_engine.py); vLLM's, over HTTP (runner/vllm/engine.py),
meets the same protocol. Sweeps (local and on Ray), `generate` and the bench talk to this protocol only. It is light
on purpose: nothing here imports torch, so an engine that never loads one can meet it.
"""

from __future__ import annotations

import platform
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from runner.cells import Cell, new_run_id
from runner.engine.drafters.spec import DraftSpec
from runner.engine.round.decoding_rule import Decoding
from runner.prompts import Prompt
from runner.records import Divergence, Generation, RunRecord


@dataclass(frozen=True)
class Workload:
    """What an engine is prepared for, once, before any cell runs."""

    prompts: tuple[Prompt, ...]  # every prompt it will be asked; the first one warms it up
    drafts: tuple[DraftSpec, ...]  # every draft besides the baseline
    ks: tuple[int, ...]  # every draft length a round may ask for: the ks and each policy's cap (`warm_ks`)
    decodings: tuple[Decoding, ...]
    batches: tuple[int, ...] = (1,)  # every batch size


class Engine(Protocol):
    """What a cell asks of an engine.

    Made with the sweep's target, seed and max_new_tokens, an engine is then:

    - `prepare(workload)` once: load and warm up; ValueError for bad input (a prompt that does not fit, a draft it
      cannot run), before any cell runs;
    - `prompt_ids(prompt)`: the token ids a prompt is fed as (the chat template applied, a later turn after the
      target's own answers to the earlier ones), the same on every call;
    - `schedule(cells)`: the cells in the order it runs them best (ours: as planned; vLLM: config by config,
      plain decoding first, prompt lookup's last); a batch's cells stay together, in slot order;
    - `run(cell, ids)`: one cell decoded from `ids` into a `Generation`; an exception is that cell's error (the
      caller records it and goes on);
    - `run_batch(cells, ids_list)`: the cells of one batch (one draft, k, policy and decoding; slots 0..B-1 in
      order), decoded together, one `Generation` each in the same order;
    - `close()`: everything it holds released; nothing may be asked after.

    What a run's record needs from it, readable once prepared: `name` ('specdash', 'vllm'), `version` (None for
    ours), `device` and `dtype` as recorded in runs, `kernels` (None where the engine has no choice of kernels), CPU
    `threads`, `provenance` (versions, host, commit, device name), `text(tokens)` (output tokens decoded as the
    target's tokenizer decodes them), `tree_nodes(cell)` (a tree's nodes per round at that cell, None for a chain),
    `config(cell)` (the exact configuration the engine ran the cell with, as JSON; None for ours) and
    `classify(prompt, baseline, ours)` (where and why a greedy output differs from its baseline's; None where it
    cannot tell).
    """

    name: str
    version: str | None
    device: str
    dtype: str
    kernels: str | None
    threads: int
    provenance: dict[str, str]

    def prepare(self, workload: Workload) -> None: ...

    def prompt_ids(self, prompt: Prompt) -> list[int]: ...

    def schedule(self, cells: list[Cell]) -> list[Cell]: ...

    def run(self, cell: Cell, ids: list[int]) -> Generation: ...

    def run_batch(self, cells: list[Cell], ids_list: list[list[int]]) -> list[Generation]: ...

    def text(self, tokens: Sequence[int]) -> str: ...

    def tree_nodes(self, cell: Cell) -> int | None: ...

    def config(self, cell: Cell) -> str | None: ...

    def classify(self, prompt: tuple[int, ...], baseline: tuple[int, ...],
                 ours: tuple[int, ...]) -> Divergence | None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class RunContext:
    """What every run of one sweep (or one `generate`, one bench repeat) shares."""

    engine: Engine  # prepared
    target_spec: str  # the target's model spec, as given
    sweep_id: str
    seed: int  # the sampling seed, the same for a baseline and its speculative runs
    max_new_tokens: int

    def make_record(self, cell: Cell, generation: Generation | None, error: str | None, started: str,
                    batch_id: str | None = None) -> RunRecord:
        """One row of `runs`, not yet stored: a cell's generation (or its error), not yet judged against its
        baseline; `batch_id` is shared by the runs of a batch."""
        d, engine = cell.decoding, self.engine
        return RunRecord(
            run_id=new_run_id(), sweep_id=self.sweep_id, started_at=started, target=self.target_spec,
            draft=cell.draft.text, draft_kind=cell.draft.kind, category=cell.prompt.category,
            prompt_id=cell.prompt.id, prompt_text=cell.prompt.text, k=cell.k, mode=d.mode,
            temperature=d.temperature, top_p=d.top_p, seed=self.seed, max_new_tokens=self.max_new_tokens,
            device=engine.device, dtype=engine.dtype, k_policy=cell.k_policy,
            status="error" if error else "ok", error=error, generation=generation,
            output_text=None if generation is None else engine.text(generation.output_tokens),
            baseline_run_id=None, lossless=None, provenance=engine.provenance, kernels=engine.kernels,
            threads=engine.threads, turn=cell.prompt.turn, conversation=cell.prompt.thread,
            batch_size=cell.batch_size, batch_slot=cell.slot, batch_id=batch_id,
            tree_nodes=engine.tree_nodes(cell), repeat=cell.repeat, engine=engine.name,
            engine_version=engine.version, engine_config=engine.config(cell),
            ttft_s=None if generation is None else generation.ttft_s,
            engine_report=None if generation is None else generation.report,
        )


def host_provenance() -> dict[str, str]:
    """What made a run, whatever its engine: the Python version, the host and the project's commit."""
    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        commit = ""
    return {"python_version": platform.python_version(), "host": socket.gethostname(), "git_commit": commit}

