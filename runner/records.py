"""What one generation produces, in the explainer's terms: rounds, and the run around them.

These are the rows of the data contract (docs/reference.md): `Round` is one row of `rounds`,
`RunRecord` one row of `runs`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Round:
    """One verification round: k drafts judged by one target pass."""

    k: int  # drafts proposed this round (can be below the run's k near max_new_tokens or when ngram finds nothing)
    accepted: int  # drafts the target agreed with, left to right
    rejected: int  # 0 or 1: the first draft the target disagreed with
    thrown: int  # drafts after the rejected one, never judged; accepted + rejected + thrown == k
    bonus: bool  # all k accepted, so the target's token after the last draft is free
    emitted: int  # tokens appended: accepted + 1, fewer only when EOS or max_new_tokens cut the round
    # seconds spent proposing the drafts, and of the one target pass; None where the engine does not report them
    # (vLLM reports a step's counts only: runner/vllm/steps.py)
    draft_s: float | None
    verify_s: float | None
    draft_tokens: tuple[int, ...] | None  # d1..dk; None where the engine does not report them (vLLM)
    # greedy: the target's argmax at all k+1 positions (a tree: at the root and each node, in node order); sample: the
    # accepted drafts + the correction or bonus; None where the engine does not report them (vLLM)
    target_tokens: tuple[int, ...] | None
    # A tree's drafts (engine/round/trees.py): each node's parent (-1: the newest committed token); None for a chain.
    # Then k counts the nodes, accepted the accepted path's length, rejected is 1 when the path stopped where the tree
    # still had children to judge, and bonus means it stopped at a leaf.
    draft_parents: tuple[int, ...] | None = None
    accepted_path: tuple[int, ...] | None = None  # a tree's accepted nodes from the root down; None for a chain
    # Sampling only (None when greedy): the speculative-sampling test of every judged draft, in draft order (a tree:
    # the nodes its walk judged, docs/reference.md): p(x) the target's probability of the draft x (in a tree, of the
    # law it was tested against: the residual after a refused sibling), q(x) the draft's, u the uniform draw; x was
    # accepted iff u < p(x) / q(x), i.e. with probability min(1, p/q).
    draft_p: tuple[float, ...] | None = None
    draft_q: tuple[float, ...] | None = None
    draft_u: tuple[float, ...] | None = None
    from_residual: bool | None = None  # sampling: the round's own token was drawn from norm(max(0, p − q))
    batch_seqs: int = 1  # the sequences whose drafts the round's target pass verified (runner/engine/round/batch.py)
    extra_rows: int = 0  # rows the verify pass carried past the root and the drafts, never judged (lookahead's window)

    @property
    def pass_rows(self) -> int:
        """Rows this sequence fed the verify pass: the newest committed token, the k drafts and any extra rows
        (`rounds.pass_rows`; in a batch the shared pass is as wide as its widest member's)."""
        return 1 + self.k + self.extra_rows

    @property
    def depth(self) -> int:
        """The draft's deepest level: k for a chain, the longest branch for a tree (`rounds.depth`)."""
        return self.k if self.draft_parents is None else tree_depth(self.draft_parents)


def tree_depth(parents: tuple[int, ...] | list[int]) -> int:
    """The longest branch of a tree given by its nodes' parents (-1: the root), a parent before its children."""
    levels: list[int] = []
    for parent in parents:
        levels.append(1 if parent < 0 else levels[parent] + 1)
    return max(levels, default=0)


@dataclass(frozen=True)
class Generation:
    """The result of decoding one prompt, speculative or plain."""

    prompt_tokens: tuple[int, ...]  # the exact ids fed to the model
    output_tokens: tuple[int, ...]  # new tokens only: the prefill's, then each round's emitted tokens
    rounds: tuple[Round, ...]
    prefill_s: float  # the target pass over the prompt, which makes the first new token, and the drafter's
    wall_s: float  # prefill to the last token, everything included
    draft_calls: int  # forward passes of a draft model; lookups for ngram; 0 for plain decoding
    stop_reason: str  # 'eos' | 'max_new_tokens'
    # What an engine that is not ours reports of the request itself (vLLM): its time to first token, and its own
    # account of the speculative decoding as JSON (`RunRecord.engine_report`); None for ours
    ttft_s: float | None = None
    report: str | None = None

    @property
    def target_passes(self) -> int:
        return len(self.rounds) + 1  # every round verifies in one pass, plus the prefill

    @property
    def draft_s(self) -> float | None:
        return _total(r.draft_s for r in self.rounds)

    @property
    def verify_s(self) -> float | None:
        return _total(r.verify_s for r in self.rounds)


def _total(seconds: Iterable[float | None]) -> float | None:
    """The sum, or None when any is unknown (an engine that does not time its rounds): a part is not the whole."""
    values = list(seconds)
    return None if None in values else sum(values)


@dataclass(frozen=True)
class Divergence:
    """The first token where a greedy speculative output differs from its baseline's."""

    at: int  # index into output_tokens
    gap: float  # the target's top-1 minus top-2 logit there, recomputed
    tolerance: float  # logits: the dtype's tolerance (runner/engine/round/lossless.py) · the position's max |logit|
    kind: str  # 'tie': both contested tokens within the tolerance of the best logit; else 'real'


# The columns of `runs` that make a cell of a sweep: a resumed sweep records only the cells it has no 'ok' run for.
# The engine is part of both: a resumed sweep is per engine, and a vLLM run is never judged against our baseline.
CELL_KEY = ("engine", "prompt_id", "draft", "k", "mode", "temperature", "top_p", "seed", "k_policy", "batch_size",
            "batch_slot", "repeat")
# The columns a run shares with the plain-decoding run of its sweep it is checked and timed against: the same engine
# and prompt ids (a chat template that stamps the date changes them), decoding, seed, device and dtype, and its place
# in a batch of the same size (the baseline at batch B decodes the same B prompts together, plainly), and the same
# repeat (its neighbour in time: a repeated cell's speedup is a ratio of runs made one after the other).
BASELINE_KEY = ("engine", "prompt_id", "mode", "temperature", "top_p", "seed", "prompt_tokens", "device", "dtype",
                "batch_size", "batch_slot", "repeat")


@dataclass(frozen=True)
class RunRecord:
    """One row of `runs`: a generation with everything needed to reproduce and compare it."""

    run_id: str
    sweep_id: str
    started_at: str  # ISO-8601, UTC
    target: str  # the target's model spec, as given
    draft: str  # drafter spec; 'none' for a plain-decoding baseline
    draft_kind: str  # 'baseline' | 'model' | 'ngram' | 'layerskip' | 'eagle' | 'medusa' | a tree (drafters/registry.py)
    category: str
    prompt_id: str
    prompt_text: str
    k: int | None  # None for the baseline
    mode: str  # 'greedy' | 'sample'
    temperature: float
    top_p: float
    seed: int
    max_new_tokens: int
    device: str
    dtype: str
    status: str  # 'ok' | 'error'
    error: str | None
    generation: Generation | None  # None when status == 'error'
    output_text: str | None
    baseline_run_id: str | None
    lossless: bool | None  # greedy only: output equals the baseline's token for token
    kernels: str | None = None  # the linears' path: 'skinny' (measured per shape) or 'stock'; None: not recorded
    threads: int | None = None  # torch's CPU threads during the run
    provenance: dict[str, str] = field(default_factory=dict)  # torch/transformers/python versions, host, git commit
    # where a greedy output first differs from its baseline's (runner/engine/round/lossless.py): index, the target's
    # top-2 logit gap there, the tolerance in logits, and 'tie' | 'real'; all None when lossless or not judged
    divergence_at: int | None = None
    divergence_gap: float | None = None
    divergence_tolerance: float | None = None
    divergence: str | None = None
    # The sweep's workers on this run's host while it ran, itself included: 1 alone; more share the memory bandwidth.
    concurrent_workers: int = 1
    k_policy: str | None = None  # how each round's k was chosen from k (engine/round/policies.py); None for baselines
    turn: int = 1  # 1-based turn of its conversation: turn n's prompt holds the earlier turns and their answers
    conversation: str | None = None  # the question the turn belongs to (Spec-Bench's question_id); else prompt_id
    batch_size: int = 1  # the sequences decoded together with it, itself included (runner/engine/round/batch.py)
    batch_slot: int = 0  # its place in that batch
    batch_id: str | None = None  # shared by the runs of one batch; None at batch 1
    tree_nodes: int | None = None  # a tree's nodes per round at most (`:nodes=N`, or its pair's measured best)
    repeat: int = 0  # which repetition of its cell (`sweep --repeats N`): 0 .. N-1
    engine: str = "specdash"  # what decoded it: 'specdash' (ours) or 'vllm' (runner/vllm/)
    engine_version: str | None = None  # the engine's version where it is not this project's (vLLM's)
    engine_config: str | None = None  # vLLM: the exact speculative config it ran, as JSON ('null': plain decoding)
    ttft_s: float | None = None  # vLLM: its time to first token (scheduled to first token); ours: see prefill_s
    # vLLM: its own account of the request's speculative decoding as it returned it (`metrics.speculative_decoding`,
    # JSON: mean_acceptance_length, draft_acceptance_rate, the per-step arrays, …); None for ours and plain decoding
    engine_report: str | None = None

    def cell_key(self) -> tuple:
        return tuple(getattr(self, name) for name in CELL_KEY)

    def baseline_key(self) -> tuple | None:
        """The run's values of `BASELINE_KEY`; None for an error run, which fed the model no recorded prompt."""
        if self.generation is None:
            return None
        values = {name: getattr(self, name) for name in BASELINE_KEY if name != "prompt_tokens"}
        return tuple(self.generation.prompt_tokens if name == "prompt_tokens" else values[name]
                     for name in BASELINE_KEY)

    @property
    def mismatch(self) -> Divergence | None:
        """Where and why a greedy output differs from its baseline's; None when lossless or not judged."""
        if self.divergence is None:
            return None
        return Divergence(self.divergence_at, self.divergence_gap, self.divergence_tolerance, self.divergence)


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where the sequences differ (the shorter one's end counts), or None when equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
