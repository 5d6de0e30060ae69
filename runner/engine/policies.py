"""Draft-length policies: how many drafts each round proposes.

The round does not change: `generate` asks the policy's schedule for k before every round and tells it the outcome
after, and `rounds.k` records what each round proposed.

- `fixed`: k drafts every round (the sweep's k); what every run did before policies existed.
- `heuristic`, `heuristic:<cap>`: transformers' `num_assistant_tokens_schedule="heuristic"`: start at the sweep's k;
  +2 after a round whose drafts were all accepted, −1 after any other; never below 1 nor above the cap (default
  `HEURISTIC_CAP`, or the start k if larger; transformers has no cap). A round that proposed nothing (prompt lookup
  found no match) leaves k as it was: it says nothing about the draft.
- `confidence:<t>`: up to k drafts, but a model, layer-skip or EAGLE-head draft stops drafting after a draft whose top
  probability is below t (transformers' `assistant_confidence_threshold`, kept fixed). That draft is still proposed:
  it is already computed, and one more token in the verify pass costs little. Prompt lookup has no probabilities,
  so it cannot take this policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

HEURISTIC_CAP = 16  # transformers' schedule grows k without bound; a long run of full acceptances stops here
FLOOR = 1  # the heuristic never drafts fewer than one token a round (as transformers)
GROW, SHRINK = 2, 1  # transformers' steps after a fully accepted round and after any other


class Schedule(Protocol):
    """The state of a policy over one generation."""

    def next_k(self) -> int:
        """Drafts to ask for in the next round (the budget may cut it)."""

    def observe(self, proposed: int, accepted: int) -> None:
        """The round's outcome: drafts proposed (`rounds.k`) and accepted."""


class Fixed:
    """k every round."""

    def __init__(self, k: int) -> None:
        self.k = k

    def next_k(self) -> int:
        return self.k

    def observe(self, proposed: int, accepted: int) -> None:
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


@dataclass(frozen=True)
class PolicySpec:
    """A parsed `--k-policy` value."""

    text: str  # as the user wrote it, recorded in runs.k_policy
    kind: str  # 'fixed' | 'heuristic' | 'confidence'
    cap: int | None = None  # heuristic: the largest k it may reach
    threshold: float | None = None  # confidence: a draft model stops after a draft less likely than this

    def schedule(self, k: int) -> Schedule:
        """A fresh schedule for one generation at the sweep's k."""
        return Heuristic(k, self.cap) if self.kind == "heuristic" else Fixed(k)

    def applies_to(self, draft_kind: str) -> bool:
        """Whether a draft of this kind can follow the policy: confidence needs the draft's probabilities."""
        return self.kind != "confidence" or draft_kind in ("layerskip", "model", "eagle")

    def refusal(self, draft: str) -> str:
        return (f'k-policy "{self.text}" needs a draft with probabilities (layerskip, model or eagle); '
                f'"{draft}" has none')


FIXED = PolicySpec("fixed", "fixed")


def parse_policy(text: str) -> PolicySpec:
    """`fixed`, `heuristic`, `heuristic:<cap>` or `confidence:<t>` with 0 < t < 1; ValueError otherwise."""
    kind, _, arg = text.partition(":")
    if text == FIXED.text:
        return FIXED
    if kind == "heuristic" and not arg:
        return PolicySpec(text, kind, cap=HEURISTIC_CAP)
    if kind == "heuristic" and arg.isdigit() and int(arg) >= 1:
        return PolicySpec(text, kind, cap=int(arg))
    if kind == "confidence" and _fraction(arg):
        return PolicySpec(text, kind, threshold=float(arg))
    raise ValueError(f'unknown k-policy "{text}"; use fixed, heuristic, heuristic:<cap> or confidence:<t> '
                     "with 0 < t < 1")


def _fraction(text: str) -> bool:
    try:
        return 0 < float(text) < 1
    except ValueError:
        return False
