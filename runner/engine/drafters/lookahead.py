"""`lookahead:W,N,G`: lookahead decoding (Fu et al., 2024; the reference implementation is hao-ai-lab's
LookaheadDecoding, "LADE"). No draft model and no training: the target itself, fed a window of guesses beside its
real input, runs Jacobi iterations whose trajectories yield n-grams, and the n-grams that start with the newest
committed token are verified as drafts in the same pass.

The window is N-1 levels of W columns. Column 0 of level 0 is the root (the newest committed token); level 0 holds W-1
more tokens, levels 1..N-2 hold W. Token (level l, column c) has parent (l-1, c), and on level 0 the token before it,
so the window is a tree under the root with (l, c) at depth l + c: the tree mask then gives exactly LADE's attention
mask (each row sees the root, level 0 up to its own column and its own column below it) and its positions (root
position + l + c). Every round:

1. verification branch: the pool's n-grams whose first token is the root (at most G), their other N-1 tokens cut
   to the round's k, merged as a trie: the drafts (judged as any tree is: greedy, the deepest agreeing path;
   sampling, SpecInfer's rule on point masses, as LADE's sampler does);
2. lookahead branch: the window, fed after the drafts as extra rows (`Draft.extra`), never judged nor counted;
3. from the target's argmax at the top level's rows (the Jacobi step, greedy even when sampling, as in LADE), each
   column c gives one n-gram for the pool: its level-0 token (the root for c = 0), its tokens on levels 1..N-2 and
   the new output (LADE's `update_token_map`);
4. the window moves one level down whatever the round accepted (LADE's ALWAYS_FWD_ONE): level 1 without its column 0
   becomes level 0 (the next root takes that column), each level above moves down, the outputs become the top level.

It starts as LADE starts it: level 0 is W+N-3 tokens drawn at random from the prompt (`copy_from`; seeded here, so a
run depends on its text alone), and for N-2 rounds each round's outputs become a new level (all but the first, once
there are two levels) while every level loses its first column, until the window holds N-1 levels of W (W-1 on
level 0).

The pool keeps, per first token, at most G n-grams, most recently added last: adding one already there moves it last,
adding one to a full key drops its oldest (LADE's `GUESS_SET_SIZE` lists). As LADE's POOL_FROM_PROMPT (which its
evaluation scripts switch on), every N-gram of the prompt and of the committed text is added too, so text that
repeats is guessed as prompt lookup would guess it.

Where this departs from LADE: the prefill is the baseline's (one pass over the prompt, no window), so the window's
fill starts at round 0; guesses are verified from round 0 (LADE waits for the full window; the prompt's n-grams are
there at once); a guess accepted to its end earns the bonus token (LADE's compare loop stops one short); EOS tokens
in the window are kept (LADE's sampler resets them, against fp16 overflow).
"""

from __future__ import annotations

import random

import torch
from torch import Tensor

from runner.engine.round.draft import Draft
from runner.engine.round.sampling import Ranked, host
from runner.engine.round.trees import ROOT, as_parents, trie
from runner.engine.weights.kernels import MAX_ROWS

DEFAULT = (7, 5, 7)  # W, N, G: LADE's README setting for a 7B model (LEVEL=5, WINDOW_SIZE=7, GUESS_SET_SIZE=7)
SEED = 10  # the window's first tokens are drawn from the prompt with this seed (LADE's first release seeds 10)


def pass_rows(window: int, ngram: int, guesses: int) -> int:
    """The widest verify pass: the window at its widest, the root included (during the fill f + 1 levels of
    W + N - 2 - f columns), and every guess's N - 1 tokens apart; at most (N - 1)(W + G) once N - 1 <= W."""
    span = window + ngram - 2
    return max((f + 1) * (span - f) for f in range(ngram - 1)) + guesses * (ngram - 1)


def parse(arg: str) -> tuple[int, int, int]:
    """`W,N,G` (empty: the default) as three whole numbers; ValueError for a malformed setting, N < 3, or a pass
    wider than the skinny kernels' MAX_ROWS rows."""
    if not arg:
        return DEFAULT
    parts = arg.split(",")
    if len(parts) != 3 or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f'lookahead:{arg}: use lookahead:W,N,G, three whole numbers >= 1 (default '
                         f'{",".join(map(str, DEFAULT))})')
    window, ngram, guesses = (int(p) for p in parts)
    if ngram < 3:
        raise ValueError(f"lookahead:{arg}: the n-gram size N must be at least 3 (a window of N - 1 >= 2 levels)")
    if (rows := pass_rows(window, ngram, guesses)) > MAX_ROWS:
        raise ValueError(f"lookahead:{arg}: a verify pass of up to {rows} rows (window and {guesses} guesses of "
                         f"{ngram - 1}); at most {MAX_ROWS}")
    return window, ngram, guesses


def window_rows(levels: list[list[int]], base: int) -> tuple[list[int], list[int]]:
    """The window as extra rows after `base` draft nodes: level 0, then each level up, column by column; each row's
    parent in node ids (extra row e is node base + e, -1 the root)."""
    tokens: list[int] = []
    parents: list[int] = []
    below = [ROOT]  # the ids of the level below, by column: level 0's column 0 is the root
    for token in levels[0]:
        parents.append(below[-1])
        below.append(base + len(tokens))
        tokens.append(token)
    for level in levels[1:]:
        ids = []
        for column, token in enumerate(level):
            parents.append(below[column])
            ids.append(base + len(tokens))
            tokens.append(token)
        below = ids
    return tokens, parents


class LookaheadDrafter:
    """Lookahead decoding's window and n-gram pool (module docstring)."""

    wants_hidden = ()
    wants_top = 1  # the target's argmax at every verify row: the window's rows are the Jacobi step's outputs

    def __init__(self, window: int, ngram: int, guesses: int) -> None:
        if window < 1 or ngram < 3 or guesses < 1:
            raise ValueError(f"lookahead needs W >= 1, N >= 3 and G >= 1, got {window}, {ngram}, {guesses}")
        self.window, self.ngram, self.guesses = window, ngram, guesses
        self.calls = 0
        self.pool: dict[int, list[tuple[int, ...]]] = {}  # first token -> the other N-1 tokens, oldest first
        self.levels: list[list[int]] = []  # the window, level 0 first (without the root)
        self.seen: list[int] = []  # the committed text
        self.root = 0  # the last pass's root
        self.fed_window = False  # whether the last pass carried the window

    def prefill(self, tokens: Tensor, hidden: Tensor | None, top: Ranked | None) -> None:
        self.pool, self.seen = {}, []
        prompt = host(tokens[:-1])
        draw = random.Random(SEED)
        self.levels = [[draw.choice(prompt) for _ in range(self.window + self.ngram - 3)]]
        self._extend(host(tokens))

    def _extend(self, new: list[int]) -> None:
        """The committed text grows by `new`; each N-gram it completes joins the pool."""
        for token in new:
            self.seen.append(token)
            if len(self.seen) >= self.ngram:
                gram = self.seen[-self.ngram :]
                self.add(gram[0], tuple(gram[1:]))

    def add(self, first: int, rest: tuple[int, ...]) -> None:
        """One n-gram into the pool: last in its key's list, the oldest dropped past G."""
        grams = self.pool.setdefault(first, [])
        if rest in grams:
            grams.remove(rest)
        elif len(grams) == self.guesses:
            del grams[0]
        grams.append(rest)

    def trie(self, k: int) -> tuple[list[int], list[int]]:
        """The root's n-grams in pool order, each cut to k tokens, merged as a trie: tokens and parents."""
        return trie(gram[:k] for gram in self.pool.get(self.root, ()))

    def propose(self, tokens: Tensor, k: int) -> Draft:
        self._extend(host(tokens[len(self.seen) :]))  # the text committed since
        self.calls += 1
        self.root = self.seen[-1]
        self.fed_window = k > 0  # the budget's last token (k = 0) is a plain pass
        if not self.fed_window:
            return Draft(tokens=tokens[:0], q=None)
        drafts, parents = self.trie(k)
        rows, row_parents = window_rows(self.levels, len(drafts))
        return Draft(tokens=_like(drafts, tokens), q=None, parents=as_parents(parents), extra=_like(rows, tokens),
                     extra_parents=tuple(row_parents))

    def accepted(self, n: int, hidden: Tensor | None, top: Ranked | None) -> None:
        if self.fed_window:
            self.step(host(top.tokens[-len(self.levels[-1]) :, 0]))  # the top level's rows are the pass's last

    def step(self, outputs: list[int]) -> None:
        """Steps 3-4: the target's argmax at the top level's rows, in column order, become n-grams (once the window
        is full) and the window's new top level."""
        levels = self.levels
        if len(levels) < self.ngram - 1:  # filling: one level more, each one column shorter
            self.levels = [level[1:] for level in levels] + [outputs[1:] if len(levels) > 1 else outputs]
            return
        for column, output in enumerate(outputs):
            first = self.root if column == 0 else levels[0][column - 1]
            self.add(first, (*(level[column] for level in levels[1:]), output))
        self.levels = [levels[1][1:], *levels[2:], outputs]


def _like(ids: list[int], tokens: Tensor) -> Tensor:
    return torch.tensor(ids, dtype=tokens.dtype, device=tokens.device)
