"""A sweep: its plan's missing cells run by a source (this process, or Ray actors), and one loop that records what
comes back, each run after its baseline, with the same resume, device-error stop and progress for every source."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from runner.cells import Cell, Classify
from runner.store.runs import flush_pending
from runner.sweep import progress
from runner.sweep.local import Identity, LocalSource, Result
from runner.sweep.plan import SweepConfig, cells_to_run, plan
from runner.sweep.recorder import Recorder

BAR = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())


class Source(Protocol):
    """Where a sweep's cells run."""

    classify: Classify  # a greedy mismatch judged on the source's target

    def identity(self) -> Identity:
        """The loaded target's device, dtype and prompt ids; raises ValueError for bad input (a model, a prompt)."""

    def results(self, cells: list[Cell]) -> Iterator[Result]:
        """Each cell's result once, as it finishes."""

    def close(self) -> None:
        """Stop what the source started."""


def standing(config: SweepConfig, sweep_id: str, to_record: int) -> Callable[[int, str], None]:
    """`stand(recorded, state)`: where the sweep stands, beside the file, for the dashboard and `--resume last`."""
    plan_id, planned = config.plan_id(), sum(1 for _ in plan(config))
    return lambda recorded, state: progress.write(config.db, sweep_id, plan_id, planned - to_record + recorded,
                                                  planned, state)


def run_sweep(config: SweepConfig, console: Console,
              open_source: Callable[[SweepConfig, str], Source] = LocalSource) -> tuple[str, Recorder]:
    """Load once, warm up, then record every cell not yet recorded; a device error stops the sweep (what was
    recorded stays). Returns the sweep id and its recorder."""
    sweep_id, todo = cells_to_run(config)
    if not todo:
        standing(config, sweep_id, 0)(0, progress.DONE)
        return sweep_id, Recorder(config, sweep_id, lambda *_: None)
    source = open_source(config, sweep_id)
    try:
        identity = source.identity()
        recorder = Recorder(config, sweep_id, source.classify)

        def key(cell: Cell) -> tuple:
            return cell.baseline_key(config.seed, identity.prompt_ids[cell.prompt.id], identity.device,
                                     identity.dtype)

        # A recorded baseline counts only if it matches this run's prompt ids, device and dtype; else it is re-run.
        missing = set(todo)
        cells = [c for c in plan(config) if c in missing or c.k is None and recorder.baseline(key(c)) is None]
        stand = standing(config, sweep_id, len(cells))
        recorded = record_all(source.results(cells), cells, key, recorder, stand, console, sweep_id)
    finally:
        source.close()
    flush_pending(config.db)
    stand(recorded, progress.INTERRUPTED if recorder.device_error or recorded < len(cells) else progress.DONE)
    return sweep_id, recorder


def record_all(results: Iterable[Result], cells: list[Cell], key: Callable[[Cell], tuple], recorder: Recorder,
               stand: Callable[[int, str], None], console: Console, sweep_id: str) -> int:
    """Write each result as it comes; a speculative run waits for its baseline, which its lossless check needs.
    Returns how many cells were recorded."""
    due = Counter(key(c) for c in cells if c.k is None)  # baselines not yet back, per key
    held: dict[tuple, list[Result]] = defaultdict(list)
    recorded = 0
    with Progress(*BAR, console=console, disable=not console.is_terminal) as bar:
        total, per_worker = bar.add_task(f"sweep {sweep_id}", total=len(cells)), {}
        stand(0, progress.RECORDING)
        try:
            for result in results:
                cell, k = result.cell, key(result.cell)
                bar.update(total, description=cell.label)
                if result.record is not None and cell.k is not None and due[k]:
                    held[k].append(result)
                    continue
                for ready in [result, *(held.pop(k, []) if cell.k is None else [])]:
                    if ready.record is not None:
                        recorder.write(ready.cell, ready.record, k)
                        recorded += 1
                    if ready.worker:  # Ray: a bar per actor as well
                        if ready.worker not in per_worker:
                            per_worker[ready.worker] = bar.add_task(f"  {ready.worker}", total=len(cells))
                        bar.advance(per_worker[ready.worker])
                    bar.advance(total)
                due[k] -= cell.k is None
                stand(recorded, progress.RECORDING)
                if result.device_error:
                    recorder.device_error = result.device_error
                    break
        except BaseException:  # Ctrl-C: what was recorded stays, and `--resume last` finishes the rest
            stand(recorded, progress.INTERRUPTED)
            raise
    return recorded
