"""A compact CPU forward for Llama-style decoders: the same arithmetic as transformers' layer code in far fewer
operations per pass.

A one-token pass of SmolLM2-135M through transformers runs ~3,150 small eager operations besides its 211 linears
(norms in five steps, RoPE recomputed per layer, masks built per pass, module calls); on a CPU their dispatch costs
a third of the pass. This forward keeps the model's weights and its KV cache and does per layer: one fused norm, one
product for q, k and v (their weights concatenated once, the modules' own weights made views of that one tensor, so
no memory is added), RoPE from tables made once by the model's own rotary module, the pass's keys and values
written into room kept past the cache's end (`append`: transformers' `update` concatenates, copying the whole cache
per layer per pass), one attention over the grouped heads, one product for gate and up (concatenated the same way),
SiLU, and the down product. Every product goes through the model's `Kernels` (the skinny choice per shape and row
count). The steps between products run in native code (native.cpp: RoPE's split and the gate by ATen's operators
without the interpreter between them; the norm, and a chain's attention over the cache, by its own loops) where it
builds, else in Python (`Steps`).

When it runs (one rule): a model `install`ed here (a Llama-style decoder, `refusal` says why not), whose switch is
on (its `Kernels` inside `use()`), called with keywords only, among input_ids (B, T), attention_mask (None or a 4D
float mask, as trees and batches pass), position_ids (None or (B, T)), `cache` (a DynamicCache of full-attention
layers), use_cache=True, logits_to_keep (an int) and output_hidden_states, on a CPU. Any other call, and every call
outside `use()` (transformers' own `generate` included), runs transformers' forward unchanged.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.modeling_outputs import CausalLMOutputWithPast

from runner.engine.weights import native

FAMILIES = ("LlamaForCausalLM",)  # model classes whose layers are exactly RMSNorm, RoPE, GQA and a SwiGLU MLP
STATIC_ROPE = ("default", "linear", "llama3")  # RoPE kinds whose tables do not depend on the sequence's length
SERVED = frozenset({"input_ids", "attention_mask", "position_ids", "cache", "use_cache", "logits_to_keep",
                    "output_hidden_states"})


def refusal(model: nn.Module) -> str | None:
    """Why the compact forward cannot stand in for this model's, or None when it can."""
    config = getattr(model, "config", None)
    if type(model).__name__ not in FAMILIES or config is None:
        return f"{type(model).__name__} is not a Llama-style causal LM"
    rope = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    problems = [(config.hidden_act != "silu", f"activation {config.hidden_act}"),
                (getattr(config, "mlp_bias", False), "MLP biases"),
                (rope not in STATIC_ROPE, f"RoPE of kind {rope}"),
                (getattr(config, "sliding_window", None) is not None, "sliding-window attention")]
    found = [text for bad, text in problems if bad]
    return f"{type(model).__name__} has {', '.join(found)}" if found else None


@dataclass(frozen=True)
class Fused:
    """One decoder layer's concatenated products: [q; k; v] and [gate; up] (the modules' weights are views of them)."""

    qkv: nn.Linear
    gate_up: nn.Linear


_FUSED: weakref.WeakKeyDictionary[nn.Module, Fused] = weakref.WeakKeyDictionary()  # per decoder layer, made once


def _concatenated(parts: list[nn.Linear]) -> nn.Linear:
    """One linear over the parts' rows; each part's weight (and bias) becomes a view of it."""
    with torch.no_grad():
        weight = torch.cat([p.weight for p in parts])
        bias = None if parts[0].bias is None else torch.cat([p.bias for p in parts])
    whole = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    whole.weight = nn.Parameter(weight, requires_grad=False)
    whole.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
    start = 0
    for part in parts:
        rows = part.weight.shape[0]
        part.weight = nn.Parameter(weight[start : start + rows], requires_grad=part.weight.requires_grad)
        if bias is not None:
            part.bias = nn.Parameter(bias[start : start + rows], requires_grad=part.bias.requires_grad)
        start += rows
    return whole


def fused(layer: nn.Module) -> Fused:
    """The layer's fused products, made on first use (a layer-skip draft shares its target's layers, and fusions)."""
    if layer not in _FUSED:
        attn, mlp = layer.self_attn, layer.mlp
        _FUSED[layer] = Fused(_concatenated([attn.q_proj, attn.k_proj, attn.v_proj]),
                              _concatenated([mlp.gate_proj, mlp.up_proj]))
    return _FUSED[layer]


class Rope:
    """cos and sin per position, made by the model's own rotary module (the same floats it makes per pass), with
    sin's first half negated so that rotating half of a head is a roll: x·cos + roll(x)·sin."""

    def __init__(self, rotary: nn.Module) -> None:
        self.rotary = rotary
        self.cos = self.sin = torch.empty(0)

    def at(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """(B, 1, T, D) tables for positions (B, T)."""
        needed = int(positions.max()) + 1
        if needed > self.cos.shape[0] or self.cos.dtype != dtype:
            size = max(needed, 2 * self.cos.shape[0], 256)  # doubling: a long generation rebuilds them rarely
            probe = torch.empty(0, dtype=dtype, device=positions.device)
            cos, sin = self.rotary(probe, torch.arange(size, device=positions.device)[None])
            half = sin.shape[-1] // 2
            self.cos, self.sin = cos[0], torch.cat([-sin[0, :, :half], sin[0, :, half:]], dim=-1)
        return self.cos[positions][:, None], self.sin[positions][:, None]


ROOM = 256  # positions of room a layer's key and value storage gets at least; it grows by half its length when full
_ROOMS: weakref.WeakKeyDictionary[DynamicLayer, tuple[Tensor, Tensor]] = weakref.WeakKeyDictionary()


def _fits(store: Tensor, cached: Tensor, new: Tensor, past: int, total: int) -> bool:
    """Whether `store` can take `new` after `cached` in place: room for `total` positions of `new`'s batch, heads,
    dim and dtype, and `cached` its first `past` positions (what `append` left there, or a crop of it)."""
    return (store.shape[2] >= total and store.shape[:2] == new.shape[:2] and store.dtype == new.dtype
            and (past == 0 or (cached.data_ptr() == store.data_ptr() and cached.stride() == store.stride())))


def _moved(cached: Tensor, new: Tensor, past: int, total: int) -> Tensor:
    """New storage with room past `total`, holding `cached`'s `past` positions."""
    batch, heads, _, dim = new.shape
    store = new.new_empty(batch, heads, total + max(ROOM, total // 2), dim)
    if past:
        store[:, :, :past] = cached
    return store


def append(layer: DynamicLayer, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
    """`layer.update(key, value)`: the same keys and values after it, but each pass writes only its own rows, into
    room kept past the cached length, and the layer's keys and values become views of that storage. A crop keeps the
    views' storage (a rolled-back draft is overwritten by the next pass); anything else that replaces the layer's
    tensors (a batch's rows joined, or its holes gathered out) moves them into new storage once, on the next pass."""
    if not layer.is_initialized:
        layer.lazy_initialization(key, value)
    past = layer.get_seq_length()
    total = past + key.shape[2]
    stores = _ROOMS.get(layer)
    if stores is None or not (_fits(stores[0], layer.keys, key, past, total)
                              and _fits(stores[1], layer.values, value, past, total)):
        stores = _ROOMS[layer] = (_moved(layer.keys, key, past, total), _moved(layer.values, value, past, total))
    keys, values = stores
    keys.narrow(2, past, key.shape[2]).copy_(key)
    values.narrow(2, past, key.shape[2]).copy_(value)
    layer.keys, layer.values = keys.narrow(2, 0, total), values.narrow(2, 0, total)
    return layer.keys, layer.values


def _serves(kwargs: dict) -> bool:
    ids, cache, mask = kwargs.get("input_ids"), kwargs.get("cache"), kwargs.get("attention_mask")
    positions, keep = kwargs.get("position_ids"), kwargs.get("logits_to_keep", 0)
    return (set(kwargs) <= SERVED and isinstance(ids, Tensor) and ids.dim() == 2 and ids.device.type == "cpu"
            and kwargs.get("use_cache") is True and type(cache) is DynamicCache and not cache.offloading
            and all(type(layer) is DynamicLayer for layer in cache.layers)
            and (mask is None or (mask.dim() == 4 and mask.is_floating_point()))
            and (positions is None or positions.dim() == 2) and type(keep) is int)


class Compact:
    """The compact forward of one installed model."""

    def __init__(self, model: nn.Module, active: Callable[[], bool]) -> None:
        self.model, self.active = model, active
        self.decoder = model.get_decoder()
        config = self.decoder.config
        self.layers = list(self.decoder.layers[: config.num_hidden_layers])
        self.fused = [fused(layer) for layer in self.layers]
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.rope = Rope(self.decoder.rotary_emb)
        self.steps = steps()

    def linears(self) -> list[nn.Linear]:
        """The fused products."""
        return [linear for f in self.fused for linear in (f.qkv, f.gate_up)]

    def replaced(self) -> list[nn.Linear]:
        """The modules whose products the fused ones compute."""
        return [linear for layer in self.layers for linear in (
            layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.mlp.gate_proj,
            layer.mlp.up_proj)]

    def forward(self, input_ids: Tensor, cache: DynamicCache, attention_mask: Tensor | None = None,
                position_ids: Tensor | None = None, use_cache: bool = True, logits_to_keep: int = 0,
                output_hidden_states: bool = False) -> CausalLMOutputWithPast:
        past, rows = cache.get_seq_length(), input_ids.shape[1]
        x = self.decoder.embed_tokens(input_ids)
        if position_ids is None:
            position_ids = torch.arange(past, past + rows)[None]
        cos, sin = self.rope.at(position_ids, x.dtype)
        while len(cache.layers) < len(self.layers) and cache.layer_class_to_replicate is DynamicLayer:
            cache.layers.append(DynamicLayer())  # a cache made without the model's config grows its layers on use
        steps, heads, kv_heads, dim = self.steps, self.heads, self.kv_heads, self.head_dim
        states = [x]
        norm = self.layers[0].input_layernorm
        h = steps.rms_norm(x, norm.weight, norm.variance_epsilon)
        for index, (layer, products) in enumerate(zip(self.layers, self.fused, strict=True)):
            query, key, value = steps.attention_in(products.qkv(h), cos, sin, heads, kv_heads, dim)
            key, value = append(cache.layers[index], key, value)
            out = steps.attention_out(query, key, value, attention_mask, layer.self_attn.scaling)
            norm = layer.post_attention_layernorm
            x, h = steps.residual_norm(x, layer.self_attn.o_proj(out), norm.weight, norm.variance_epsilon)
            delta = layer.mlp.down_proj(steps.gated(products.gate_up(h)))
            if index + 1 < len(self.layers):  # the next layer's input norm, fused with this layer's residual sum
                norm = self.layers[index + 1].input_layernorm
                x, h = steps.residual_norm(x, delta, norm.weight, norm.variance_epsilon)
            else:
                x = x + delta
            states.append(x)
        x = self.decoder.norm(x)  # a module call: a draft head's hook reads its input (hidden_states.reading)
        states[-1] = x
        logits = self.model.lm_head(x[:, -logits_to_keep:] if logits_to_keep else x)
        return CausalLMOutputWithPast(logits=logits, cache=cache,
                                      hidden_states=tuple(states) if output_hidden_states else None)


class Steps:
    """A layer's steps between its products, in Python, for a machine where the native code cannot be built: what
    native.cpp's functions of the same names compute, by ATen's operators (native.cpp's attention and norm sum in
    another order: the same values to float32's rounding, not bit for bit)."""

    @staticmethod
    def attention_in(qkv: Tensor, cos: Tensor, sin: Tensor, heads: int, kv_heads: int,
                     dim: int) -> tuple[Tensor, Tensor, Tensor]:
        """The fused q|k|v product (B, T, (H + 2KV)·D) as query (B, H, T, D), key and value (B, KV, T, D), RoPE
        applied to query and key: x·cos + roll(x)·sin (`Rope`)."""
        batch, rows = qkv.shape[:2]
        qk = qkv[..., : (heads + kv_heads) * dim].view(batch, rows, heads + kv_heads, dim).transpose(1, 2)
        value = qkv[..., (heads + kv_heads) * dim :].view(batch, rows, kv_heads, dim).transpose(1, 2)
        qk = qk * cos + qk.roll(dim // 2, -1) * sin
        return qk[:, :heads], qk[:, heads:], value

    @staticmethod
    def attention_out(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, scale: float) -> Tensor:
        """Attention over the cached and new keys, as (B, T, H·D) for the output product. No mask: a chain after
        the cache, row i seeing the past and the pass's rows 0..i."""
        batch, heads, rows, dim = query.shape
        kv_heads, keys = key.shape[1], key.shape[2]
        if rows == 1 and mask is None:  # each key/value head's query heads as its rows: no grouping to resolve
            out = F.scaled_dot_product_attention(query.reshape(batch, kv_heads, heads // kv_heads, dim), key, value,
                                                 scale=scale).view(batch, heads, 1, dim)
        else:
            if mask is None:
                mask = torch.ones(rows, keys, dtype=torch.bool).tril(diagonal=keys - rows)
            out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale,
                                                 enable_gqa=heads != kv_heads)
        return out.transpose(1, 2).reshape(batch, rows, heads * dim)

    @staticmethod
    def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)

    @staticmethod
    def residual_norm(x: Tensor, delta: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
        """The residual sum and its RMS norm (the next product's input)."""
        total = x + delta
        return total, Steps.rms_norm(total, weight, eps)

    @staticmethod
    def gated(gate_up: Tensor) -> Tensor:
        """SwiGLU's SiLU(gate)·up from the fused gate|up product."""
        half = gate_up.shape[-1] // 2
        return F.silu(gate_up[..., :half]) * gate_up[..., half:]


def steps() -> object:
    """The native steps where native.cpp builds here, else `Steps`: the same floats either way."""
    try:
        return native.module()
    except RuntimeError:
        return Steps


_INSTALLED: weakref.WeakKeyDictionary[nn.Module, Compact] = weakref.WeakKeyDictionary()
_STOCK: dict[type, Callable] = {}  # each patched class's own forward


def install(model: nn.Module, active: Callable[[], bool]) -> Compact | None:
    """Serve `model`'s calls by the compact forward whenever `active()` (and the call qualifies); None, and
    transformers' forward always, for a model it cannot stand in for. Installed per object, never per class: a
    shallow copy (a layer-skip draft) keeps transformers' forward until installed itself."""
    if refusal(model) is not None:
        return None
    if model not in _INSTALLED:
        _INSTALLED[model] = Compact(model, active)
        _patch(type(model))
    return _INSTALLED[model]


def _patch(cls: type) -> None:
    if cls in _STOCK:
        return
    stock = _STOCK[cls] = cls.forward

    def forward(self: nn.Module, *args, **kwargs):  # noqa: ANN202 - transformers' own signature
        compact = _INSTALLED.get(self)
        if compact is None or args or not compact.active() or not _serves(kwargs):
            return stock(self, *args, **kwargs)
        return compact.forward(**kwargs)

    cls.forward = forward
