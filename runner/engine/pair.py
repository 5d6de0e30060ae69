"""A target paired with its drafts, loaded once and run many times: what `generate`, `sweep` and the bench share."""

from __future__ import annotations

import torch
from torch import nn

from runner.engine import tree_size
from runner.engine.drafters.registry import KINDS, Making, applies, refusal
from runner.engine.drafters.spec import DraftSpec
from runner.engine.round.batch import generate_batch
from runner.engine.round.decode import generate
from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.draft import Drafter, NoDraft, new_cache
from runner.engine.round.policies import FIXED, PolicySpec, VerifyCosts
from runner.engine.round.trees import check_cache
from runner.engine.weights import compact_llama, kernels, models
from runner.records import Generation

DEFAULT_NODES = 15  # a tree's nodes per round when none is given and the pair has not measured its own (`tree_size`)
WARMUP_TOKENS = 8  # plain decoding's warm-up


class Pair:
    """Loads the target and each draft once; makes a fresh drafter for every generation.

    With `kernels` 'skinny' on a CPU, every generation runs the target's and the model drafts' linears on
    the measured kernels (a layer-skip draft shares the target's); `self.kernels` says what actually runs.
    """

    def __init__(self, target: models.Loaded, drafts: list[DraftSpec], kernels_name: str = kernels.SKINNY) -> None:
        self.target = target
        # what each draft loaded (drafters/registry.py): a PreTrainedModel, an EagleHead, MedusaHeads
        self.draft_models: dict[str, nn.Module] = {}
        separate = []  # draft models with weights of their own
        for spec in drafts:
            kind = None if spec.baseline else KINDS[spec.kind]
            if kind and kind.load:
                self.draft_models[spec.text] = kind.load(target, spec.arg)
                if not kind.shares_weights:
                    separate.append(self.draft_models[spec.text])
        chosen = kernels.parse_kernels(kernels_name)
        # CUDA keeps cuBLAS: the skinny kernels answer a CPU BLAS's weakness.
        self.kernels = chosen if target.device.type == "cpu" else kernels.STOCK
        self.switches = [kernels.attach(m) for m in (target.model, *separate)] if self.kernels == kernels.SKINNY else []
        shared = [self.draft_models[s.text] for s in drafts if not s.baseline and KINDS[s.kind].shares_weights]
        for model in shared if self.switches else ():  # the target's own layers: its compact forward and kernels
            compact_llama.install(model, self.switches[0].on)
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
        if spec.baseline or not KINDS[spec.kind].sized or spec.nodes is not None:
            return spec.nodes
        trials = self.tree_trials.get((spec.text, k, batch))
        return tree_size.best(trials) if trials else DEFAULT_NODES

    def drafter(self, spec: DraftSpec, decoding: Decoding, generator: torch.Generator,
                policy: PolicySpec = FIXED, k: int | None = None, batch: int = 1) -> Drafter:
        """A fresh drafter for one generation at depth k and batch size `batch` (what sizes a tree given no
        :nodes=N)."""
        if spec.baseline:
            return NoDraft()
        if not applies(policy, spec.kind):
            raise ValueError(refusal(policy, spec.text))
        kind = KINDS[spec.kind]
        if kind.tree:
            check_cache(new_cache(self.target.model))  # refuse a sliding-window target before it runs
        return kind.make(Making(spec, self.draft_models.get(spec.text), decoding, generator, self.target.vocab_size,
                                self.nodes_for(spec, k, batch), policy.threshold))

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
        """The prompts decoded together (runner/engine/round/batch.py), each with its own drafter and a generator seeded
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
        if not spec.baseline and KINDS[spec.kind].extra_rows:
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
            for k in ks if not spec.baseline and KINDS[spec.kind].sized and spec.nodes is None else ():
                for size in batches:
                    if (spec.text, k, size) not in self.tree_trials:
                        decode = self._decoder(prompt, k, size)
                        self.tree_trials[spec.text, k, size] = tree_size.measure(decode, spec, tokens)
        for spec in specs:
            for k in [None] if spec.baseline else ks:
                n = min(WARMUP_TOKENS if k is None else k + 2, max_new_tokens)
                for size in batches:
                    if size == 1:
                        self.run(spec, prompt, k, decoding, n, seed=0)
                    else:
                        self.run_batch(spec, [prompt] * size, k, decoding, n, seed=0)

    def _decoder(self, prompt: list[int], k: int, batch: int) -> tree_size.Decode:
        """What `tree_size` measures: the prompt decoded at depth k alone, or `batch` copies of it together."""
        def decode(spec: DraftSpec, decoding: Decoding, tokens: int) -> list[Generation]:
            if batch == 1:
                return [self.run(spec, prompt, k, decoding, tokens, seed=0)]
            return self.run_batch(spec, [prompt] * batch, k, decoding, tokens, seed=0)
        return decode
