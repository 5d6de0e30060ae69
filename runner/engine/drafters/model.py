"""`model:<spec>` and `layerskip:<L>`: a causal LM drafting one token per call, either a separate model or the
target's own first L layers sharing its weights."""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.draft import Draft, crop_to, new_cache, unsure
from runner.engine.round.sampling import Ranked, draw, probabilities
from runner.engine.weights import models


class ModelDrafter:
    """A causal LM drafting one token per call, its KV cache kept in step with the committed text.

    It drafts among the target's `vocab` ids (`Loaded.vocab_size`): families pad their heads to different sizes
    over one tokenizer (Qwen2.5: 152,064 logits for 7B and up, 151,936 below), so a wider draft head is cut to
    those ids, and a narrower q would be 0 on the ids it lacks (it never proposes them, which keeps speculative
    sampling exact).
    """

    wants_hidden = ()
    wants_top = 0

    def __init__(self, model: PreTrainedModel, decoding: Decoding, generator: torch.Generator, vocab: int,
                 stop_below: float | None = None) -> None:
        self.model = model
        self.stop_below = stop_below  # the confidence policy's threshold: stop after a draft less likely than this
        self.decoding = decoding
        self.generator = generator
        self.vocab = vocab
        self.calls = 0
        self.cache = new_cache(model)
        self.committed = 0  # committed tokens when the last proposal was made

    def _next_logits(self, ids: Tensor) -> Tensor:
        out = self.model(input_ids=ids[None], cache=self.cache, use_cache=True, logits_to_keep=1)
        self.calls += 1
        return out.logits[0, -1, : self.vocab]  # (V,) at most the target's V

    def _q(self, logits: Tensor) -> Tensor:
        q = probabilities(logits, self.decoding)
        return torch.nn.functional.pad(q, (0, self.vocab - q.numel()))  # (V,) in the target's vocabulary

    def prefill(self, tokens: Tensor, hidden: Tensor | None, top: Ranked | None) -> None:
        self.cache = new_cache(self.model)
        # All but the newest token: the first proposal feeds it, like every later correction or bonus.
        if tokens.numel() > 1:
            self.model(input_ids=tokens[None, :-1], cache=self.cache, use_cache=True, logits_to_keep=1)
            crop_to(self.cache, tokens.numel() - 1)  # trims sliding-window layers back to their window

    def propose(self, tokens: Tensor, k: int) -> Draft:
        self.committed = tokens.numel()
        if k == 0:
            return Draft(tokens=tokens[:0], q=None)
        feed = tokens[self.cache.get_seq_length() :]  # the text the cache has not seen: 1 or 2 tokens
        drafted, qs = [], []
        for i in range(k):
            logits = self._next_logits(feed)
            if self.decoding.greedy:
                feed, q = logits.argmax().view(1), None
            else:
                q = self._q(logits)
                feed = draw(q, self.generator)
                qs.append(q)
            drafted.append(feed)
            if i < k - 1 and unsure(logits, q, self.stop_below):
                break
        return Draft(tokens=torch.cat(drafted), q=torch.stack(qs) if qs else None)

    def accepted(self, n: int, hidden: Tensor | None, top: Ranked | None) -> None:
        # The cache holds the committed text + d1..d(k-1); keep only what the target kept.
        crop_to(self.cache, min(self.cache.get_seq_length(), self.committed + n))


def _shallow(module: nn.Module) -> nn.Module:
    """A copy that shares every parameter but owns its list of submodules."""
    clone = copy.copy(module)
    clone._modules = dict(module._modules)  # copy.copy would share this dict with the original
    return clone


def _replaced(module: nn.Module, path: list[str], new: nn.Module, configs: dict[int, object]) -> nn.Module:
    """Shallow copies of the modules on `path` with the last one replaced by `new`, each holding the copied
    config where it held the original (`configs`: id of the original -> its copy)."""
    if not path:
        return new
    clone = _shallow(module)
    clone._modules[path[0]] = _replaced(module._modules[path[0]], path[1:], new, configs)
    if id(getattr(clone, "config", None)) in configs:
        clone.config = configs[id(clone.config)]
    return clone


def layer_skip(model: PreTrainedModel, layers: int) -> PreTrainedModel:
    """The target's first `layers` decoder layers plus its final norm and LM head, sharing the weights.

    The decoder may sit deep inside a multimodal wrapper (Gemma-3 4B+, Mistral-3, Llama-4 load as
    `*ForConditionalGeneration`, the text decoder at `model.language_model`): the copy replaces it where it is,
    and shortens the decoder's own config, not the wrapper's.
    """
    decoder = model.get_decoder()
    total = len(getattr(decoder, "layers", ()))
    if total == 0:
        raise ValueError(f"layerskip needs a decoder with .layers; {type(model).__name__} has none")
    if not 1 <= layers < total:
        raise ValueError(f"layerskip:L needs 1 <= L < {total} (the target's layer count), got {layers}")
    config = copy.deepcopy(model.config)
    text = config.get_text_config(decoder=True)  # the config itself for a plain causal LM
    text.num_hidden_layers = layers
    if getattr(text, "layer_types", None):
        text.layer_types = text.layer_types[:layers]
    short_decoder = _shallow(decoder)
    short_decoder.layers = nn.ModuleList(decoder.layers[:layers])
    path = next(name for name, module in model.named_modules() if module is decoder).split(".")
    configs = {id(model.config): config, id(model.config.get_text_config(decoder=True)): text}
    draft = _replaced(model, path, short_decoder, configs)
    short_decoder.config = text
    draft.config = config
    draft.generation_config = copy.deepcopy(model.generation_config)  # its own, not the target's object
    return draft


def load_model(target: models.Loaded, spec: str) -> PreTrainedModel:
    """`model:<spec>`'s draft, on the target's device and dtype; refused unless it shares the target's tokenizer and
    embeds every id the target can write."""
    draft = models.load(spec, device=str(target.device), dtype=str(target.dtype).removeprefix("torch."),
                        trust_remote_code=target.trust_remote_code)
    models.check_same_tokenizer(target, draft)
    _check_embeds(draft, target)
    return draft.model


def _check_embeds(draft: models.Loaded, target: models.Loaded) -> None:
    """The draft reads every token the target writes, so it must embed all the ids the target chooses from."""
    rows = draft.model.get_input_embeddings().weight.shape[0]
    if rows < target.vocab_size:
        raise models.ModelError(f'draft "{draft.spec}" embeds {rows} token ids, fewer than the {target.vocab_size} '
                                f'that target "{target.spec}" can write')
