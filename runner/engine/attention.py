"""Attention of a masked CPU pass over grouped key/value heads (GQA), for the models our kernels are attached to.

With a mask and more than one query token, transformers' SDPA path copies every cached key and value head once per
query head it serves (`repeat_kv`) before each layer's attention: a batch's pass copies all of its sequences'
caches, 30 times over for SmolLM2-135M. SDPA's `enable_gqa` reads the shared heads where they are and gives the same
floats (tests/test_kernels.py) without the copies, which cost the most where a batch's caches are longest. One-token
passes (transformers folds the query heads instead), passes with no mask (it already passes `enable_gqa`) and every
model not attached, or attached but outside `Kernels.use()`, run transformers' own function unchanged.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

_SWITCHES: weakref.WeakKeyDictionary[nn.Module, Callable[[], bool]] = weakref.WeakKeyDictionary()


def follow(model: nn.Module, active: Callable[[], bool]) -> None:
    """Route the model's grouped attention layers through `grouped_sdpa` whenever `active()` says so."""
    for module in model.modules():
        if getattr(module, "num_key_value_groups", 1) > 1:
            _SWITCHES[module] = active


_STOCK_ONLY = ("position_bias", "softcap", "s_aux")  # arguments only transformers' function knows what to do with


def _in_place(module: nn.Module, query: Tensor, attention_mask: Tensor | None, dropout: float, kwargs: dict) -> bool:
    """Whether this call reads the grouped heads in place: a followed layer, switched on, a masked CPU pass of 2+
    tokens, nothing else asked of it."""
    active = _SWITCHES.get(module)
    plain = not dropout and not any(kwargs.get(name) is not None for name in _STOCK_ONLY)
    return (active is not None and active() and attention_mask is not None and query.shape[2] > 1
            and query.device.type == "cpu" and plain)


def grouped_sdpa(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                 dropout: float = 0.0, scaling: float | None = None, **kwargs) -> tuple[Tensor, None]:
    """transformers' `sdpa` entry: its own function, except for a followed layer's masked passes of 2+ tokens."""
    if not _in_place(module, query, attention_mask, dropout, kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register("sdpa", grouped_sdpa)
