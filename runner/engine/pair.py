"""A target paired with its drafts, loaded once and run many times: what `generate`, `sweep` and the bench share."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from runner.engine import head_files, models
from runner.engine.decode import generate
from runner.engine.drafters import Drafter, ModelDrafter, NgramDrafter, NoDraft, layer_skip
from runner.engine.eagle_drafter import EagleDrafter
from runner.engine.sampling import Decoding
from runner.records import Generation

DEFAULT_NGRAM = 3  # longest n-gram prompt lookup tries before falling back to shorter ones
WARMUP_TOKENS = 8


@dataclass(frozen=True)
class DraftSpec:
    """A parsed `--draft` value."""

    text: str  # as the user wrote it, e.g. 'layerskip:24'
    kind: str  # 'baseline' | 'ngram' | 'layerskip' | 'model' | 'eagle'
    arg: str | None  # n for ngram, L for layerskip, the model spec for model, the head's directory or repo id for eagle

    @property
    def baseline(self) -> bool:
        return self.kind == "baseline"


PLAIN = DraftSpec("none", "baseline", None)  # the baseline: plain decoding, no draft (runs.draft = 'none', k NULL)


def parse_draft(text: str) -> DraftSpec:
    """`none`, `ngram`, `ngram:<n>`, `layerskip:<L>`, `model:<spec>` or `eagle:<head>`; ValueError otherwise."""
    kind, _, arg = text.partition(":")
    if text == PLAIN.text:
        return PLAIN
    if kind == "ngram" and (not arg or arg.isdigit() and int(arg) >= 1):
        return DraftSpec(text, "ngram", arg or str(DEFAULT_NGRAM))
    if kind == "layerskip" and arg.isdigit() and int(arg) >= 1:
        return DraftSpec(text, "layerskip", arg)
    if kind in ("model", "eagle") and arg:
        return DraftSpec(text, kind, arg)
    raise ValueError(f'unknown draft "{text}"; use ngram, ngram:<n>, layerskip:<L>, model:<spec> or eagle:<head>')


def check_drafts(target: str, drafts: list[DraftSpec]) -> None:
    """Refuse an unusable draft head (missing or corrupt files, a head for another target) before any model loads."""
    heads = [spec for spec in drafts if spec.kind == "eagle"]
    if heads:
        config = models.load_config(target)
        for spec in heads:
            head_files.check(spec.arg, config)


class Pair:
    """Loads the target and each draft once; makes a fresh drafter for every generation."""

    def __init__(self, target: models.Loaded, drafts: list[DraftSpec]) -> None:
        self.target = target
        self.draft_models: dict[str, nn.Module] = {}  # a PreTrainedModel, or an EagleHead for eagle drafts
        for spec in drafts:
            if spec.kind == "layerskip":
                self.draft_models[spec.text] = layer_skip(target.model, int(spec.arg))
            elif spec.kind == "model":
                loaded = models.load(spec.arg, device=str(target.device), dtype=_dtype_name(target.dtype))
                models.check_same_tokenizer(target, loaded)
                self.draft_models[spec.text] = loaded.model
            elif spec.kind == "eagle":
                checked = head_files.check(spec.arg, target.model.config)
                self.draft_models[spec.text] = head_files.load(
                    checked, target.model.get_input_embeddings(), target.device, target.dtype)

    def drafter(self, spec: DraftSpec, decoding: Decoding, generator: torch.Generator) -> Drafter:
        if spec.baseline:
            return NoDraft()
        if spec.kind == "ngram":
            return NgramDrafter(int(spec.arg))
        if spec.kind == "eagle":
            return EagleDrafter(self.draft_models[spec.text], decoding, generator)
        return ModelDrafter(self.draft_models[spec.text], decoding, generator)

    def run(
        self, spec: DraftSpec, prompt: list[int], k: int | None, decoding: Decoding, max_new_tokens: int, seed: int
    ) -> Generation:
        """One generation; k is None exactly for the baseline (plain decoding), as in `runs.k`."""
        if (k is None) != spec.baseline:
            raise ValueError(f"{spec.text}: k must be {'None' if spec.baseline else 'given'}, got {k}")
        generator = torch.Generator(device=self.target.device).manual_seed(seed)
        drafter = self.drafter(spec, decoding, generator)
        return generate(self.target, drafter, prompt, k, decoding, max_new_tokens, generator)

    def warm_up(self, specs: list[DraftSpec], prompt: list[int], k: int, decoding: Decoding) -> None:
        """One short generation per drafter, so one-time costs (allocator, kernels) stay out of the timings."""
        for spec in specs:
            self.run(spec, prompt, None if spec.baseline else k, decoding, WARMUP_TOKENS, seed=0)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
