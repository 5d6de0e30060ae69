"""`ngram[:<n>[:<match>]]`: prompt lookup, drafting what followed an earlier occurrence of the newest tokens."""

from __future__ import annotations

from collections import deque

from torch import Tensor

from runner.engine.round.draft import Draft
from runner.engine.round.sampling import Ranked, host

NGRAM_MATCHES = ("earliest", "latest", "longest")  # which earlier occurrence prompt lookup copies from
DEFAULT_NGRAM = 3  # longest n-gram prompt lookup tries before falling back to shorter ones
DEFAULT_MATCH = "latest"  # no match rule ranked first everywhere (bench/results/notes.md)


class NgramDrafter:
    """Prompt lookup: find an earlier occurrence of the last n tokens (then n-1, … 1) in prompt + output and
    propose what followed it. Which occurrence (`match`):

    - `earliest`: the first (transformers' prompt lookup);
    - `latest`: the most recent;
    - `longest`: of the last `CANDIDATES` occurrences, the one whose preceding text agrees furthest back with the
      text before the current n-gram (up to `LOOKBACK` tokens; a tie goes to the latest): the longest match.

    An index per n-gram size keeps each lookup O(1) in the length of the text.
    """

    wants_hidden = ()
    wants_top = 0
    CANDIDATES = 16  # occurrences `longest` compares: bounded, so a lookup costs the same however long the text
    LOOKBACK = 64  # tokens of agreement `longest` counts before calling two occurrences equal

    def __init__(self, n: int, match: str = DEFAULT_MATCH) -> None:
        if match not in NGRAM_MATCHES:
            raise ValueError(f'unknown prompt-lookup match "{match}"; use one of {", ".join(NGRAM_MATCHES)}')
        self.n = n
        self.match = match
        self.calls = 0
        self.seen: list[int] = []
        # follows[m-1]: each m-gram seen -> where the continuation of its chosen occurrence starts in `seen`
        # (`longest`: of its last CANDIDATES occurrences, oldest first)
        self.follows: list[dict[tuple[int, ...], int | deque[int]]] = []

    def _index(self, index: dict, gram: tuple[int, ...], start: int) -> None:
        if self.match == "latest":
            index[gram] = start
        elif self.match == "earliest":
            index.setdefault(gram, start)
        else:
            index.setdefault(gram, deque(maxlen=self.CANDIDATES)).append(start)

    def _extend(self, new: list[int]) -> None:
        for token in new:
            j = len(self.seen)
            for m in range(1, self.n + 1):
                if j >= m:
                    self._index(self.follows[m - 1], tuple(self.seen[j - m : j]), j)
            self.seen.append(token)

    def _agreement(self, start: int, m: int) -> int:
        """How many tokens before the occurrence ending at `start` equal those before the current m-gram."""
        seen, end, n = self.seen, len(self.seen) - m, 0
        while n < self.LOOKBACK and start - m - n > 0 and seen[start - m - n - 1] == seen[end - n - 1]:
            n += 1
        return n

    def _start(self, m: int) -> int | None:
        """Where the continuation of the chosen occurrence of the last m tokens starts, if they occurred before."""
        found = self.follows[m - 1].get(tuple(self.seen[-m:]))
        if found is None or self.match != "longest":
            return found
        return max(reversed(found), key=lambda start: self._agreement(start, m))  # max keeps the first: the latest

    def prefill(self, tokens: Tensor, hidden: Tensor | None, top: Ranked | None) -> None:
        self.seen, self.follows = [], [{} for _ in range(self.n)]
        self._extend(host(tokens))

    def propose(self, tokens: Tensor, k: int) -> Draft:
        self._extend(host(tokens[len(self.seen) :]))  # the text committed since: a round's second host sync
        self.calls += 1
        for m in range(self.n, 0, -1):
            start = self._start(m)
            if start is not None and k > 0:
                # `seen` mirrors `tokens`: slicing the device copy needs no host-to-device transfer.
                return Draft(tokens=tokens[start : start + k], q=None)
        return Draft(tokens=tokens[:0], q=None)

    def accepted(self, n: int, hidden: Tensor | None, top: Ranked | None) -> None:
        pass  # the committed text arrives with the next proposal
