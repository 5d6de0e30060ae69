"""vLLM's prompt lookup (`vllm/v1/spec_decode/ngram_proposer.py`): the longest n-gram of prompt_lookup_min..max
that ends the text, at its earliest earlier occurrence, then up to k tokens after it (fewer where the text ends).
That is our `ngram:<n>:earliest` with prompt_lookup_min = 1: on hand-made token lists both propose the same."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from runner.engine.drafters.ngram import NgramDrafter
from runner.vllm.process import vllm_python

# (text, n, k, the proposal worked out by hand)
CASES = [
    # (2, 3) ends the text and occurred at 1-2, 6-7 and 10-11: the earliest is followed by 9, 4, 1
    ([1, 2, 3, 9, 4, 1, 2, 3, 8, 5, 2, 3, 7, 6, 4, 1, 2, 3], 2, 3, [9, 4, 1]),
    # the trigram (1, 2, 3) occurred at 0-2 and 5-7; the longest wins over the bigram's earlier place
    ([1, 2, 3, 9, 4, 1, 2, 3, 8, 5, 2, 3, 7, 6, 4, 1, 2, 3], 3, 3, [9, 4, 1]),
    # (6, 5) never occurred: the unigram 5 did, first at 1
    ([4, 5, 8, 9, 6, 5], 2, 3, [8, 9, 6]),
    # nothing ending the text occurred before: no draft
    ([4, 5, 8, 9], 2, 2, []),
    # the occurrence may overlap the end: (7, 7) at 0-1 is followed by 7, 7 (the text's own last tokens)
    ([7, 7, 7], 2, 4, [7]),
    # fewer than k where the text ends: (3, 4) at 2-3 is followed by 5, 3, 4 only
    ([1, 2, 3, 4, 5, 3, 4], 2, 8, [5, 3, 4]),
]


def ours(text: list[int], n: int, k: int) -> list[int]:
    drafter = NgramDrafter(n, "earliest")
    tokens = torch.tensor(text)
    drafter.prefill(tokens, None, None)
    return drafter.propose(tokens, k).tokens.tolist()


@pytest.mark.parametrize(("text", "n", "k", "expected"), CASES)
def test_ours_with_the_earliest_match_proposes_what_vllm_does(text, n, k, expected):
    assert ours(text, n, k) == expected


VLLM_RULE = """
import json, sys
import numpy as np
from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as propose
cases = json.loads(sys.stdin.read())
print(json.dumps([propose(np.array(t, dtype=np.int32), 1, n, 2048, k).tolist() for t, n, k, _ in cases]))
"""


def test_the_hand_worked_proposals_are_vllms_own():
    """vLLM's own function, run in its environment on the same lists."""
    done = subprocess.run([str(vllm_python()), "-c", VLLM_RULE], input=json.dumps(CASES), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-500:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [expected for *_, expected in CASES]
