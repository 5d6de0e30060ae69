"""EAGLE-3's draft step written out from the published equations, in float64 and without caches, to check the
head's variants against: every flag's effect is spelled out here, apart from runner/engine/weights/heads.py."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def rms(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def linear(t: dict[str, Tensor], name: str, x: Tensor) -> Tensor:
    y = x @ t[f"{name}.weight"].T
    return y + t[f"{name}.bias"] if f"{name}.bias" in t else y


def rotate(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    """Llama's rotary embedding on (T, heads, d): the two halves of each head rotated by position × frequency."""
    d = x.shape[-1]
    angle = positions[:, None].double() / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)  # (T, d/2)
    cos, sin = torch.cat([angle.cos()] * 2, -1)[:, None], torch.cat([angle.sin()] * 2, -1)[:, None]
    return x * cos + torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1) * sin


def attention(t: dict[str, Tensor], prefix: str, x: Tensor, c: dict) -> Tensor:
    """Causal grouped-query attention over all T rows, at positions 0..T-1."""
    length, heads, groups = x.shape[0], c["num_attention_heads"], c["num_attention_heads"] // c["num_key_value_heads"]
    d = c["hidden_size"] // heads
    positions = torch.arange(length)
    q = rotate(linear(t, f"{prefix}.q_proj", x).view(length, heads, d), positions, c["rope_theta"])
    k = rotate(linear(t, f"{prefix}.k_proj", x).view(length, -1, d), positions, c["rope_theta"])
    v = linear(t, f"{prefix}.v_proj", x).view(length, -1, d)
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(length, length, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.einsum("hts,shd->thd", scores.softmax(-1), v).reshape(length, -1)
    return linear(t, f"{prefix}.o_proj", out)


def mlp(t: dict[str, Tensor], prefix: str, x: Tensor) -> Tensor:
    gate = linear(t, f"{prefix}.gate_proj", x)
    return linear(t, f"{prefix}.down_proj", gate * torch.sigmoid(gate) * linear(t, f"{prefix}.up_proj", x))


def fuse(t: dict[str, Tensor], c: dict, features: Tensor) -> Tensor:
    eps = c["rms_norm_eps"]
    if c.get("fc_norm"):  # one norm per target layer's features
        parts = features.split(features.shape[-1] // 3, dim=-1)
        features = torch.cat([rms(p, t[f"fc_norm.{i}.weight"], eps) for i, p in enumerate(parts)], dim=-1)
    if c.get("norm_before_fc"):  # one norm over all of them
        features = rms(features, t["input_norm.weight"], eps)
    return linear(t, "fc", features)


def layers(t: dict[str, Tensor], c: dict, hidden: Tensor, tokens: Tensor) -> Tensor:
    """The midlayer on [embedding; hidden], then any plain layers; the output before the final norm."""
    eps = c["rms_norm_eps"]
    normed = rms(hidden, t["midlayer.hidden_norm.weight"], eps)
    residual = normed if c.get("norm_before_residual") else hidden
    x = torch.cat([rms(t["embed_tokens.weight"][tokens], t["midlayer.input_layernorm.weight"], eps), normed], -1)
    out = residual + attention(t, "midlayer.self_attn", x, c)
    out = out + mlp(t, "midlayer.mlp", rms(out, t["midlayer.post_attention_layernorm.weight"], eps))
    for i in range(1, c.get("num_hidden_layers", 1)):
        out = out + attention(t, f"layers.{i}.self_attn", rms(out, t[f"layers.{i}.input_layernorm.weight"], eps), c)
        out = out + mlp(t, f"layers.{i}.mlp", rms(out, t[f"layers.{i}.post_attention_layernorm.weight"], eps))
    return out


def two_drafts(t: dict[str, Tensor], c: dict, features: Tensor, tokens: Tensor, first: int) -> tuple[Tensor, Tensor]:
    """The head's scores (Vd,) for the first draft after `tokens` (features: one row per token but the last) and
    for the second once `first` is drafted: a pass over the committed pairs, then one with the head's own output
    fed back at the end, as the drafter's cache holds them."""
    eps = c["rms_norm_eps"]
    fused = fuse(t, c, features)
    out = layers(t, c, fused, tokens[1:])
    normed = rms(out[-1], t["norm.weight"], eps)
    fed = normed if c.get("norm_output") else out[-1]
    again = layers(t, c, torch.cat([fused, fed[None]]), torch.cat([tokens[1:], torch.tensor([first])]))
    return linear(t, "lm_head", normed), linear(t, "lm_head", rms(again[-1], t["norm.weight"], eps))
