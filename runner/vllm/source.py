"""A sweep's cells run on vLLM: grouped by speculative config (plain decoding first, so every speculative run finds
its baseline), one server per config, each request a run recorded as our engine's are.

A config vLLM refuses, a server that does not start or dies: the cells it would have run become error runs with
the one-line reason, nothing recorded is lost, and `--resume` runs them again.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from itertools import groupby

from runner.cells import Cell, new_run_id
from runner.records import Divergence, Generation, RunRecord, first_difference
from runner.sweep.local import Identity, Result
from runner.sweep.plan import SweepConfig
from runner.vllm.engine import VllmEngine
from runner.vllm.server import VllmError

UNJUDGED = "unjudged"  # a vLLM output that differs from vLLM's plain one: vLLM returns no logits to classify it by


def engine_url(engine: str) -> str | None:
    """The server a team runs, from `--engine vllm:<url>`; None for `vllm` (servers started here)."""
    return engine.partition(":")[2] or None


class VllmSource:
    """The sweep's cells on vLLM, config by config."""

    def __init__(self, config: SweepConfig, sweep_id: str) -> None:
        self.config, self.sweep_id = config, sweep_id
        self.engine = VllmEngine(config.target, engine_url(config.engine), config.threads or 1)
        self.ids = {p.id: self.engine.prompt_ids(p) for p in config.prompts}

    def classify(self, prompt: tuple[int, ...], baseline: tuple[int, ...],
                 ours: tuple[int, ...]) -> Divergence | None:
        """Where a greedy vLLM output first differs from vLLM's plain one, not classified (no logits come back)."""
        at = first_difference(baseline, ours)
        return None if at is None else Divergence(at=at, gap=None, tolerance=None, kind=UNJUDGED)

    def identity(self) -> Identity:
        return Identity("cpu", "float32", {pid: tuple(ids) for pid, ids in self.ids.items()})

    def results(self, cells: list[Cell]) -> Iterator[Result]:
        """Plain decoding's cells first, then each config's, in the plan's order within a config."""
        configs = list(dict.fromkeys((c.draft.text, c.k) for c in cells if c.k is None))
        configs += [key for key in dict.fromkeys((c.draft.text, c.k) for c in cells) if key not in configs]
        for key in configs:
            group = [c for c in cells if (c.draft.text, c.k) == key]
            try:
                self.engine.use(group[0], self.ids[group[0].prompt.id], self.config.max_new_tokens)
            except (VllmError, ValueError) as exc:
                yield from (Result(c, self.record(c, None, str(exc), _now())) for c in group)
                continue
            yield from self.run_group(group)

    def run_group(self, cells: list[Cell]) -> Iterator[Result]:
        """Each batch's requests at once, a cell alone by itself."""
        cfg = self.config
        for _, members in groupby(cells, key=lambda c: c.mate(0) if c.batch else c):
            batch, started = list(members), _now()
            try:
                ids = [self.ids[c.prompt.id] for c in batch]
                done = self.engine.request_batch(batch, ids, cfg.max_new_tokens, cfg.seed) if batch[0].batch else [
                    self.engine.request(batch[0], ids[0], cfg.max_new_tokens, cfg.seed)]
                errors = [None] * len(batch)
            except (VllmError, ValueError) as exc:
                done, errors = [(None, None)] * len(batch), [str(exc)] * len(batch)
            batch_id = new_run_id() if batch[0].batch else None
            yield from (Result(c, self.record(c, g, e, started, batch_id, report))
                        for c, (g, report), e in zip(batch, done, errors, strict=True))

    def record(self, cell: Cell, generation: Generation | None, error: str | None, started: str,
               batch_id: str | None = None, report: str | None = None) -> RunRecord:
        """One row of `runs` for a vLLM request (or its error), not yet judged against vLLM's plain run."""
        d, facts = cell.decoding, self.engine.facts()
        text = None if generation is None else self.engine.tokenizer.decode(list(generation.output_tokens))
        return RunRecord(
            run_id=new_run_id(), sweep_id=self.sweep_id, started_at=started, target=self.config.target,
            draft=cell.draft.text, draft_kind=cell.draft.kind, category=cell.prompt.category,
            prompt_id=cell.prompt.id, prompt_text=cell.prompt.text, k=cell.k, mode=d.mode,
            temperature=d.temperature, top_p=d.top_p, seed=self.config.seed, max_new_tokens=self.config.max_new_tokens,
            device=facts["device"], dtype=facts["dtype"], status="error" if error else "ok", error=error,
            generation=generation, output_text=text, baseline_run_id=None, lossless=None, kernels=None,
            threads=facts["threads"], k_policy=cell.k_policy, turn=cell.prompt.turn,
            conversation=cell.prompt.thread, batch_size=cell.batch_size, batch_slot=cell.slot, batch_id=batch_id,
            repeat=cell.repeat,
            engine=facts["engine"], engine_version=facts["engine_version"], engine_config=facts["engine_config"],
            engine_report=report, ttft_s=None if generation is None else generation.prefill_s)

    def close(self) -> None:
        self.engine.close()


def _now() -> str:
    return datetime.now(UTC).isoformat()


