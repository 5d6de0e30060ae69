"""A sweep's cells run here: the pair loaded once and warmed up, then each cell into a `Result`.

The Ray actors (`ray_cells.py`) run their cells with the same `CellRunner`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import groupby

import torch

from runner.cells import Cell, PromptIds, RunContext, check_fit, new_run_id, provenance
from runner.engine import lossless, models
from runner.engine.pair import PLAIN, Pair
from runner.engine.policies import warm_ks
from runner.records import RunRecord
from runner.sweep.plan import SweepConfig


@dataclass(frozen=True)
class Identity:
    """What a cell's baseline key needs from the loaded target: its device and dtype, each prompt's token ids."""

    device: str
    dtype: str
    prompt_ids: dict[str, tuple[int, ...]]  # prompt id -> the ids fed to the model (the chat template applied)


@dataclass(frozen=True)
class Result:
    """A cell run: its record, or None when it was given up (its Ray actor died running it too often)."""

    cell: Cell
    record: RunRecord | None
    worker: str | None = None  # the Ray actor that ran it (host/pid); None in the sweep's own process
    device_error: str | None = None  # the device failed in this cell: later cells would fail too, so the sweep stops


def device_error(exc: BaseException) -> bool:
    """An error of the device itself: after it, later cells would fail too (a CUDA error leaves the context
    unusable) or measure a device in trouble."""
    return isinstance(exc, (torch.OutOfMemoryError, torch.AcceleratorError)) or (
        isinstance(exc, RuntimeError) and "CUDA error" in str(exc))


class CellRunner:
    """Runs cells on a loaded pair, each into a record not yet judged against its baseline (the sweep's `Recorder`
    does that): in the sweep's own process, or on a Ray actor."""

    def __init__(self, config: SweepConfig, sweep_id: str, pair: Pair) -> None:
        self.config, self.pair = config, pair
        self.context = RunContext(pair, config.target, sweep_id, config.seed, config.max_new_tokens,
                                  provenance(pair.target.device))
        self.prompt_ids = PromptIds(pair, config.max_new_tokens, config.seed)

    def identity(self) -> Identity:
        target = self.pair.target
        return Identity(str(target.device), lossless.dtype_name(target.dtype),
                        {p.id: tuple(self.prompt_ids(p)) for p in self.config.prompts})

    def run_batch(self, cells: list[Cell]) -> list[Result]:
        """Cells of one batch: the whole batch decoded together (every slot, so that a resumed sweep decodes a
        batch as the first try did), the results of `cells` returned."""
        first, cfg, started, failure = cells[0], self.config, datetime.now(UTC).isoformat(), None
        try:
            generations, error = self.pair.run_batch(
                first.draft, [self.prompt_ids(p) for p in first.batch], first.k, first.decoding, cfg.max_new_tokens,
                cfg.seed, first.policy), None
        except Exception as exc:  # noqa: BLE001 - as in `run`
            first_line = str(exc).splitlines()[0] if str(exc) else ""
            generations, error = [None] * first.batch_size, f"{type(exc).__name__}: {first_line}"
            failure = error if device_error(exc) else None
        batch_id = new_run_id()
        return [Result(cell, self.context.record(cell, generations[cell.slot], error, started, batch_id),
                       device_error=failure) for cell in cells]

    def results(self, cells: list[Cell]) -> Iterator[Result]:
        """Each cell's result, a batch's cells all at once."""
        for _, group in groupby(cells, key=lambda c: c.mate(0) if c.batch else c):
            group = list(group)
            yield from self.run_batch(group) if group[0].batch else [self.run(group[0])]

    def run(self, cell: Cell) -> Result:
        cfg, started, failure = self.config, datetime.now(UTC).isoformat(), None
        try:
            generation, error = self.pair.run(cell.draft, self.prompt_ids(cell.prompt), cell.k, cell.decoding,
                                              cfg.max_new_tokens, cfg.seed, cell.policy), None
        except Exception as exc:  # noqa: BLE001 - a failing cell is recorded; the sweep goes on unless the device failed
            first_line = str(exc).splitlines()[0] if str(exc) else ""
            generation, error = None, f"{type(exc).__name__}: {first_line}"
            failure = error if device_error(exc) else None
        return Result(cell, self.context.record(cell, generation, error, started), device_error=failure)


def load_pair(config: SweepConfig, sweep_id: str) -> CellRunner:
    """The target and every draft, loaded once and warmed up at every k; ValueError for a prompt that does not fit."""
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    target = models.load(config.target, config.device, config.dtype, config.trust_remote_code)
    runner = CellRunner(config, sweep_id, Pair(target, list(config.drafts), config.kernels))
    check_fit([(p.id, len(runner.prompt_ids(p))) for p in config.prompts], config.max_new_tokens,
              target.max_context)
    ks = warm_ks(config.ks, config.policies)
    for d in config.decodings:
        runner.pair.warm_up([PLAIN, *config.drafts], runner.prompt_ids(config.prompts[0]), ks, d,
                            config.max_new_tokens, config.batches)
    return runner


class LocalSource:
    """The cells in this process, one after another in the plan's order."""

    def __init__(self, config: SweepConfig, sweep_id: str) -> None:
        self.runner = load_pair(config, sweep_id)
        self.classify = self.runner.context.classify

    def identity(self) -> Identity:
        return self.runner.identity()

    def results(self, cells: list[Cell]) -> Iterator[Result]:
        return self.runner.results(cells)

    def close(self) -> None:
        """Nothing to stop: the models go with the process."""
