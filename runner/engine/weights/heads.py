"""EAGLE-style draft heads: decoder layers over the target's own hidden states and the next token's embedding.

A head reads the target's hidden states from a few layers (EAGLE-3: a low, a middle and a high one), fuses
them with `fc`, runs a Llama decoder layer whose attention sees [embedding of the next token; fused features],
and scores a draft vocabulary: the V most frequent target tokens, mapped back to target ids (Li et al. 2024, 2025;
FR-Spec). The weights keep the names EAGLE-3 heads are published under (SafeAILab/EAGLE, SpecForge, vLLM, SGLang):
`fc`, `midlayer.*`, `norm`, `lm_head`, `d2t` (draft id + d2t = target id) and `t2d` (which target ids the draft
vocabulary holds); the variants the serving engines read are flags of `HeadConfig` (`head_config.py`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from transformers.activations import ACT2FN
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from runner.engine.weights.head_config import HeadConfig

# attend(layer, q (B, H, T, d), k, v (B, KV, T, d)) -> (B, H, T, d): the layer's cache at inference, the unrolled
# mask in training
Attend = Callable[[int, Tensor, Tensor, Tensor], Tensor]


class Attention(nn.Module):
    """Llama attention whose projections read `width` features: 2h in the midlayer ([embedding; hidden]), h after."""

    def __init__(self, c: HeadConfig, width: int, layer: int) -> None:
        super().__init__()
        self.layer = layer  # which of the head's caches its keys go to
        self.head_dim = c.head_dim
        bias = c.attention_bias
        self.q_proj = nn.Linear(width, c.num_attention_heads * c.head_dim, bias=bias)
        self.k_proj = nn.Linear(width, c.num_key_value_heads * c.head_dim, bias=bias)
        self.v_proj = nn.Linear(width, c.num_key_value_heads * c.head_dim, bias=bias)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=bias)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, attend: Attend) -> Tensor:
        batch, length, _ = x.shape
        shape = (batch, length, -1, self.head_dim)
        q = self.q_proj(x).view(shape).transpose(1, 2)  # (B, H, T, d)
        k = self.k_proj(x).view(shape).transpose(1, 2)  # (B, KV, T, d)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return self.o_proj(attend(self.layer, q, k, v).transpose(1, 2).reshape(batch, length, -1))


class MLP(nn.Module):
    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)
        self.act = ACT2FN[c.hidden_act]

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """A plain pre-norm Llama layer: the layers after the midlayer (`layers.1.*`, …), as vLLM runs them."""

    def __init__(self, c: HeadConfig, width: int, layer: int) -> None:
        super().__init__()
        self.self_attn = Attention(c, width, layer)
        self.mlp = MLP(c)
        self.input_layernorm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)

    def forward(self, hidden: Tensor, cos: Tensor, sin: Tensor, attend: Attend) -> Tensor:
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), cos, sin, attend)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class MidLayer(nn.Module):
    """EAGLE-3's first layer: the residual stream is the hidden state; the embedding only enters the attention."""

    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.self_attn = Attention(c, 2 * c.hidden_size, 0)
        self.mlp = MLP(c)
        self.input_layernorm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.hidden_norm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.norm_before_residual = c.norm_before_residual

    def forward(self, emb: Tensor, hidden: Tensor, cos: Tensor, sin: Tensor, attend: Attend) -> Tensor:
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden  # vLLM's norm_before_residual: starts normed
        x = torch.cat([self.input_layernorm(emb), normed], dim=-1)  # (B, T, 2h)
        hidden = residual + self.self_attn(x, cos, sin, attend)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class EagleHead(nn.Module):
    """The head's weights under the published names; `embed_tokens` is the target's own (frozen, not saved) unless
    the checkpoint carries one."""

    def __init__(self, c: HeadConfig, embed_tokens: nn.Embedding | None, target_layers: tuple[int, ...]) -> None:
        super().__init__()
        self.config = c
        self.target_layers = target_layers  # the target hidden_states it reads, resolved for the target's depth
        self.embed_tokens = embed_tokens
        features = c.target_hidden_size * len(target_layers)
        if c.norm_before_fc:  # one RMSNorm over the concatenated features (speculators, vLLM: `input_norm`)
            self.input_norm = nn.RMSNorm(features, eps=c.rms_norm_eps)
        if c.fc_norm:  # EAGLE-3.1: an RMSNorm per target layer's features, before they are concatenated
            self.fc_norm = nn.ModuleList(nn.RMSNorm(c.target_hidden_size, eps=c.rms_norm_eps)
                                         for _ in target_layers)
        self.fc = nn.Linear(features, c.hidden_size, bias=c.fc_bias)
        self.midlayer = MidLayer(c)
        self.layers = nn.ModuleDict({str(i): DecoderLayer(c, c.hidden_size, i) for i in range(1, c.num_layers)})
        self.norm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(c.vocab_size, dtype=torch.bool))
        self.rotary = LlamaRotaryEmbedding(c.llama())

    def placed(self, device: torch.device, dtype: torch.dtype) -> EagleHead:
        """The head on `device` with its weights in `dtype`, the rotary inverse frequencies kept in fp32 as
        transformers and the serving engines keep them (cast to bf16 they shift every angle)."""
        self.to(device=device, dtype=dtype)
        self.rotary = LlamaRotaryEmbedding(self.config.llama()).to(device)  # built in fp32, moved as it is
        return self

    @property
    def draft_ids(self) -> Tensor:
        """(Vd,) the target id of each draft-vocabulary row."""
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    def set_vocabulary(self, target_ids: Tensor) -> None:
        """Make the draft vocabulary `target_ids` (Vd,), in the order of the LM head's rows."""
        self.d2t.copy_(target_ids - torch.arange(target_ids.numel(), device=target_ids.device))
        self.t2d.zero_()
        self.t2d[target_ids] = True

    def fuse(self, features: Tensor) -> Tensor:
        """(…, n·H) the target's features side by side -> (…, h), the midlayer's first `hidden`."""
        features = features.to(self.fc.weight.dtype)
        if self.config.fc_norm:
            parts = features.split(self.config.target_hidden_size, dim=-1)
            features = torch.cat([norm(part) for norm, part in zip(self.fc_norm, parts, strict=True)], dim=-1)
        if self.config.norm_before_fc:
            features = self.input_norm(features)
        return self.fc(features)

    def step(self, hidden: Tensor, tokens: Tensor, positions: Tensor, attend: Attend) -> Tensor:
        """One pass of the layers: `hidden` (B, T, h) is fused target features or what the head fed itself,
        `tokens` (B, T) the tokens that follow them; returns the last layer's output (B, T, h), before the norm."""
        emb = self.embed_tokens(tokens).to(hidden.dtype)
        cos, sin = self.rotary(hidden, positions)
        out = self.midlayer(emb, hidden, cos, sin, attend)
        for layer in self.layers.values():
            out = layer(out, cos, sin, attend)
        return out

    def feedback(self, out: Tensor) -> Tensor:
        """What the next draft step reads as `hidden`: the output before the norm (EAGLE-3), or after it with
        `norm_output` (EAGLE-3.1)."""
        return self.norm(out) if self.config.norm_output else out

    def logits(self, out: Tensor) -> Tensor:
        """(…, h) a step's output -> (…, Vd) scores over the draft vocabulary."""
        return self.lm_head(self.norm(out))

    def weights(self) -> dict[str, Tensor]:
        """The tensors a checkpoint holds: everything but the target's embedding."""
        return {name: t for name, t in self.state_dict().items() if not name.startswith("embed_tokens.")}
