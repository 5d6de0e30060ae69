"""How many nodes a tree drafts per round, when the user gives no `:nodes=N`: measured per pair, as EAGLE-2 picks its
total tokens by timing.

A wider tree accepts more per round (τ grows with N, ever more slowly) and costs a wider verify pass (flat on a GPU
up to dozens of rows, ~×1.6 at 16 rows and steeper after on two CPU cores). Which N pays depends on the target, the
device, the kernels, the threads, the drafter and the batch size, so the pair measures it once per drafter, depth
and batch size: a short greedy generation on the warm-up prompt at each candidate N (at batch B, B copies of it
decoded together, so that the pass is as wide as the batch's), scored by tokens per second of drafting and
verifying, τ(N) / (median round seconds), among the N whose τ beats every smaller N's. τ is exact for that prompt
(greedy is deterministic); the median keeps one slow round from deciding. The best N is used for every generation of
that drafter, depth and batch size, greedy or sampled, and recorded with each run (`runs.tree_nodes`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace

from runner.engine.drafters.spec import DraftSpec
from runner.engine.round.decoding_rule import Decoding
from runner.records import Generation

CANDIDATES = (4, 8, 16, 32, 63)  # nodes per round tried: verify passes of 5 to 64 rows
TOKENS = 32  # new tokens per trial: about a dozen rounds at τ ≈ 2.5
GREEDY = Decoding("greedy", 0.0, 1.0)


@dataclass(frozen=True)
class Trial:
    nodes: int
    tau: float  # tokens per round: accepted + the correction or bonus
    round_s: float  # the median round's draft + verify seconds

    @property
    def rate(self) -> float:
        return self.tau / self.round_s


def score(nodes: int, rounds: list[tuple[int, float]]) -> Trial:
    """One trial from its rounds' (tokens emitted, draft + verify seconds); a batch's round: every member's tokens,
    every member's drafting and the one shared pass."""
    return Trial(nodes, sum(e for e, _ in rounds) / len(rounds), statistics.median(s for _, s in rounds))


def best(trials: list[Trial]) -> int:
    """The N with the most tokens per second among those whose τ beats every smaller N's, the smaller N of a tie.
    Nodes that accept nothing more cannot pay for their rows (prompt lookup's trie often has fewer branches than N
    allows, and is then the same tree at every N), so a faster time for them is noise."""
    ordered = sorted(trials, key=lambda t: t.nodes)
    gaining = [t for i, t in enumerate(ordered) if all(t.tau > smaller.tau for smaller in ordered[:i])]
    return max(gaining, key=lambda t: (t.rate, -t.nodes)).nodes


# What is measured: the draft at N nodes decoding `tokens` new tokens -> the generations of that decoding, one alone
# or a batch's members (decoded together, so that the pass is as wide as a batch's); the caller binds the prompt, the
# depth and the batch size
Decode = Callable[[DraftSpec, Decoding, int], list[Generation]]


def measure(decode: Decode, spec: DraftSpec, tokens: int = TOKENS) -> list[Trial]:
    """Each candidate N: one untimed round (the new verify width's one-time costs), then `tokens` new tokens timed,
    greedy."""
    trials = []
    for nodes in CANDIDATES:
        sized = replace(spec, nodes=nodes)
        decode(sized, GREEDY, min(2, tokens))
        members = [g.rounds for g in decode(sized, GREEDY, tokens)]
        rounds = [(sum(r.emitted for r in shared), sum(r.draft_s for r in shared) + shared[0].verify_s)
                  for shared in zip(*members, strict=False)]  # round j of every member: one shared pass
        if rounds:
            trials.append(score(nodes, rounds))
    return trials


def line(text: str, k: int, batch: int, trials: list[Trial]) -> str:
    """What was measured, for people: the N chosen and every N's tokens per second."""
    rates = ", ".join(f"{t.nodes}: {t.rate:.1f}" for t in trials)
    at = f"k={k}" if batch == 1 else f"k={k}, batch {batch}"
    return f"{text} at {at}: {best(trials)} nodes per round, measured ({rates} tokens/s of drafting and verifying)"
