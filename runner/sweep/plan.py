"""A sweep's plan: every prompt × mode × (baseline, then each draft × policy × k), and what is left of it to record."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from runner.cells import Cell
from runner.engine.drafters.registry import applies, check_drafts, refusal
from runner.engine.drafters.spec import PLAIN, DraftSpec
from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.policies import FIXED, PolicySpec, warm_ks
from runner.engines import Workload
from runner.prompts import Prompt
from runner.store.connect import check_db
from runner.store.runs import recorded_runs
from runner.sweep import progress


@dataclass(frozen=True)
class SweepConfig:
    """Everything that defines a sweep, parsed; the CLI only parses into this."""

    target: str  # model spec of the target
    drafts: tuple[DraftSpec, ...]  # the drafts, each run at every k and policy it can follow
    ks: tuple[int, ...]  # draft lengths
    decodings: tuple[Decoding, ...]  # greedy and/or sampling settings; each gets its own baseline
    prompts: tuple[Prompt, ...]  # already selected and validated
    max_new_tokens: int
    seed: int  # sampling seed, the same for a baseline and its speculative runs
    db: Path
    device: str | None  # None: cuda when present
    dtype: str | None  # None: bf16 on cuda, fp32 on cpu
    sweep_id: str | None = None  # set to resume: cells already recorded are skipped
    trust_remote_code: bool = False  # run the model code a checkpoint ships (transformers' trust_remote_code)
    kernels: str = "skinny"  # the linears' path on CPU: 'skinny' (measured per shape) or 'stock' (F.linear)
    threads: int | None = None  # torch CPU threads; None leaves torch's setting as it is
    policies: tuple[PolicySpec, ...] = (FIXED,)  # draft-length policies (--k-policy), each with every draft and k
    batches: tuple[int, ...] = (1,)  # batch sizes (--batch): B > 1 decodes B prompts of a category together
    # Each cell recorded this many times (--repeats), the baseline again before each repetition of a prompt's cells:
    # a speedup is then a ratio of runs made one after the other, and its spread over repetitions is measured.
    repeats: int = 1

    engine: str = "specdash"  # what decodes: ours, 'vllm' (run here) or 'vllm:<url>' (runner/vllm/)

    @property
    def engine_name(self) -> str:
        """`runs.engine`: the engine without where it runs."""
        return self.engine.partition(":")[0]

    def plan_id(self) -> str:
        """What the sweep records, as a short hash: a sweep is resumable by a later one with the same plan."""
        # Specs are hashed as the user wrote them; policies join the hash only when not the default, so a plan
        # recorded before policies keeps its hash.
        texts = tuple(p.text for p in self.policies)
        policies = () if texts == (FIXED.text,) else (texts,)
        batches = () if self.batches == (1,) else (("batches", self.batches),)
        repeats = () if self.repeats == 1 else (("repeats", self.repeats),)
        engine = () if self.engine == "specdash" else (("engine", self.engine),)
        return progress.fingerprint(self.target, tuple(d.text for d in self.drafts), self.ks, self.decodings,
                                    self.prompts, self.max_new_tokens, self.seed, self.device, self.dtype, *policies,
                                    *batches, *repeats, *engine)


def interleaved(prompts: tuple[Prompt, ...]) -> list[Prompt]:
    """The first prompt of every category, then the second of each, …: a sweep cut short still covers
    every category."""
    rank: dict[str, int] = {}
    order = []
    for position, prompt in enumerate(prompts):
        rank[prompt.category] = rank.get(prompt.category, -1) + 1
        order.append((rank[prompt.category], position, prompt))
    return [prompt for *_, prompt in sorted(order, key=lambda item: item[:2])]


def plan(config: SweepConfig) -> Iterator[Cell]:
    """Baseline first, so each speculative run can be checked against it as soon as it finishes; at batch B, the B
    plain runs of a batch first, then each draft's B runs. Each repetition records the baseline again, then every
    speculative cell of the prompt, so a run's baseline is its neighbour in time. A policy a draft cannot follow
    (`skipped`) is left out for that draft."""
    for size in config.batches:
        for prompts in [(p,) for p in interleaved(config.prompts)] if size == 1 else batches_of(config.prompts, size):
            for decoding in config.decodings:
                for repeat in range(config.repeats):
                    yield from _batch(Cell(prompts[0], decoding, PLAIN, None, repeat=repeat,
                                           engine=config.engine_name), prompts)
                    for draft in config.drafts:
                        for policy in (p for p in config.policies if applies(p, draft.kind)):
                            for k in config.ks:
                                yield from _batch(Cell(prompts[0], decoding, draft, k, policy, repeat=repeat,
                                                       engine=config.engine_name), prompts)


def _batch(cell: Cell, prompts: tuple[Prompt, ...]) -> Iterator[Cell]:
    """The cell alone, or one cell per slot of its batch."""
    if len(prompts) == 1:
        yield cell
    else:
        yield from (replace(cell, batch=prompts).mate(slot) for slot in range(len(prompts)))


def batches_of(prompts: tuple[Prompt, ...], size: int) -> list[tuple[Prompt, ...]]:
    """Each category's prompts, `size` at a time in order, its first ones reused in turn to fill its last batch (all
    of its batches, when it has fewer than `size`); the first batch of every category, then the second of each, …"""
    by_category: dict[str, list[Prompt]] = {}
    for prompt in prompts:
        by_category.setdefault(prompt.category, []).append(prompt)
    ranked = []
    for position, group in enumerate(by_category.values()):
        for j in range(-(-len(group) // size)):
            ranked.append((j, position, tuple(group[(j * size + s) % len(group)] for s in range(size))))
    return [batch for *_, batch in sorted(ranked, key=lambda item: item[:2])]


def skipped(config: SweepConfig) -> list[str]:
    """Why some draft × policy pairs are not in the plan, one line each."""
    return [refusal(policy, draft.text) for draft in config.drafts for policy in config.policies
            if not applies(policy, draft.kind)]


def new_sweep_id() -> str:
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:4]


def cells_to_run(config: SweepConfig) -> tuple[str, list[Cell]]:
    """The sweep id, and the cells of the plan not yet recorded (all of them for a new sweep). Refuses a bad --db
    or a draft head that cannot fit the target before any model is loaded."""
    sweep_id = config.sweep_id or new_sweep_id()
    check_db(config.db)
    if config.engine == "specdash":  # vLLM checks its own drafts as it loads them
        check_drafts(config.target, list(config.drafts), config.trust_remote_code)
    done = recorded_runs(config.db, sweep_id) if config.sweep_id else set()
    return sweep_id, [c for c in plan(config) if c.key(config.seed) not in done]


def workload(config: SweepConfig) -> Workload:
    """What the sweep's engine is prepared for: every prompt, draft, k (and policy cap), decoding and batch size."""
    return Workload(config.prompts, config.drafts, warm_ks(config.ks, config.policies), config.decodings,
                    config.batches)
