"""What a run is: a cell (a prompt, its decoding, a parsed draft and draft-length policy, k), its keys and label, and
its `RunRecord` judged against its baseline (runner/engines.py's `RunContext` makes the record).

`generate`, sweeps (local and on Ray), the bench and training all take a run's identity from here. Specs arrive
parsed: the command line parses them once.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from runner.engine.drafters.spec import PLAIN, DraftSpec
from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.policies import FIXED, PolicySpec
from runner.prompts import Prompt
from runner.records import BASELINE_KEY, CELL_KEY, Divergence, RunRecord


@dataclass(frozen=True)
class Cell:
    """One run to make."""

    prompt: Prompt
    decoding: Decoding
    draft: DraftSpec
    k: int | None  # None for the baseline
    policy: PolicySpec = FIXED  # how each round's k is chosen from k; recorded as None for the baseline
    # A batch (runner/engine/round/batch.py): its prompts in order, this cell's at `slot`; () for a run alone
    batch: tuple[Prompt, ...] = ()
    slot: int = 0
    repeat: int = 0  # which repetition of the cell (`sweep --repeats N`); its baseline is the same repetition's
    engine: str = "specdash"  # what decodes it: ours, or 'vllm' (runner/vllm/); part of its key and its baseline's

    @property
    def batch_size(self) -> int:
        return len(self.batch) or 1

    def mate(self, slot: int) -> Cell:
        """The cell of the same batch at `slot`: decoded in the same passes, with the same draft, k and policy."""
        return replace(self, prompt=self.batch[slot], slot=slot)

    @property
    def k_policy(self) -> str | None:
        """The value of `runs.k_policy`."""
        return None if self.k is None else self.policy.text

    def key(self, seed: int) -> tuple:
        """The cell's values of `CELL_KEY`, in its order."""
        d = self.decoding
        values = {"engine": self.engine, "prompt_id": self.prompt.id, "draft": self.draft.text, "k": self.k,
                  "mode": d.mode, "temperature": d.temperature, "top_p": d.top_p, "seed": seed,
                  "k_policy": self.k_policy, "batch_size": self.batch_size, "batch_slot": self.slot,
                  "repeat": self.repeat}
        return tuple(values[name] for name in CELL_KEY)

    def baseline_key(self, seed: int, prompt_ids: tuple[int, ...], device: str, dtype: str) -> tuple:
        """The values of `BASELINE_KEY` that this cell's run and its baseline share, fed `prompt_ids` on that device
        and dtype: equal to `RunRecord.baseline_key` of the run it makes."""
        d = self.decoding
        values = {"engine": self.engine, "prompt_id": self.prompt.id, "mode": d.mode, "temperature": d.temperature,
                  "top_p": d.top_p, "seed": seed, "prompt_tokens": tuple(prompt_ids), "device": device, "dtype": dtype,
                  "batch_size": self.batch_size, "batch_slot": self.slot, "repeat": self.repeat}
        return tuple(values[name] for name in BASELINE_KEY)

    @property
    def baseline(self) -> Cell:
        """The plain-decoding cell this one is checked and timed against (itself for a baseline)."""
        return Cell(self.prompt, self.decoding, PLAIN, None, batch=self.batch, slot=self.slot, repeat=self.repeat,
                    engine=self.engine)

    @property
    def label(self) -> str:
        """The cell as progress and reports name it."""
        policy = "" if self.k_policy in (None, FIXED.text) else f" {self.k_policy}"
        batch = f" batch={self.batch_size}" if self.batch else ""
        repeat = f" repeat={self.repeat}" if self.repeat else ""
        engine = "" if self.engine == "specdash" else f" on {self.engine}"
        return f"{self.prompt.id} {self.draft.text} k={self.k}{policy} {self.decoding.mode}{batch}{repeat}{engine}"


def check_fit(lengths: Sequence[tuple[str, int]], max_new_tokens: int, context: int) -> None:
    """ValueError naming the first prompt (id, tokens) whose tokens + `max_new_tokens` pass `context`, with its
    lengths and how many more do. A prompt is refused before anything runs, never truncated: `generate` and `sweep`
    both say it in this one line."""
    over = [(prompt_id, n) for prompt_id, n in lengths if n + max_new_tokens > context]
    if not over:
        return
    (prompt_id, n), more = over[0], len(over) - 1
    others = f" (and {more} more prompt{'s' if more > 1 else ''})" if more else ""
    raise ValueError(f'prompt "{prompt_id}" ({n:,} tokens) + max-new-tokens ({max_new_tokens:,}) exceeds the '
                     f"model's context of {context:,} tokens{others}; nothing is truncated: leave it out or lower "
                     "--max-new-tokens")


def new_run_id() -> str:
    return uuid.uuid4().hex[:16]


Classify = Callable[[tuple[int, ...], tuple[int, ...], tuple[int, ...]], Divergence | None]
Baseline = tuple[str, tuple[int, ...]]  # a recorded baseline's (run_id, output tokens)


def judge(record: RunRecord, baseline: Baseline | None, classify: Classify) -> RunRecord:
    """The record linked to its baseline (an error run too), and `checked` against the baseline's output."""
    if baseline is None:
        return record
    return checked(replace(record, baseline_run_id=baseline[0]), baseline[1], classify)


def checked(record: RunRecord, expected: tuple[int, ...], classify: Classify) -> RunRecord:
    """Greedy only: the output must equal `expected` (plain greedy decoding's) token for token, and where it does
    not, `classify(prompt, expected, ours)` says whether the first difference is a numeric tie or a real
    divergence."""
    gen = record.generation
    if record.mode != "greedy" or gen is None:
        return record
    divergence = None if gen.output_tokens == expected else classify(gen.prompt_tokens, expected, gen.output_tokens)
    return replace(record, lossless=divergence is None, divergence_at=divergence and divergence.at,
                   divergence_gap=divergence and divergence.gap,
                   divergence_tolerance=divergence and divergence.tolerance,
                   divergence=divergence and divergence.kind)
