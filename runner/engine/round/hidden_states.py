"""The target's hidden states a drafter reads, from the same forward pass that scores the tokens.

Indices are those of transformers' `hidden_states` (0: the embeddings, i: the input of layer i), but L, the
output of the last of L layers, is read before the final norm: transformers' `hidden_states[L]` is the normed
state the LM head reads, while EAGLE-3 heads (and vLLM, SGLang) read the residual stream itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from transformers.utils import ModelOutput

from runner.engine.weights.models import ModelError


@contextmanager
def reading(model: nn.Module, layers: tuple[int, ...]) -> Iterator[Callable[[ModelOutput], Tensor | None]]:
    """Around one forward pass of `model`, run with `output_hidden_states=bool(layers)`: yields what takes its
    output to the `layers` hidden states side by side, (B, T, len(layers)·H), or None when `layers` is empty."""
    last = model.config.get_text_config().num_hidden_layers
    seen: list[Tensor] = []  # the final norm's input: the last layer's output
    hook = _final_norm(model).register_forward_pre_hook(lambda _, args: seen.append(args[0])) if last in layers \
        else None

    def features(out: ModelOutput) -> Tensor | None:
        if not layers:
            return None
        return torch.cat([seen[-1] if i == last else out.hidden_states[i] for i in layers], dim=-1)

    try:
        yield features
    finally:
        if hook is not None:
            hook.remove()


def _final_norm(model: nn.Module) -> nn.Module:
    norm = getattr(model.get_decoder(), "norm", None)
    if not isinstance(norm, nn.Module):
        raise ModelError(f"{type(model).__name__}: no final norm found, so its last layer's output (before that norm) "
                         "cannot be read for a draft head")
    return norm
