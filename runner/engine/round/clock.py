"""Time on the model's device, and a round whose times are still marks on that clock."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch

from runner.records import Round


class Clock:
    """Time on the model's device. CPU: perf_counter. CUDA: events on the device's current stream, read once the
    run has settled, so timing a round never makes the host wait for the device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"

    def mark(self) -> float | torch.cuda.Event:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def settle(self) -> None:
        """Wait for the work queued on this device (not on another GPU's, as a bare synchronize() would)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def done(self, mark: float | torch.cuda.Event) -> bool:
        """Whether the device has passed `mark`, so that `seconds` can read it without waiting."""
        return not self.cuda or mark.query()

    def seconds(self, start: float | torch.cuda.Event, end: float | torch.cuda.Event) -> float:
        """Between two marks; on CUDA only after `settle` or once `done(end)`."""
        return start.elapsed_time(end) / 1000 if self.cuda else end - start

    def __call__(self) -> float:
        """Wall time with the device's queued work done."""
        self.settle()
        return time.perf_counter()


@dataclass(frozen=True)
class Timed:
    """A round whose times are still clock marks, read once the run has settled."""

    round: Round  # draft_s and verify_s are filled in by `read`
    # start, drafted, the verify pass's start, verified; in a batch the shared pass starts after every sequence drafted
    marks: tuple

    def read(self, clock: Clock) -> Round:
        start, drafted, verifying, verified = self.marks
        return replace(self.round, draft_s=clock.seconds(start, drafted), verify_s=clock.seconds(verifying, verified))
