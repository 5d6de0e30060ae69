"""A sweep's writes: each run judged once against its baseline, then written as one transaction with its rounds."""

from __future__ import annotations

import time

from runner.cells import Baseline, Cell, Classify, checked, judge
from runner.records import BASELINE_KEY, Divergence, RunRecord
from runner.store.runs import baseline_for, write_run
from runner.sweep.plan import SweepConfig


class Recorder:
    """Judges and writes runs; keeps the baselines written in this process, and what went wrong."""

    def __init__(self, config: SweepConfig, sweep_id: str, classify: Classify) -> None:
        self.db, self.sweep_id, self.classify = config.db, sweep_id, classify
        self.divergences: list[tuple[str, Divergence]] = []  # greedy runs that differ from their baseline
        self.errors: list[str] = []
        self.device_error: str | None = None  # set when a device error stopped the sweep
        self.dtype: str | None = None  # of the runs written (one per sweep)
        self.write_s = 0.0  # time spent writing runs (the database's side of a sweep's throughput)
        # baseline key -> the baseline's (run_id, output tokens), kept from this process's runs so a speculative run
        # need not read them back; a resumed sweep finds earlier ones in the database.
        self.baselines: dict[tuple, Baseline] = {}

    @property
    def lossless_failures(self) -> list[str]:
        """The greedy runs that differ from their baseline, as labels, whatever the class."""
        return [name for name, _ in self.divergences]

    def baseline(self, key: tuple) -> Baseline | None:
        """The plain run of this sweep with these `BASELINE_KEY` values, newest first: never one of other prompt ids
        (a chat template that stamps the date), device or dtype."""
        return self.baselines.get(key) or baseline_for(self.db, self.sweep_id, key)

    def write(self, cell: Cell, record: RunRecord, key: tuple) -> None:
        """Record a cell's run; a speculative one is first judged against the baseline of `key`, and plain decoding
        at a batch size above 1 checked against the prompt's plain decoding alone when the sweep has it (batch 1
        runs first), without a link: it stays the baseline of its batch."""
        if cell.k is not None:
            record = judge(record, self.baseline(key), self.classify)
        elif cell.batch and (alone := self.baseline(unbatched(key))) is not None:
            record = checked(record, alone[1], self.classify)
        self.dtype = record.dtype
        if record.mismatch is not None:
            self.divergences.append((cell.label, record.mismatch))
        if record.status == "error":
            self.errors.append(f"{cell.label}: {record.error}")
        began = time.monotonic()
        write_run(self.db, record)
        self.write_s += time.monotonic() - began
        if cell.k is None and record.generation is not None:
            self.baselines[key] = (record.run_id, record.generation.output_tokens)


def unbatched(key: tuple) -> tuple:
    """A baseline key at batch size 1: the same prompt, decoding, device and dtype, decoded alone."""
    return tuple({**dict(zip(BASELINE_KEY, key, strict=True)), "batch_size": 1, "batch_slot": 0}.values())
