"""Adding a drafter is one class and one registry entry (runner/engine/drafters/registry.py): a drafter defined here,
registered, is parsed from its spec, made by the pair and decodes losslessly; every message that lists the kinds
reads the table."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from runner.engine.drafters import registry
from runner.engine.drafters.registry import DraftKind, Making, applies, parse_draft, refusal
from runner.engine.drafters.spec import DraftSpec
from runner.engine.pair import Pair
from runner.engine.round.decode import generate
from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.draft import Draft, NoDraft
from runner.engine.round.policies import parse_policy
from runner.engine.round.sampling import Ranked
from runner.engine.weights.models import Loaded
from tests.helpers.tiny import tiny_llama

GREEDY = Decoding("greedy", 0.0, 1.0)
PROMPT = [3, 17, 9, 41, 17, 9, 5]


class EchoDrafter:
    """Drafts the token `back` places before the newest one, k times: usually wrong, so rounds reject too."""

    wants_hidden = ()
    wants_top = 0

    def __init__(self, back: int) -> None:
        self.back, self.calls = back, 0

    def prefill(self, tokens: Tensor, hidden: Tensor | None, top: Ranked | None) -> None:
        pass

    def propose(self, tokens: Tensor, k: int) -> Draft:
        self.calls += 1
        token = tokens[max(0, tokens.numel() - 1 - self.back)]
        return Draft(tokens=token.repeat(k), q=None)

    def accepted(self, n: int, hidden: Tensor | None, top: Ranked | None) -> None:
        pass


def _echo(text: str, arg: str, nodes: int | None) -> DraftSpec | None:
    return DraftSpec(text, "echo", arg or "0") if not arg or arg.isdigit() else None


ECHO = DraftKind("echo", "echo[:<back>]", _echo, lambda m: EchoDrafter(int(m.spec.arg)))


@pytest.fixture
def echo():
    registry.register(ECHO)
    try:
        yield ECHO
    finally:
        del registry.KINDS[ECHO.name]


def test_a_registered_drafter_parses_runs_and_is_lossless(echo):
    spec = parse_draft("echo:2")
    assert spec == DraftSpec("echo:2", "echo", "2")
    target = Loaded("tiny", tiny_llama(64, seed=5), None, torch.device("cpu"), torch.float32)
    expected = generate(target, NoDraft(), PROMPT, None, GREEDY, 24, torch.Generator()).output_tokens
    pair = Pair(target, [spec], "stock")
    for k in (1, 3, 5):
        run = pair.run(spec, PROMPT, k, GREEDY, 24, seed=0)
        assert run.output_tokens == expected, k
        assert sum(r.k for r in run.rounds) > 0  # it drafted: the pair made an EchoDrafter, not plain decoding
    assert isinstance(pair.drafter(spec, GREEDY, torch.Generator()), EchoDrafter)


def test_the_registry_lists_a_new_kind_in_every_message(echo):
    with pytest.raises(ValueError, match=r'unknown draft "echo:x"; use .*echo\[:<back>\]'):
        parse_draft("echo:x")
    with pytest.raises(ValueError, match=r"only a tree \(ngram-tree, eagle-tree, hybrid, recycling, medusa-tree\)"):
        parse_draft("echo:nodes=4")  # not a sized tree
    confidence = parse_policy("confidence:0.5")
    assert not applies(confidence, "echo") and applies(parse_policy("heuristic"), "echo")
    assert refusal(confidence, "echo") == ('k-policy "confidence:0.5" needs a draft with probabilities (layerskip, '
                                           'model or eagle); "echo" has none')


def test_a_kind_is_registered_once():
    with pytest.raises(ValueError, match='"ngram" is already registered'):
        registry.register(registry.KINDS["ngram"])
    assert "echo" not in registry.KINDS and Making  # the fixture above removed its kind again
