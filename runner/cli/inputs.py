"""The inputs both decoding commands take, checked and parsed once: the sampling knobs, kernels and threads, the
drafts and policies, and the comma-separated lists. Bad input raises `UsageError`."""

from __future__ import annotations

from runner.cli.shared import UsageError
from runner.engine.drafters.registry import applies, parse_draft, refusal
from runner.engine.drafters.spec import DraftSpec
from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.policies import PolicySpec, parse_policy
from runner.engine.weights.kernels import all_cores, parse_kernels

K_MAX = 64  # more drafts than this per round only burns draft calls


def decoding_for(mode: str, temperature: float, top_p: float) -> Decoding:
    """Validate the sampling knobs; greedy runs record temperature 0 and top-p 1, which they use."""
    decoding = Decoding(mode, temperature, top_p)
    return Decoding("greedy", 0.0, 1.0) if decoding.greedy else decoding


def check_run(kernels: str, threads: int | None, max_new_tokens: int) -> int:
    """The knobs every decoding command takes; returns the thread count to run with (every core unless given)."""
    parse_kernels(kernels)
    if threads is not None and threads < 1:
        raise UsageError(f"threads must be >= 1, got {threads}")
    if max_new_tokens < 1:
        raise UsageError(f"max-new-tokens must be >= 1, got {max_new_tokens}")
    return all_cores() if threads is None else threads


def parse_drafts(drafts: list[str], ks: list[int], policies: list[str],
                 baseline_refusal: str) -> tuple[tuple[DraftSpec, ...], tuple[PolicySpec, ...]]:
    """The drafts and policies, parsed once; refuses `none` as a draft, k outside 1..K_MAX and a set of policies
    that none of the drafts can follow."""
    specs = tuple(parse_draft(d) for d in drafts)
    if any(s.baseline for s in specs):
        raise UsageError(baseline_refusal)
    for k in ks:
        if not 1 <= k <= K_MAX:
            raise UsageError(f"k must be between 1 and {K_MAX}, got {k}")
    parsed = tuple(parse_policy(p) for p in dict.fromkeys(policies))
    if not any(applies(p, s.kind) for p in parsed for s in specs):
        raise UsageError(refusal(parsed[0], specs[0].text))
    return specs, parsed


def csv(value: str, name: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise UsageError(f"--{name} is empty")
    return items


def ints(value: str, name: str) -> list[int]:
    items = csv(value, name)
    if not all(v.lstrip("-").isdigit() for v in items):
        raise UsageError(f"--{name} must be comma-separated integers, got {value}")
    return [int(v) for v in items]


MAX_BATCH = 64  # sequences decoded together


def batch_sizes(value: str) -> tuple[int, ...]:
    """A `--batch` list: each size from 1 to MAX_BATCH, ascending, once."""
    sizes = ints(value, "batch")
    if not all(1 <= b <= MAX_BATCH for b in sizes):
        raise UsageError(f"--batch sizes must be between 1 and {MAX_BATCH}, got {value}")
    return tuple(sorted(set(sizes)))
