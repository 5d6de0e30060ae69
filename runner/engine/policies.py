"""Draft-length policies: how many drafts each round proposes.

The round does not change: `generate` asks the policy's schedule for k before every round and tells it the outcome
after, and `rounds.k` records what each round proposed.

- `fixed`: k drafts every round (the sweep's k); what every run did before policies existed.
- `heuristic`, `heuristic:<cap>`: transformers' `num_assistant_tokens_schedule="heuristic"`: start at the sweep's k;
  +2 after a round whose drafts were all accepted, −1 after any other; never below 1 nor above the cap (default
  `CAP`, or the start k if larger; transformers has no cap). A round that proposed nothing (prompt lookup
  found no match) leaves k as it was: it says nothing about the draft.
- `auto`, `auto:<cap>`: each round, the k in [1, cap] with the most expected tokens per second: from this
  generation's acceptance at each draft position and its seconds per drafted token so far, and the target's verify
  seconds at each width measured over every round the loaded pair has run (`VerifyCosts`: a device's curve, not
  a prompt's). The k advisor's model (`runner/store/advisor.py`), run online. It starts at the sweep's k.
- `confidence:<t>`: up to k drafts, but a model, layer-skip or EAGLE-head draft stops drafting after a draft whose top
  probability is below t (transformers' `assistant_confidence_threshold`, kept fixed). That draft is still proposed:
  it is already computed, and one more token in the verify pass costs little. Prompt lookup has no probabilities,
  so it cannot take this policy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from runner.records import Round

CAP = 16  # heuristic and auto: transformers' schedule grows k without bound; a long run of full acceptances stops here
FLOOR = 1  # the heuristic never drafts fewer than one token a round (as transformers)
GROW, SHRINK = 2, 1  # transformers' steps after a fully accepted round and after any other
# auto: a position's acceptance starts from the pooled acceptance of every position, worth PRIOR rounds; a verify
# width never measured costs the nearest measured one plus SLOPE of it per token (a CPU pass grows with its width,
# a GPU one barely) until it is measured.
PRIOR, SLOPE = 2.0, 0.2


class Schedule(Protocol):
    """The state of a policy over one generation."""

    def next_k(self) -> int:
        """Drafts to ask for in the next round (the budget may cut it)."""

    def observe(self, proposed: int, accepted: int) -> None:
        """The round's outcome: how deep it drafted (`rounds.depth`: k for a chain) and how many it accepted."""

    def timed(self, round: Round) -> None:
        """A round's draft and verify seconds, once its clock marks can be read (on CUDA, a round or so later)."""


class Fixed:
    """k every round."""

    def __init__(self, k: int) -> None:
        self.k = k

    def next_k(self) -> int:
        return self.k

    def observe(self, proposed: int, accepted: int) -> None:
        pass

    def timed(self, round: Round) -> None:
        pass


class Heuristic:
    """+GROW after a fully accepted round, −SHRINK after any other, within [FLOOR, cap]."""

    def __init__(self, start: int, cap: int) -> None:
        self.k = start
        self.cap = max(cap, start)

    def next_k(self) -> int:
        return self.k

    def observe(self, proposed: int, accepted: int) -> None:
        if proposed == 0:
            return
        step = GROW if accepted == proposed else -SHRINK
        self.k = min(self.cap, max(FLOOR, self.k + step))

    def timed(self, round: Round) -> None:
        pass


class VerifyCosts:
    """The target's verify seconds per width (drafts carried) over every round of every generation that shares it:
    a `Pair` keeps one for its target, device and kernels."""

    def __init__(self) -> None:
        self.sums: dict[int, list[float]] = {}  # width -> [seconds, rounds]
        self.means: dict[int, float] = {}  # width -> seconds per round, kept with the sums: read 16 times a round

    def add(self, width: int, seconds: float) -> None:
        total, rounds = self.sums.get(width, (0.0, 0))
        self.sums[width] = [total + seconds, rounds + 1]
        self.means[width] = (total + seconds) / (rounds + 1)

    def seconds(self, width: int) -> float:
        """The mean measured at `width`; between two measured widths, the line through them; outside, the nearest
        one plus SLOPE of it per token."""
        means = self.means
        if width in means:
            return means[width]
        below, above = [w for w in means if w < width], [w for w in means if w > width]
        if below and above:
            lo, hi = max(below), min(above)
            return means[lo] + (means[hi] - means[lo]) * (width - lo) / (hi - lo)
        nearest = max(below) if below else min(above)
        return means[nearest] * (1 + SLOPE * (width - nearest))


class Auto:
    """The k in [FLOOR, cap] that maximises (1 + Σ_{i≤k} Π_{j≤i} r_j) / (k·d + v(k)): r_j the acceptance at
    position j once reached and d the seconds per drafted token in this generation, v(w) the shared verify costs."""

    def __init__(self, start: int, cap: int, costs: VerifyCosts) -> None:
        self.k = start
        self.cap = max(cap, start)
        self.costs = costs
        self.reached, self.accepted = [0] * (self.cap + 1), [0] * (self.cap + 1)  # per position 1..cap
        self.drafted, self.draft_s = 0, 0.0

    def next_k(self) -> int:
        return self.k

    def observe(self, proposed: int, accepted: int) -> None:
        for i in range(1, min(accepted + 1, proposed) + 1):
            self.reached[i] += 1
            self.accepted[i] += i <= accepted

    def timed(self, round: Round) -> None:
        self.drafted += round.k
        self.draft_s += round.draft_s
        self.k = self.best()

    def best(self) -> int:
        pooled = (sum(self.accepted) + 1) / (sum(self.reached) + 2)
        token_s = self.draft_s / self.drafted if self.drafted else 0.0
        emitted, reach, best, best_rate = 1.0, 1.0, self.k, 0.0
        for k in range(FLOOR, self.cap + 1):
            reach *= (self.accepted[k] + PRIOR * pooled) / (self.reached[k] + PRIOR)
            emitted += reach
            rate = emitted / (k * token_s + self.costs.seconds(k))
            if rate > best_rate:
                best, best_rate = k, rate
        return best


@dataclass(frozen=True)
class PolicySpec:
    """A parsed `--k-policy` value."""

    text: str  # as the user wrote it, recorded in runs.k_policy
    kind: str  # 'fixed' | 'heuristic' | 'auto' | 'confidence'
    cap: int | None = None  # heuristic, auto: the largest k it may reach
    threshold: float | None = None  # confidence: a draft model stops after a draft less likely than this

    def schedule(self, k: int, costs: VerifyCosts) -> Schedule:
        """A fresh schedule for one generation at the sweep's k."""
        if self.kind == "heuristic":
            return Heuristic(k, self.cap)
        return Auto(k, self.cap, costs) if self.kind == "auto" else Fixed(k)

    def applies_to(self, draft_kind: str) -> bool:
        """Whether a draft of this kind can follow the policy: confidence needs the draft's probabilities."""
        return self.kind != "confidence" or draft_kind in ("layerskip", "model", "eagle")

    def refusal(self, draft: str) -> str:
        return (f'k-policy "{self.text}" needs a draft with probabilities (layerskip, model or eagle); '
                f'"{draft}" has none')


FIXED = PolicySpec("fixed", "fixed")


def warm_ks(ks: Iterable[int], policies: Iterable[PolicySpec]) -> tuple[int, ...]:
    """The draft lengths a warm-up runs: every k, and each policy's cap (the widest verify pass it may reach)."""
    return tuple(sorted({*ks, *(p.cap for p in policies if p.cap)}))


def parse_policy(text: str) -> PolicySpec:
    """`fixed`, `heuristic[:<cap>]`, `auto[:<cap>]` or `confidence:<t>` with 0 < t < 1; ValueError otherwise."""
    kind, _, arg = text.partition(":")
    if text == FIXED.text:
        return FIXED
    if kind in ("heuristic", "auto") and not arg:
        return PolicySpec(text, kind, cap=CAP)
    if kind in ("heuristic", "auto") and arg.isdigit() and int(arg) >= 1:
        return PolicySpec(text, kind, cap=int(arg))
    if kind == "confidence" and _fraction(arg):
        return PolicySpec(text, kind, threshold=float(arg))
    raise ValueError(f'unknown k-policy "{text}"; use fixed, heuristic, heuristic:<cap>, auto, auto:<cap> or '
                     "confidence:<t> with 0 < t < 1")


def _fraction(text: str) -> bool:
    try:
        return 0 < float(text) < 1
    except ValueError:
        return False
