"""Prompt lookup's match choice: what `earliest`, `latest` and `longest` propose on hand-written token lists."""

from __future__ import annotations

import pytest
import torch

from runner.engine.drafters.ngram import DEFAULT_MATCH, NgramDrafter
from runner.engine.drafters.registry import parse_draft

# index:  0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 16 17
TEXT = [1, 2, 3, 9, 4, 1, 2, 3, 8, 5, 2, 3, 7, 6, 4, 1, 2, 3]
# The last bigram (2, 3) occurred at 1-2 (then 9, 4, 1), 6-7 (then 8, 5, 2) and 10-11 (then 7, 6, 4). Before the
# current one come 4, 1 (indices 14-15); before 1-2 comes 1 (one token agrees, then the text starts), before 6-7
# come 4, 1 (two agree; 9 ≠ 6 ends it), before 10-11 comes 5 (none agree).


def proposed(text: list[int], n: int, match: str, k: int = 3) -> list[int]:
    drafter = NgramDrafter(n, match)
    tokens = torch.tensor(text)
    drafter.prefill(tokens, None, None)
    return drafter.propose(tokens, k).tokens.tolist()


@pytest.mark.parametrize(("match", "expected"), [
    ("earliest", [9, 4, 1]),  # transformers' prompt lookup: the first occurrence
    ("latest", [7, 6, 4]),  # the most recent occurrence
    ("longest", [8, 5, 2]),  # the occurrence whose preceding text agrees furthest back
])
def test_each_match_proposes_what_followed_its_occurrence(match, expected):
    assert proposed(TEXT, 2, match) == expected


def test_longest_breaks_a_tie_towards_the_latest():
    # (2, 3) at 1-2 and 5-6, each preceded by a 1 that agrees with the 1 at 9 before the current one (10-11),
    # and by nothing further that agrees (the text's start; 7 ≠ 5)
    text = [1, 2, 3, 7, 1, 2, 3, 8, 5, 1, 2, 3]
    assert proposed(text, 2, "longest") == [8, 5, 1]
    assert proposed(text, 2, "earliest") == [7, 1, 2]


def test_a_longer_ngram_is_tried_first_then_shorter_ones():
    # n = 3: the trigram (1, 2, 3) occurred at 0-2 and 5-7 only, so 10-11's bigram plays no part
    assert proposed(TEXT, 3, "earliest") == [9, 4, 1]
    assert proposed(TEXT, 3, "latest") == [8, 5, 2]
    # no bigram (6, 5) ever occurred: the unigram 5 did, at 1, followed by 8, 9, 6
    assert proposed([4, 5, 8, 9, 6, 5], 2, "latest") == [8, 9, 6]
    assert proposed([4, 5, 8, 9], 2, "earliest", k=2) == []  # 9 never occurred before: nothing to propose


def test_the_match_is_part_of_the_draft_spec():
    assert (parse_draft("ngram").match, parse_draft("ngram:2:earliest").match) == (DEFAULT_MATCH, "earliest")
    assert (parse_draft("ngram:4:longest").arg, parse_draft("ngram:4:longest").match) == ("4", "longest")
    for bad in ("ngram:3:first", "ngram::latest", "ngram:latest"):
        with pytest.raises(ValueError, match="unknown draft"):
            parse_draft(bad)
    with pytest.raises(ValueError, match="unknown prompt-lookup match"):
        NgramDrafter(3, "first")
