"""What a run is: a cell (a prompt, its decoding, a parsed draft and draft-length policy, k), its keys and label, the
`RunRecord` it makes, and that record judged against its baseline.

`generate`, sweeps (local and on Ray), the bench and training all take a run's identity from here. Specs arrive
parsed: the command line parses them once.
"""

from __future__ import annotations

import platform
import socket
import subprocess
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import transformers

from runner.engine import kernels, lossless, models
from runner.engine.pair import PLAIN, DraftSpec, Pair
from runner.engine.policies import FIXED, PolicySpec
from runner.engine.sampling import Decoding
from runner.prompts import Prompt
from runner.records import BASELINE_KEY, CELL_KEY, Divergence, Generation, RunRecord


@dataclass(frozen=True)
class Cell:
    """One run to make."""

    prompt: Prompt
    decoding: Decoding
    draft: DraftSpec
    k: int | None  # None for the baseline
    policy: PolicySpec = FIXED  # how each round's k is chosen from k; recorded as None for the baseline
    # A batch (runner/engine/batch.py): its prompts in order, this cell's at `slot`; () for a run alone
    batch: tuple[Prompt, ...] = ()
    slot: int = 0

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
        values = {"prompt_id": self.prompt.id, "draft": self.draft.text, "k": self.k, "mode": d.mode,
                  "temperature": d.temperature, "top_p": d.top_p, "seed": seed, "k_policy": self.k_policy,
                  "batch_size": self.batch_size, "batch_slot": self.slot}
        return tuple(values[name] for name in CELL_KEY)

    def baseline_key(self, seed: int, prompt_ids: tuple[int, ...], device: str, dtype: str) -> tuple:
        """The values of `BASELINE_KEY` that this cell's run and its baseline share, fed `prompt_ids` on that device
        and dtype: equal to `RunRecord.baseline_key` of the run it makes."""
        d = self.decoding
        values = {"prompt_id": self.prompt.id, "mode": d.mode, "temperature": d.temperature, "top_p": d.top_p,
                  "seed": seed, "prompt_tokens": tuple(prompt_ids), "device": device, "dtype": dtype,
                  "batch_size": self.batch_size, "batch_slot": self.slot}
        return tuple(values[name] for name in BASELINE_KEY)

    @property
    def baseline(self) -> Cell:
        """The plain-decoding cell this one is checked and timed against (itself for a baseline)."""
        return Cell(self.prompt, self.decoding, PLAIN, None, batch=self.batch, slot=self.slot)

    @property
    def label(self) -> str:
        """The cell as progress and reports name it."""
        policy = "" if self.k_policy in (None, FIXED.text) else f" {self.k_policy}"
        batch = f" batch={self.batch_size}" if self.batch else ""
        return f"{self.prompt.id} {self.draft.text} k={self.k}{policy} {self.decoding.mode}{batch}"


GREEDY = Decoding("greedy", 0.0, 1.0)


class PromptIds:
    """Each prompt's token ids on a loaded target, encoded once: a later turn's after the earlier turns and the
    target's answers to them, through the chat template."""

    def __init__(self, pair: Pair, max_new_tokens: int, seed: int) -> None:
        self.pair, self.max_new_tokens, self.seed = pair, max_new_tokens, seed
        self.ids: dict[str, list[int]] = {}  # prompt id -> its ids
        self.answers: dict[tuple[str, int], str] = {}  # (conversation, turn) -> the target's answer to that turn

    def __call__(self, prompt: Prompt) -> list[int]:
        if prompt.id not in self.ids:
            history = tuple((text, self.answer(prompt.thread, turn, prompt.history[:turn])) for turn, text
                            in enumerate(prompt.history, 1))
            self.ids[prompt.id] = models.encode_chat(self.pair.target, prompt.text, history)
        return self.ids[prompt.id]

    def answer(self, conversation: str, turn: int, asked: tuple[str, ...]) -> str:
        """The target's plain greedy answer to turn `turn` of a conversation whose user messages so far are `asked`:
        what a later turn is asked after. Greedy, so it is every lossless greedy run's own answer, and every run of
        a later turn (baseline, each draft and k, either mode) is fed the same ids and checked against one baseline.
        """
        if (conversation, turn) not in self.answers:
            earlier = tuple((text, self.answer(conversation, n, asked[:n])) for n, text in enumerate(asked[:-1], 1))
            ids = models.encode_chat(self.pair.target, asked[-1], earlier)
            generation = self.pair.run(PLAIN, ids, None, GREEDY, self.max_new_tokens, self.seed)
            self.answers[conversation, turn] = models.answer_text(self.pair.target, generation.output_tokens)
        return self.answers[conversation, turn]


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


def provenance(device: torch.device) -> dict[str, str]:
    """What made a run, beside its numbers: versions, host, the project's commit, the device's name."""
    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        commit = ""
    return {
        "torch_version": torch.__version__, "transformers_version": transformers.__version__,
        "python_version": platform.python_version(), "host": socket.gethostname(), "git_commit": commit,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else kernels.cpu_name(),
    }


@dataclass(frozen=True)
class RunContext:
    """What every run of one sweep (or one `generate`, one bench repeat) shares."""

    pair: Pair  # the loaded target and drafts
    target_spec: str  # the target's model spec, as given
    sweep_id: str
    seed: int  # the sampling seed, the same for a baseline and its speculative runs
    max_new_tokens: int
    provenance: dict[str, str]

    def record(self, cell: Cell, generation: Generation | None, error: str | None, started: str,
               batch_id: str | None = None) -> RunRecord:
        """One row of `runs`: a cell's generation (or its error), not yet judged against its baseline; `batch_id`
        is shared by the runs of a batch."""
        d, target = cell.decoding, self.pair.target
        return RunRecord(
            run_id=new_run_id(), sweep_id=self.sweep_id, started_at=started, target=self.target_spec,
            draft=cell.draft.text, draft_kind=cell.draft.kind, category=cell.prompt.category,
            prompt_id=cell.prompt.id, prompt_text=cell.prompt.text, k=cell.k, mode=d.mode,
            temperature=d.temperature, top_p=d.top_p, seed=self.seed, max_new_tokens=self.max_new_tokens,
            device=str(target.device), dtype=lossless.dtype_name(target.dtype), k_policy=cell.k_policy,
            status="error" if error else "ok", error=error, generation=generation,
            output_text=None if generation is None else target.tokenizer.decode(list(generation.output_tokens)),
            baseline_run_id=None, lossless=None, provenance=self.provenance, kernels=self.pair.kernels,
            threads=torch.get_num_threads(), turn=cell.prompt.turn, conversation=cell.prompt.thread,
            batch_size=cell.batch_size, batch_slot=cell.slot, batch_id=batch_id,
            tree_nodes=self.pair.nodes_for(cell.draft, cell.k, cell.batch_size),
        )

    def classify(self, prompt: tuple[int, ...], baseline: tuple[int, ...], ours: tuple[int, ...]) -> Divergence | None:
        """Where and why a greedy output differs from its baseline's (a target pass: `lossless.classify`)."""
        return lossless.classify(self.pair.target, prompt, baseline, ours)


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
