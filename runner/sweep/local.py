"""A sweep's cells run here: the engine (ours, or vLLM's) loaded once and warmed up, then each cell into a `Result`.

The Ray actors (`ray_cells.py`) run their cells with the same `CellRunner`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import groupby

import torch

from runner.cells import Cell, new_run_id
from runner.engines import Engine, RunContext
from runner.pair_engine import PairEngine
from runner.records import RunRecord
from runner.sweep.plan import SweepConfig, workload


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
    """Runs cells on a prepared engine, each into a record not yet judged against its baseline (the sweep's
    `Recorder` does that): in the sweep's own process, or on a Ray actor."""

    def __init__(self, config: SweepConfig, sweep_id: str, engine: Engine) -> None:
        self.config, self.engine = config, engine
        self.context = RunContext(engine, config.target, sweep_id, config.seed, config.max_new_tokens)

    def identity(self) -> Identity:
        engine = self.engine
        return Identity(engine.device, engine.dtype, {p.id: tuple(engine.prompt_ids(p)) for p in self.config.prompts})

    def run_batch(self, cells: list[Cell]) -> list[Result]:
        """Cells of one batch: the whole batch decoded together (every slot, so that a resumed sweep decodes a
        batch as the first try did), the results of `cells` returned."""
        first, started, failure = cells[0], datetime.now(UTC).isoformat(), None
        try:
            generations, error = self.engine.run_batch(
                [first.mate(slot) for slot in range(first.batch_size)],
                [self.engine.prompt_ids(p) for p in first.batch]), None
        except Exception as exc:  # noqa: BLE001 - as in `run`
            first_line = str(exc).splitlines()[0] if str(exc) else ""
            generations, error = [None] * first.batch_size, f"{type(exc).__name__}: {first_line}"
            failure = error if device_error(exc) else None
        batch_id = new_run_id()
        return [Result(cell, self.context.make_record(cell, generations[cell.slot], error, started, batch_id),
                       device_error=failure) for cell in cells]

    def results(self, cells: list[Cell]) -> Iterator[Result]:
        """Each cell's result, in the engine's order, a batch's cells all at once."""
        for _, group in groupby(self.engine.schedule(cells), key=lambda c: c.mate(0) if c.batch else c):
            group = list(group)
            yield from self.run_batch(group) if group[0].batch else [self.run(group[0])]

    def run(self, cell: Cell) -> Result:
        started, failure = datetime.now(UTC).isoformat(), None
        try:
            generation, error = self.engine.run(cell, self.engine.prompt_ids(cell.prompt)), None
        except Exception as exc:  # noqa: BLE001 - a failing cell is recorded; the sweep goes on unless the device failed
            first_line = str(exc).splitlines()[0] if str(exc) else ""
            generation, error = None, f"{type(exc).__name__}: {first_line}"
            failure = error if device_error(exc) else None
        return Result(cell, self.context.make_record(cell, generation, error, started), device_error=failure)


def load_engine(config: SweepConfig, sweep_id: str) -> CellRunner:
    """The sweep's engine with the target and every draft, loaded once and warmed up at every k; ValueError for a
    prompt that does not fit or a draft the engine cannot run."""
    if config.engine_name == "vllm":
        from runner.vllm.engine import VllmEngine, engine_url  # only here: our engine's sweeps never import vLLM's

        engine = VllmEngine(config.target, engine_url(config.engine), config.threads or 1, config.max_new_tokens,
                            config.seed)
    else:
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        engine = PairEngine.load(config.target, config.drafts, config.kernels, config.max_new_tokens, config.seed,
                                 config.device, config.dtype, config.trust_remote_code)
    engine.prepare(workload(config))
    return CellRunner(config, sweep_id, engine)


class LocalSource:
    """The cells in this process, one after another in the engine's order."""

    def __init__(self, config: SweepConfig, sweep_id: str) -> None:
        self.runner = load_engine(config, sweep_id)
        self.classify = self.runner.engine.classify

    def identity(self) -> Identity:
        return self.runner.identity()

    def results(self, cells: list[Cell]) -> Iterator[Result]:
        return self.runner.results(cells)

    def close(self) -> None:
        self.runner.engine.close()
