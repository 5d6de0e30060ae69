"""Every draft kind in one table: how its `--draft` spec parses, what it loads (once per pair), how a generation's
drafter is made, whether the confidence policy applies and whether it is a tree (sized by `:nodes=N` or not).

Adding a drafter is one module (its `Drafter`) and one entry here (`register`); `parse_draft`, the pair
(runner/engine/pair.py), the policies' refusals and the command line's help all read this table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PretrainedConfig

from runner.engine.drafters import lookahead
from runner.engine.drafters.eagle import EagleDrafter, load_head
from runner.engine.drafters.eagle_tree import EagleTreeDrafter
from runner.engine.drafters.hybrid import HybridDrafter
from runner.engine.drafters.lookahead import LookaheadDrafter
from runner.engine.drafters.medusa import MedusaDrafter, MedusaTreeDrafter, load_heads
from runner.engine.drafters.model import ModelDrafter, layer_skip, load_model
from runner.engine.drafters.ngram import DEFAULT_MATCH, DEFAULT_NGRAM, NGRAM_MATCHES, NgramDrafter
from runner.engine.drafters.ngram_tree import NgramTreeDrafter
from runner.engine.drafters.recycling import RecyclingDrafter
from runner.engine.drafters.spec import PLAIN, DraftSpec
from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.draft import Drafter
from runner.engine.round.policies import PolicySpec
from runner.engine.weights import head_files, medusa_files, models

MAX_NODES = 63  # verify passes of up to 64 rows: the root and 63 nodes


@dataclass(frozen=True)
class Making:
    """What one generation's drafter is made from."""

    spec: DraftSpec
    loaded: nn.Module | None  # what the kind loaded for the pair (`DraftKind.load`); None where it loads nothing
    decoding: Decoding
    generator: torch.Generator
    vocab: int  # the target's vocabulary (`Loaded.vocab_size`)
    nodes: int | None  # a sized tree's nodes per round (`Pair.nodes_for`)
    stop_below: float | None  # the confidence policy's threshold


# (the spec's text, what follows the kind, the :nodes=N given or None) -> the spec, or None when malformed
Parse = Callable[[str, str, int | None], DraftSpec | None]


@dataclass(frozen=True)
class DraftKind:
    """One kind of draft."""

    name: str  # what `--draft` starts with, recorded in runs.draft_kind
    usage: str  # how its spec is written, for help and errors
    parse: Parse
    make: Callable[[Making], Drafter]
    load: Callable[[models.Loaded, str], nn.Module] | None = None  # its weights from the spec's arg, once per pair
    shares_weights: bool = False  # what it loads is the target's own weights (no kernels of its own)
    # refuse unusable files against the target's config before any model loads
    check: Callable[[str, PretrainedConfig], object] | None = None
    probabilities: bool = False  # it drafts with probabilities: the confidence policy applies
    tree: bool = False  # it drafts a tree (a sliding-window target is refused)
    sized: bool = False  # a tree taking :nodes=N, measured per pair when not given (`tree_size`)
    extra_rows: bool = False  # its verify passes carry rows besides the drafts: their costs are kept apart


def _with_arg(text: str, arg: str, nodes: int | None, kind: str) -> DraftSpec | None:
    return DraftSpec(text, kind, arg, nodes=nodes) if arg else None


def _needs_arg(kind: str) -> Parse:
    return lambda text, arg, nodes: _with_arg(text, arg, nodes, kind)


def _count(arg: str) -> bool:
    return arg.isdigit() and int(arg) >= 1


def _ngram(text: str, arg: str, nodes: int | None) -> DraftSpec | None:
    n, _, match = arg.partition(":")
    if not arg or _count(n) and (not match or match in NGRAM_MATCHES):
        return DraftSpec(text, "ngram", n or str(DEFAULT_NGRAM), match or DEFAULT_MATCH)
    return None


def _ngram_tree(text: str, arg: str, nodes: int | None) -> DraftSpec | None:
    return DraftSpec(text, "ngram-tree", arg or str(DEFAULT_NGRAM), nodes=nodes) if not arg or _count(arg) else None


def _layerskip(text: str, arg: str, nodes: int | None) -> DraftSpec | None:
    return DraftSpec(text, "layerskip", arg) if _count(arg) else None


def _recycling(text: str, arg: str, nodes: int | None) -> DraftSpec | None:
    return None if arg else DraftSpec(text, "recycling", None, nodes=nodes)


def _lookahead(text: str, arg: str, nodes: int | None) -> DraftSpec:
    window, ngram, guesses = lookahead.parse(arg)  # its own ValueError for a bad setting
    return DraftSpec(text, "lookahead", f"{window},{ngram},{guesses}", nodes=guesses * (ngram - 1))


def _model(m: Making) -> Drafter:
    return ModelDrafter(m.loaded, m.decoding, m.generator, m.vocab, stop_below=m.stop_below)


KINDS: dict[str, DraftKind] = {}  # name -> kind, in the order help and errors list them


def register(kind: DraftKind) -> DraftKind:
    """Add a kind to the table (a new name only)."""
    if kind.name in KINDS or kind.name == PLAIN.kind:
        raise ValueError(f'draft kind "{kind.name}" is already registered')
    KINDS[kind.name] = kind
    return kind


for _kind in (
    DraftKind("ngram", f"ngram[:<n>[:<match>]] (match: {', '.join(NGRAM_MATCHES)})", _ngram,
              lambda m: NgramDrafter(int(m.spec.arg), m.spec.match)),
    DraftKind("layerskip", "layerskip:<L>", _layerskip, _model, probabilities=True, shares_weights=True,
              load=lambda target, arg: layer_skip(target.model, int(arg))),
    DraftKind("model", "model:<spec>", _needs_arg("model"), _model, load=load_model, probabilities=True),
    DraftKind("eagle", "eagle:<head>", _needs_arg("eagle"),
              lambda m: EagleDrafter(m.loaded, m.decoding, m.generator, stop_below=m.stop_below),
              load=load_head, check=head_files.check, probabilities=True),
    DraftKind("medusa", "medusa:<head>", _needs_arg("medusa"), lambda m: MedusaDrafter(m.loaded),
              load=load_heads, check=medusa_files.check),
    DraftKind("ngram-tree", "ngram-tree[:<n>]", _ngram_tree, lambda m: NgramTreeDrafter(int(m.spec.arg), m.nodes),
              tree=True, sized=True),
    DraftKind("eagle-tree", "eagle-tree:<head>", _needs_arg("eagle-tree"),
              lambda m: EagleTreeDrafter(m.loaded, m.decoding, m.generator, m.nodes),
              load=load_head, check=head_files.check, tree=True, sized=True),
    DraftKind("hybrid", "hybrid:<head>", _needs_arg("hybrid"),
              lambda m: HybridDrafter(m.loaded, m.decoding, m.generator, DEFAULT_NGRAM, m.nodes),
              load=load_head, check=head_files.check, tree=True, sized=True),
    DraftKind("recycling", "recycling", _recycling, lambda m: RecyclingDrafter(m.nodes), tree=True, sized=True),
    DraftKind("medusa-tree", "medusa-tree:<head>", _needs_arg("medusa-tree"),
              lambda m: MedusaTreeDrafter(m.loaded, m.nodes), load=load_heads, check=medusa_files.check,
              tree=True, sized=True),
    DraftKind("lookahead", "lookahead[:W,N,G]", _lookahead,
              lambda m: LookaheadDrafter(*lookahead.parse(m.spec.arg)), tree=True, extra_rows=True),
):
    register(_kind)


def usage() -> str:
    """Every kind's spec, chains first, then the trees: for `--draft`'s help and the unknown-draft error."""
    chains = [k.usage for k in KINDS.values() if not k.tree]
    sized = [k.usage for k in KINDS.values() if k.sized]
    others = [k.usage for k in KINDS.values() if k.tree and not k.sized]
    return (f"{', '.join(chains)}, or a tree: {', '.join(sized)} (each with an optional :nodes=<N>)"
            + "".join(f", or {u}" for u in others))


def parse_draft(text: str) -> DraftSpec:
    """`none`, or a registered kind's spec (`usage()`), a sized tree's taking `:nodes=<N>`; ValueError otherwise."""
    if text == PLAIN.text:
        return PLAIN
    base, nodes = _nodes(text)
    name, _, arg = base.partition(":")
    kind = KINDS.get(name)
    if nodes is not None and not (kind and kind.sized):
        sized = ", ".join(k.name for k in KINDS.values() if k.sized)
        raise ValueError(f'"{text}": only a tree ({sized}) takes :nodes=<N>')
    spec = kind.parse(text, arg, nodes) if kind else None
    if spec is None:
        raise ValueError(f'unknown draft "{text}"; use {usage()}')
    return spec


def _nodes(text: str) -> tuple[str, int | None]:
    """A draft's text without its `:nodes=<N>` suffix, and N (None when absent). ValueError for a bad N."""
    base, _, last = text.rpartition(":")
    if not last.startswith("nodes="):
        return text, None
    n = last.removeprefix("nodes=")
    if not (n.isdigit() and 1 <= int(n) <= MAX_NODES):
        raise ValueError(f'"{text}": nodes must be a whole number from 1 to {MAX_NODES}, got "{n}"')
    return base, int(n)


def applies(policy: PolicySpec, kind: str) -> bool:
    """Whether a draft of this kind (or the baseline) can follow the policy: confidence needs its probabilities."""
    return not policy.needs_probabilities or kind in KINDS and KINDS[kind].probabilities


def refusal(policy: PolicySpec, draft: str) -> str:
    """Why a draft cannot follow the policy, naming the kinds that can."""
    able = [k.name for k in KINDS.values() if k.probabilities]
    return (f'k-policy "{policy.text}" needs a draft with probabilities ({", ".join(able[:-1])} or {able[-1]}); '
            f'"{draft}" has none')


def check_drafts(target: str, drafts: list[DraftSpec], trust_remote_code: bool = False) -> None:
    """Refuse an unusable draft head (missing or corrupt files, a head for another target) before any model loads."""
    checked = [(KINDS[spec.kind].check, spec.arg) for spec in drafts if not spec.baseline and KINDS[spec.kind].check]
    if checked:
        config = models.load_config(target, trust_remote_code)
        for check, arg in checked:
            check(arg, config)
