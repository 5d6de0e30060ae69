"""A target paired with its drafts, loaded once and run many times: what `generate`, `sweep` and the bench share."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from runner.engine import compact_llama, head_files, kernels, lookahead, medusa_files, models, tree_size
from runner.engine.batch import generate_batch
from runner.engine.decode import generate
from runner.engine.drafters import (
    DEFAULT_MATCH,
    NGRAM_MATCHES,
    Drafter,
    ModelDrafter,
    NgramDrafter,
    NoDraft,
    layer_skip,
    new_cache,
)
from runner.engine.eagle_drafter import EagleDrafter
from runner.engine.eagle_tree import EagleTreeDrafter
from runner.engine.hybrid import HybridDrafter
from runner.engine.lookahead import LookaheadDrafter
from runner.engine.medusa import MedusaDrafter, MedusaTreeDrafter
from runner.engine.ngram_tree import NgramTreeDrafter
from runner.engine.policies import FIXED, PolicySpec, VerifyCosts
from runner.engine.recycling import RecyclingDrafter
from runner.engine.sampling import Decoding
from runner.engine.trees import check_cache
from runner.records import Generation

DEFAULT_NGRAM = 3  # longest n-gram prompt lookup tries before falling back to shorter ones
DEFAULT_NODES = 15  # a tree's nodes per round when none is given and the pair has not measured its own (`tree_size`)
MAX_NODES = 63  # verify passes of up to 64 rows: the root and 63 nodes
SIZED_TREES = ("ngram-tree", "eagle-tree", "hybrid", "recycling", "medusa-tree")  # the trees that take :nodes=<N>
TREE_KINDS = (*SIZED_TREES, "lookahead")
HEAD_KINDS = ("eagle", "eagle-tree", "hybrid")  # drafts made by an EAGLE draft head
MEDUSA_KINDS = ("medusa", "medusa-tree")  # drafts made by Medusa heads
WARMUP_TOKENS = 8  # plain decoding's warm-up


@dataclass(frozen=True)
class DraftSpec:
    """A parsed `--draft` value."""

    text: str  # as the user wrote it, e.g. 'layerskip:24'
    # 'baseline' | 'ngram' | 'layerskip' | 'model' | 'eagle' | 'medusa', or a tree: 'ngram-tree' | 'eagle-tree' |
    # 'hybrid' | 'recycling' | 'medusa-tree' | 'lookahead'
    kind: str
    # n for ngram and ngram-tree, L for layerskip, the model spec for model, the head's directory or repo id for
    # eagle, eagle-tree, hybrid, medusa and medusa-tree, 'W,N,G' for lookahead; None for recycling
    arg: str | None
    match: str | None = None  # ngram: which earlier occurrence it copies from (`NGRAM_MATCHES`)
    # a tree: its nodes per round (lookahead: at most, G guesses of N - 1); None for a sized tree given no :nodes=N,
    # whose pair measures its own (`Pair.nodes_for`)
    nodes: int | None = None

    @property
    def baseline(self) -> bool:
        return self.kind == "baseline"


PLAIN = DraftSpec("none", "baseline", None)  # the baseline: plain decoding, no draft (runs.draft = 'none', k NULL)


def parse_draft(text: str) -> DraftSpec:
    """`none`, `ngram[:<n>[:<match>]]`, `layerskip:<L>`, `model:<spec>`, `eagle:<head>`, `medusa:<head>`, or a tree,
    each taking `:nodes=<N>`: `ngram-tree[:<n>]`, `eagle-tree:<head>`, `hybrid:<head>`, `recycling`,
    `medusa-tree:<head>`; or `lookahead[:W,N,G]`, a tree whose G and N set its nodes; ValueError otherwise."""
    if text == PLAIN.text:
        return PLAIN
    base, nodes = _nodes(text)
    kind, _, arg = base.partition(":")
    n, _, match = arg.partition(":")
    if nodes is not None and kind not in SIZED_TREES:
        raise ValueError(f'"{text}": only a tree ({", ".join(SIZED_TREES)}) takes :nodes=<N>')
    if kind == "ngram" and (not arg or n.isdigit() and int(n) >= 1 and (not match or match in NGRAM_MATCHES)):
        return DraftSpec(text, "ngram", n or str(DEFAULT_NGRAM), match or DEFAULT_MATCH)
    if kind == "ngram-tree" and (not arg or arg.isdigit() and int(arg) >= 1):
        return DraftSpec(text, "ngram-tree", arg or str(DEFAULT_NGRAM), nodes=nodes)
    if kind == "lookahead":
        window, ngram, guesses = lookahead.parse(arg)
        return DraftSpec(text, "lookahead", f"{window},{ngram},{guesses}", nodes=guesses * (ngram - 1))
    if kind == "recycling" and not arg:
        return DraftSpec(text, "recycling", None, nodes=nodes)
    if kind in ("eagle-tree", "hybrid", "medusa-tree") and arg:
        return DraftSpec(text, kind, arg, nodes=nodes)
    if kind == "layerskip" and arg.isdigit() and int(arg) >= 1:
        return DraftSpec(text, "layerskip", arg)
    if kind in ("model", "eagle", "medusa") and arg:
        return DraftSpec(text, kind, arg)
    raise ValueError(f'unknown draft "{text}"; use ngram, ngram:<n>, ngram:<n>:<match> (match: '
                     f'{", ".join(NGRAM_MATCHES)}), layerskip:<L>, model:<spec>, eagle:<head>, medusa:<head>, or a '
                     'tree: ngram-tree[:<n>], eagle-tree:<head>, hybrid:<head>, recycling or medusa-tree:<head>, '
                     'each with an optional :nodes=<N>, or lookahead[:W,N,G]')


def _nodes(text: str) -> tuple[str, int | None]:
    """A draft's text without its `:nodes=<N>` suffix, and N (None when absent). ValueError for a bad N."""
    base, _, last = text.rpartition(":")
    if not last.startswith("nodes="):
        return text, None
    n = last.removeprefix("nodes=")
    if not (n.isdigit() and 1 <= int(n) <= MAX_NODES):
        raise ValueError(f'"{text}": nodes must be a whole number from 1 to {MAX_NODES}, got "{n}"')
    return base, int(n)


def check_drafts(target: str, drafts: list[DraftSpec], trust_remote_code: bool = False) -> None:
    """Refuse an unusable draft head (missing or corrupt files, a head for another target) before any model loads."""
    heads = [spec for spec in drafts if spec.kind in HEAD_KINDS + MEDUSA_KINDS]
    if heads:
        config = models.load_config(target, trust_remote_code)
        for spec in heads:
            (head_files if spec.kind in HEAD_KINDS else medusa_files).check(spec.arg, config)


def parse_kernels(text: str) -> str:
    """A `--kernels` value; ValueError otherwise."""
    if text not in (kernels.STOCK, kernels.SKINNY):
        raise ValueError(f'unknown kernels "{text}"; use {kernels.SKINNY} or {kernels.STOCK}')
    return text


class Pair:
    """Loads the target and each draft once; makes a fresh drafter for every generation.

    With `kernels` 'skinny' on a CPU, every generation runs the target's and the model drafts' linears on
    the measured kernels (a layer-skip draft shares the target's); `self.kernels` says what actually runs.
    """

    def __init__(self, target: models.Loaded, drafts: list[DraftSpec], kernels_name: str = kernels.SKINNY) -> None:
        self.target = target
        # a PreTrainedModel, an EagleHead for eagle drafts, MedusaHeads for medusa drafts
        self.draft_models: dict[str, nn.Module] = {}
        separate = []  # draft models with weights of their own
        for spec in drafts:
            if spec.kind == "layerskip":
                self.draft_models[spec.text] = layer_skip(target.model, int(spec.arg))
            elif spec.kind == "model":
                loaded = models.load(spec.arg, device=str(target.device), dtype=_dtype_name(target.dtype),
                                     trust_remote_code=target.trust_remote_code)
                models.check_same_tokenizer(target, loaded)
                _check_embeds(loaded, target)
                self.draft_models[spec.text] = loaded.model
                separate.append(loaded.model)
            elif spec.kind in HEAD_KINDS:
                checked = head_files.check(spec.arg, target.model.config)
                self.draft_models[spec.text] = head_files.load(
                    checked, target.model.get_input_embeddings(), target.device, target.dtype)
                separate.append(self.draft_models[spec.text])
            elif spec.kind in MEDUSA_KINDS:
                checked = medusa_files.check(spec.arg, target.model.config)
                self.draft_models[spec.text] = medusa_files.load(
                    checked, target.model.get_output_embeddings().weight, target.vocab_size, target.device,
                    target.dtype)
                separate.append(self.draft_models[spec.text])
        chosen = parse_kernels(kernels_name)
        # CUDA keeps cuBLAS: the skinny kernels answer a CPU BLAS's weakness.
        self.kernels = chosen if target.device.type == "cpu" else kernels.STOCK
        self.switches = [kernels.attach(m) for m in (target.model, *separate)] if self.kernels == kernels.SKINNY else []
        for spec in drafts if self.switches else ():
            if spec.kind == "layerskip":  # the target's layers, so the compact forward with its kernels
                compact_llama.install(self.draft_models[spec.text], self.switches[0].on)
        for switch in self.switches:
            switch.table()  # measured (or read from the cache) now, not inside a timed generation
        self.verify_costs = VerifyCosts()  # every generation's verify passes, for the `auto` policy
        self.batch_costs: dict[int, VerifyCosts] = {}  # the same for batched generations, per batch size
        # a lookahead draft's, per draft and batch size: its passes also carry the window, so at the same k they are
        # wider than any other draft's and would skew the widths `auto` reads for the others
        self.window_costs: dict[tuple[str, int], VerifyCosts] = {}
        # per (tree draft, depth k, batch size) given no :nodes=N: the trials `warm_up` measured (`tree_size`)
        self.tree_trials: dict[tuple[str, int | None, int], list[tree_size.Trial]] = {}

    def nodes_for(self, spec: DraftSpec, k: int | None, batch: int = 1) -> int | None:
        """A tree's nodes per round: its `:nodes=N`, else the best this pair measured at depth k and this batch size
        (`warm_up`), else DEFAULT_NODES; None for a chain."""
        if spec.kind not in SIZED_TREES or spec.nodes is not None:
            return spec.nodes
        trials = self.tree_trials.get((spec.text, k, batch))
        return tree_size.best(trials) if trials else DEFAULT_NODES

    def drafter(self, spec: DraftSpec, decoding: Decoding, generator: torch.Generator,
                policy: PolicySpec = FIXED, k: int | None = None, batch: int = 1) -> Drafter:
        """A fresh drafter for one generation at depth k and batch size `batch` (what sizes a tree given no
        :nodes=N)."""
        if spec.baseline:
            return NoDraft()
        if not policy.applies_to(spec.kind):
            raise ValueError(policy.refusal(spec.text))
        if spec.kind == "ngram":
            return NgramDrafter(int(spec.arg), spec.match)
        nodes = self.nodes_for(spec, k, batch)
        if spec.kind in TREE_KINDS:
            check_cache(new_cache(self.target.model))  # refuse a sliding-window target before it runs
        if spec.kind == "ngram-tree":
            return NgramTreeDrafter(int(spec.arg), nodes)
        if spec.kind == "recycling":
            return RecyclingDrafter(nodes)
        if spec.kind == "lookahead":
            return LookaheadDrafter(*lookahead.parse(spec.arg))
        if spec.kind == "eagle-tree":
            return EagleTreeDrafter(self.draft_models[spec.text], decoding, generator, nodes)
        if spec.kind == "hybrid":
            return HybridDrafter(self.draft_models[spec.text], decoding, generator, DEFAULT_NGRAM, nodes)
        if spec.kind == "medusa-tree":
            return MedusaTreeDrafter(self.draft_models[spec.text], nodes)
        if spec.kind == "medusa":
            return MedusaDrafter(self.draft_models[spec.text])
        if spec.kind == "eagle":
            return EagleDrafter(self.draft_models[spec.text], decoding, generator, stop_below=policy.threshold)
        return ModelDrafter(self.draft_models[spec.text], decoding, generator, self.target.vocab_size,
                            stop_below=policy.threshold)

    def run(
        self, spec: DraftSpec, prompt: list[int], k: int | None, decoding: Decoding, max_new_tokens: int, seed: int,
        policy: PolicySpec = FIXED,
    ) -> Generation:
        """One generation; k is None exactly for the baseline (plain decoding), as in `runs.k`; `policy` gives each
        round its k, starting from k."""
        if (k is None) != spec.baseline:
            raise ValueError(f"{spec.text}: k must be {'None' if spec.baseline else 'given'}, got {k}")
        generator = torch.Generator(device=self.target.device).manual_seed(seed)
        drafter = self.drafter(spec, decoding, generator, policy, k)
        with kernels.using(self.switches):
            return generate(self.target, drafter, prompt, k, decoding, max_new_tokens, generator, policy,
                            self._costs(spec, 1))

    def run_batch(
        self, spec: DraftSpec, prompts: list[list[int]], k: int | None, decoding: Decoding, max_new_tokens: int,
        seed: int, policy: PolicySpec = FIXED,
    ) -> list[Generation]:
        """The prompts decoded together (runner/engine/batch.py), each with its own drafter and a generator seeded
        as `run` seeds one; the `auto` policy reads the verify costs of this batch size only."""
        if (k is None) != spec.baseline:
            raise ValueError(f"{spec.text}: k must be {'None' if spec.baseline else 'given'}, got {k}")
        generators = [torch.Generator(device=self.target.device).manual_seed(seed) for _ in prompts]
        drafters = [self.drafter(spec, decoding, g, policy, k, len(prompts)) for g in generators]
        with kernels.using(self.switches):
            return generate_batch(self.target, drafters, prompts, k, decoding, max_new_tokens, generators, policy,
                                  self._costs(spec, len(prompts)))

    def _costs(self, spec: DraftSpec, batch: int) -> VerifyCosts:
        """The verify costs a generation of `spec` at this batch size adds to, and its `auto` policy reads."""
        if spec.kind == "lookahead":
            return self.window_costs.setdefault((spec.text, batch), VerifyCosts())
        return self.verify_costs if batch == 1 else self.batch_costs.setdefault(batch, VerifyCosts())

    def warm_up(self, specs: list[DraftSpec], prompt: list[int], ks: tuple[int, ...], decoding: Decoding,
                max_new_tokens: int, batches: tuple[int, ...] = (1,)) -> None:
        """One short generation per drafter, k and batch size, so one-time costs (allocator growth, kernel choice
        for each verify width k+1) stay out of the timings: k+2 tokens make the prefill's and one full round of k (no
        run goes past max_new_tokens, so neither does its warm-up). A batch repeats the prompt. First, a tree given
        no :nodes=N has its nodes per round measured at each k and batch size (`tree_size`)."""
        tokens = min(tree_size.TOKENS, max_new_tokens)
        for spec in specs:
            for k in ks if spec.kind in SIZED_TREES and spec.nodes is None else ():
                for size in batches:
                    if (spec.text, k, size) not in self.tree_trials:
                        self.tree_trials[spec.text, k, size] = tree_size.measure(self, spec, prompt, k, tokens, size)
        for spec in specs:
            for k in [None] if spec.baseline else ks:
                n = min(WARMUP_TOKENS if k is None else k + 2, max_new_tokens)
                for size in batches:
                    if size == 1:
                        self.run(spec, prompt, k, decoding, n, seed=0)
                    else:
                        self.run_batch(spec, [prompt] * size, k, decoding, n, seed=0)


def _check_embeds(draft: models.Loaded, target: models.Loaded) -> None:
    """The draft reads every token the target writes, so it must embed all the ids the target chooses from."""
    rows = draft.model.get_input_embeddings().weight.shape[0]
    if rows < target.vocab_size:
        raise models.ModelError(f'draft "{draft.spec}" embeds {rows} token ids, fewer than the {target.vocab_size} '
                                f'that target "{target.spec}" can write')


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
