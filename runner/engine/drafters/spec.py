"""A parsed `--draft` value (`DraftSpec`) and the baseline's (`PLAIN`): what a cell carries, without torch; the
registry (registry.py) parses them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DraftSpec:
    """A parsed `--draft` value."""

    text: str  # as the user wrote it, e.g. 'layerskip:24'
    kind: str  # 'baseline' or a registered kind's name (`KINDS`)
    # what follows the kind, as its entry parsed it: n for ngram and ngram-tree, L for layerskip, the model spec for
    # model, the head's directory or repo id for the head drafts, 'W,N,G' for lookahead; None for recycling
    arg: str | None
    match: str | None = None  # ngram: which earlier occurrence it copies from (`NGRAM_MATCHES`)
    # a tree: its nodes per round (lookahead: at most, G guesses of N - 1); None for a sized tree given no :nodes=N,
    # whose pair measures its own (`Pair.nodes_for`)
    nodes: int | None = None

    @property
    def baseline(self) -> bool:
        return self.kind == "baseline"


PLAIN = DraftSpec("none", "baseline", None)  # the baseline: plain decoding, no draft (runs.draft = 'none', k NULL)
