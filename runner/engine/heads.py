"""EAGLE-style draft heads: one decoder layer over the target's own hidden states and the next token's embedding.

A head reads the target's hidden states from a few layers (EAGLE-3: a low, a middle and a high one), fuses
them with `fc`, runs one Llama decoder layer whose attention sees [embedding of the next token; fused
features], and scores a draft vocabulary: the V most frequent target tokens, mapped back to target ids
(Li et al. 2024, 2025; FR-Spec). The checkpoint is a directory with `config.json` + `model.safetensors` in the
layout EAGLE-3 heads are published in (SafeAILab/EAGLE, SpecForge): `fc`, `midlayer.*`, `norm`, `lm_head`,
`d2t` (draft id + d2t = target id) and `t2d` (which target ids the draft vocabulary holds).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from transformers import LlamaConfig
from transformers.activations import ACT2FN
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from runner.engine.models import ModelError

ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters")  # older configs: the first two; transformers 5: the last
# attend(q (B, H, T, d), k, v (B, KV, T, d)) -> (B, H, T, d): the cache at inference, the unrolled mask in training
Attend = Callable[[Tensor, Tensor, Tensor], Tensor]


class HeadError(ModelError):
    """A draft head that cannot be used with this target; the message is one line for the user."""


@dataclass(frozen=True)
class HeadConfig:
    """The head's shape, as `config.json` of a published EAGLE-3 head gives it."""

    hidden_size: int  # the head's width (published heads use the target's)
    target_hidden_size: int  # the target's width: `fc` reads len(layers) of its hidden states side by side
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    vocab_size: int  # the target's vocabulary: draft tokens are target ids
    draft_vocab_size: int  # rows of the head's own LM head
    # Target layers whose OUTPUT is read (EAGLE-3's `eagle_aux_hidden_state_layer_ids`); None: the published
    # default, the inputs of layers 2, L/2 and L-3 of an L-layer target.
    aux_layer_ids: tuple[int, ...] | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 8192
    rope: dict = field(default_factory=lambda: {"rope_theta": 10000.0})  # the config's ROPE_KEYS, as given
    target: str | None = None  # the target spec a specdash-trained head was trained for (informative)

    def hidden_layers(self, target_layers: int) -> tuple[int, ...]:
        """Indices into the target's `hidden_states` (0: embeddings, i: the input of layer i)."""
        if self.aux_layer_ids is None:
            return (2, target_layers // 2, target_layers - 3)
        return tuple(i + 1 for i in self.aux_layer_ids)

    def llama(self) -> LlamaConfig:
        """The rotary embedding and activation of transformers' Llama, which published heads use."""
        return LlamaConfig(
            hidden_size=self.hidden_size, num_attention_heads=self.num_attention_heads, head_dim=self.head_dim,
            num_key_value_heads=self.num_key_value_heads, max_position_embeddings=self.max_position_embeddings,
            **self.rope,
        )

    @classmethod
    def from_json(cls, obj: dict) -> HeadConfig:
        hidden, heads = int(obj["hidden_size"]), int(obj["num_attention_heads"])
        aux = (obj.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        rope = {name: obj[name] for name in ROPE_KEYS if obj.get(name)} or {"rope_theta": 10000.0}
        return cls(
            hidden_size=hidden, target_hidden_size=int(obj.get("target_hidden_size") or hidden),
            intermediate_size=int(obj["intermediate_size"]), num_attention_heads=heads,
            num_key_value_heads=int(obj.get("num_key_value_heads") or heads),
            head_dim=int(obj.get("head_dim") or hidden // heads), rms_norm_eps=float(obj.get("rms_norm_eps", 1e-6)),
            vocab_size=int(obj["vocab_size"]), draft_vocab_size=int(obj.get("draft_vocab_size") or obj["vocab_size"]),
            aux_layer_ids=None if aux is None else tuple(int(i) for i in aux),
            hidden_act=str(obj.get("hidden_act", "silu")),
            max_position_embeddings=int(obj.get("max_position_embeddings", 8192)), rope=rope,
            target=(obj.get("specdash") or {}).get("target"),
        )

    def to_json(self) -> dict:
        return {
            "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
            "hidden_size": self.hidden_size, "target_hidden_size": self.target_hidden_size,
            "intermediate_size": self.intermediate_size, "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps, "hidden_act": self.hidden_act,
            "max_position_embeddings": self.max_position_embeddings, "tie_word_embeddings": False,
            "vocab_size": self.vocab_size, "draft_vocab_size": self.draft_vocab_size, "torch_dtype": "bfloat16",
            **self.rope,
            **({} if self.aux_layer_ids is None else {
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids)}}),
            **({} if self.target is None else {"specdash": {"target": self.target}}),
        }


class Attention(nn.Module):
    """Llama attention whose projections read 2h: [normed embedding; normed hidden state]."""

    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.head_dim = c.head_dim
        self.q_proj = nn.Linear(2 * c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, attend: Attend) -> Tensor:
        batch, length, _ = x.shape
        shape = (batch, length, -1, self.head_dim)
        q = self.q_proj(x).view(shape).transpose(1, 2)  # (B, H, T, d)
        k = self.k_proj(x).view(shape).transpose(1, 2)  # (B, KV, T, d)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return self.o_proj(attend(q, k, v).transpose(1, 2).reshape(batch, length, -1))


class MLP(nn.Module):
    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)
        self.act = ACT2FN[c.hidden_act]

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    """EAGLE-3's decoder layer: the residual stream is the hidden state; the embedding only enters the attention."""

    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.hidden_norm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)

    def forward(self, emb: Tensor, hidden: Tensor, cos: Tensor, sin: Tensor, attend: Attend) -> Tensor:
        x = torch.cat([self.input_layernorm(emb), self.hidden_norm(hidden)], dim=-1)  # (B, T, 2h)
        hidden = hidden + self.self_attn(x, cos, sin, attend)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class EagleHead(nn.Module):
    """The head's weights under the published names; `embed_tokens` is the target's own (frozen, not saved)."""

    def __init__(self, c: HeadConfig, embed_tokens: nn.Embedding, layers: tuple[int, ...]) -> None:
        super().__init__()
        self.config = c
        self.layers = layers  # the target hidden_states it reads, resolved for the target's depth
        self.embed_tokens = embed_tokens
        self.fc = nn.Linear(c.target_hidden_size * 3, c.hidden_size, bias=False)
        self.midlayer = MidLayer(c)
        self.norm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(c.vocab_size, dtype=torch.bool))
        self.rotary = LlamaRotaryEmbedding(c.llama())

    @property
    def draft_ids(self) -> Tensor:
        """(Vd,) the target id of each draft-vocabulary row."""
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    def set_vocabulary(self, target_ids: Tensor) -> None:
        """Make the draft vocabulary `target_ids` (Vd,), in the order of the LM head's rows."""
        self.d2t.copy_(target_ids - torch.arange(target_ids.numel(), device=target_ids.device))
        self.t2d.zero_()
        self.t2d[target_ids] = True

    def step(self, hidden: Tensor, tokens: Tensor, positions: Tensor, attend: Attend) -> Tensor:
        """One pass of the layer: `hidden` (B, T, h) is fused target features or the head's own previous output,
        `tokens` (B, T) the tokens that follow them; returns the layer's output (B, T, h), the next `hidden`."""
        emb = self.embed_tokens(tokens).to(hidden.dtype)
        cos, sin = self.rotary(hidden, positions)
        return self.midlayer(emb, hidden, cos, sin, attend)

    def logits(self, hidden: Tensor) -> Tensor:
        """(…, h) -> (…, Vd) scores over the draft vocabulary."""
        return self.lm_head(self.norm(hidden))

    def weights(self) -> dict[str, Tensor]:
        """The tensors a checkpoint holds: everything but the target's embedding."""
        return {name: t for name, t in self.state_dict().items() if not name.startswith("embed_tokens.")}
