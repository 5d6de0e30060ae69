"""A draft head's `config.json`, read the way the serving engines read EAGLE-3 heads, or refused in one line.

Published heads are Llama configs with `num_hidden_layers`, `vocab_size` (the target's), `draft_vocab_size`,
optional `target_hidden_size` and the target layers they read; the variants below are flags that change the
computation, each implemented as the engine that introduced it runs it. `mlp_bias`, which the engines do not
agree on (vLLM's layer would build MLP biases, SGLang's would not), is refused rather than guessed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import LlamaConfig

from runner.engine.weights.models import ModelError

ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters")  # older configs: the first two; transformers 5: the last
IDS = "eagle_aux_hidden_state_layer_ids"
# Where a config names its target layers, in the order vLLM looks: the top level first, then SpecForge's place.
ID_KEYS = (IDS, f"eagle_config.{IDS}")
# config key -> HeadConfig field, for the flags that change what the head computes
FLAGS = {"norm_before_residual": "norm_before_residual", "norm_before_fc": "norm_before_fc", "fc_norm": "fc_norm",
         "norm_output": "norm_output", "bias": "fc_bias", "attention_bias": "attention_bias"}


class HeadError(ModelError):
    """A draft head that cannot be used with this target; the message is one line for the user."""


@dataclass(frozen=True)
class HeadConfig:
    """The head's shape and variant, as its `config.json` gives them."""

    hidden_size: int  # the head's width (published heads mostly use the target's; a narrower one has its own embedding)
    target_hidden_size: int  # the target's width: `fc` reads len(layers) of its hidden states side by side
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    vocab_size: int  # the target's vocabulary: draft tokens are target ids
    draft_vocab_size: int  # rows of the head's own LM head
    # Target layer ids as the config writes them (`aux_key` says where), in either convention; None: the published
    # default, the inputs of layers 2, L/2 and L-3 of an L-layer target.
    aux_layer_ids: tuple[int, ...] | None = None
    aux_key: str | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 8192
    rope: dict = field(default_factory=lambda: {"rope_theta": 10000.0})  # the config's ROPE_KEYS, as given
    target: str | None = None  # the target spec a specdash-trained head was trained for (informative)
    num_layers: int = 1  # num_hidden_layers: the midlayer, then plain decoder layers `layers.1.*`, … (vLLM)
    norm_before_residual: bool = False  # vLLM: the midlayer's residual stream starts from the normed hidden state
    norm_before_fc: bool = False  # speculators, vLLM: one RMSNorm (`input_norm`) over the concatenated features
    fc_norm: bool = False  # EAGLE-3.1: an RMSNorm per target layer (`fc_norm.<i>`) before concatenating
    norm_output: bool = False  # EAGLE-3.1: the next step reads the head's normed output, not the raw one
    fc_bias: bool = False  # `bias`: fc has a bias (SGLang)
    attention_bias: bool = False  # q, k, v and o projections have biases (Llama's `attention_bias`)

    def hidden_layers(self, target_layers: int) -> tuple[int, ...]:
        """Indices into the target's hidden states (0: embeddings, i: the input of layer i, L: the last layer's
        output before the final norm), in ascending order for explicit ids, as the engines capture them."""
        if self.aux_layer_ids is None:
            return (2, target_layers // 2, target_layers - 3)
        return tuple(sorted(i + self.id_shift for i in self.aux_layer_ids))

    @property
    def id_shift(self) -> int:
        """SGLang's rule: ids starting at 1 name layer outputs (SpecForge: output of layer 1 = input of layer 2);
        any other first id names layer inputs (vLLM), used as they are."""
        return 1 if self.aux_layer_ids and self.aux_layer_ids[0] == 1 else 0

    def llama(self) -> LlamaConfig:
        """The rotary embedding of transformers' Llama, which published heads use."""
        return LlamaConfig(
            hidden_size=self.hidden_size, num_attention_heads=self.num_attention_heads, head_dim=self.head_dim,
            num_key_value_heads=self.num_key_value_heads, max_position_embeddings=self.max_position_embeddings,
            **self.rope,
        )

    @classmethod
    def from_json(cls, obj: dict) -> HeadConfig:
        """Raises KeyError for a missing field, TypeError or ValueError for a wrong one, HeadError for a refused one."""
        if "transformer_layer_config" in obj:
            raise HeadError("a speculators-format config (transformer_layer_config, speculators_config) is not read "
                            "here; the published EAGLE-3 format is")
        hidden, heads = int(obj["hidden_size"]), int(obj["num_attention_heads"])
        if obj.get("mlp_bias"):
            raise HeadError("mlp_bias is set: MLP biases are not supported")
        aux_key, aux = _layer_ids(obj)
        rope = {name: obj[name] for name in ROPE_KEYS if obj.get(name)} or {"rope_theta": 10000.0}
        return cls(
            hidden_size=hidden, target_hidden_size=int(obj.get("target_hidden_size") or hidden),
            intermediate_size=int(obj["intermediate_size"]), num_attention_heads=heads,
            num_key_value_heads=int(obj.get("num_key_value_heads") or heads),
            head_dim=int(obj.get("head_dim") or hidden // heads), rms_norm_eps=float(obj.get("rms_norm_eps", 1e-6)),
            vocab_size=int(obj["vocab_size"]), draft_vocab_size=int(obj.get("draft_vocab_size") or obj["vocab_size"]),
            aux_layer_ids=aux, aux_key=aux_key, hidden_act=str(obj.get("hidden_act", "silu")),
            max_position_embeddings=int(obj.get("max_position_embeddings", 8192)), rope=rope,
            target=(obj.get("specdash") or {}).get("target"), num_layers=int(obj.get("num_hidden_layers") or 1),
            **{name: _flag(obj, key) for key, name in FLAGS.items()},
        )

    def to_json(self) -> dict:
        flags = {key: True for key, name in FLAGS.items() if getattr(self, name)}
        return {
            "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": self.num_layers,
            "hidden_size": self.hidden_size, "target_hidden_size": self.target_hidden_size,
            "intermediate_size": self.intermediate_size, "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps, "hidden_act": self.hidden_act,
            "max_position_embeddings": self.max_position_embeddings, "tie_word_embeddings": False,
            "vocab_size": self.vocab_size, "draft_vocab_size": self.draft_vocab_size, "torch_dtype": "bfloat16",
            **self.rope, **flags,
            **({} if self.aux_layer_ids is None else {"eagle_config": {IDS: list(self.aux_layer_ids)}}),
            **({} if self.target is None else {"specdash": {"target": self.target}}),
        }

    def flags(self) -> dict[str, object]:
        """The config's variant, under the config's own names."""
        return {"num_hidden_layers": self.num_layers} | {key: getattr(self, name) for key, name in FLAGS.items()}


def _flag(obj: dict, key: str) -> bool:
    value = obj.get(key)
    if value is not None and not isinstance(value, bool):
        raise TypeError(key)
    return bool(value)


def _layer_ids(obj: dict) -> tuple[str | None, tuple[int, ...] | None]:
    """The explicit target layer ids and the key they were read from; (None, None) when the config names none."""
    found = [(ID_KEYS[0], obj.get(IDS)), (ID_KEYS[1], (obj.get("eagle_config") or {}).get(IDS))]
    for key, ids in found:
        if ids:
            if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                raise TypeError(key)
            return key, tuple(ids)
    return None, None
