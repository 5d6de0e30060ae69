"""Draft-head checkpoints on disk: find one (a directory or a Hugging Face repo id), check it against the target
before any model work, load it, and save one without ever leaving a half-written directory.

Every tensor a head holds is one the configured layout reads; anything else is refused, never dropped.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from huggingface_hub import snapshot_download
from huggingface_hub.errors import HfHubHTTPError
from safetensors.torch import save_file
from torch import Tensor, nn
from transformers import PretrainedConfig

from runner.engine.weights.head_config import HeadConfig, HeadError
from runner.engine.weights.head_weights import PATTERNS, SAFETENSORS, Weights, find
from runner.engine.weights.heads import EagleHead

CONFIG, WEIGHTS = "config.json", SAFETENSORS
SAVE_DTYPE = torch.bfloat16  # half the bytes of fp32; the head runs in the target's dtype once loaded
EMBEDDING = "embed_tokens.weight"  # the head's own embedding, which a head narrower than its target needs
READS = 3  # target layers a head reads: `fc` is [h, 3·H] in every published layout


@dataclass(frozen=True)
class HeadFile:
    """A head checked against one target: where it is, its shape, and the target layers it reads."""

    path: Path  # the directory holding config.json and the weights
    config: HeadConfig
    layers: tuple[int, ...]  # indices into the target's hidden_states, as `Drafter.wants_hidden` asks
    weights: Weights
    t2d: str  # how the draft vocabulary's map was obtained: read, derived from d2t, or the identity


def resolve(source: str, patterns: list[str] = PATTERNS) -> Path:
    """A local directory, else a repo id from the local Hugging Face cache (downloaded when HF_HUB_OFFLINE=0), of
    which only the files matching `patterns` are fetched."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if source.startswith(("/", ".", "~")) or path.exists():
        raise HeadError(f"no such draft head directory: {source}")
    try:
        return Path(snapshot_download(source, allow_patterns=patterns,
                                      local_files_only=os.environ.get("HF_HUB_OFFLINE", "1") != "0"))
    except (OSError, ValueError, HfHubHTTPError):
        raise HeadError(f'no draft head "{source}": not a directory, and not in the local Hugging Face cache '
                        "(no hub access)") from None


def _layer(prefix: str, c: HeadConfig, width: int) -> dict[str, tuple[int, ...]]:
    """A decoder layer's tensors: attention reading `width`, the MLP, the norms (and biases when configured)."""
    h, inner = c.hidden_size, c.intermediate_size
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    shapes = {f"{prefix}.self_attn.q_proj.weight": (q, width), f"{prefix}.self_attn.k_proj.weight": (kv, width),
              f"{prefix}.self_attn.v_proj.weight": (kv, width), f"{prefix}.self_attn.o_proj.weight": (h, q),
              f"{prefix}.mlp.gate_proj.weight": (inner, h), f"{prefix}.mlp.up_proj.weight": (inner, h),
              f"{prefix}.mlp.down_proj.weight": (h, inner), f"{prefix}.input_layernorm.weight": (h,),
              f"{prefix}.post_attention_layernorm.weight": (h,)}
    if c.attention_bias:
        shapes |= {f"{prefix}.self_attn.{p}_proj.bias": (n,) for p, n in (("q", q), ("k", kv), ("v", kv), ("o", h))}
    return shapes


def expected_shapes(c: HeadConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the configured layout reads and its shape (`d2t`, `t2d` and an own embedding aside)."""
    h, features = c.hidden_size, READS * c.target_hidden_size
    shapes = {"fc.weight": (h, features), **_layer("midlayer", c, 2 * h), "midlayer.hidden_norm.weight": (h,),
              "norm.weight": (h,), "lm_head.weight": (c.draft_vocab_size, h)}
    for i in range(1, c.num_layers):
        shapes |= _layer(f"layers.{i}", c, h)
    if c.fc_bias:
        shapes["fc.bias"] = (h,)
    if c.norm_before_fc:
        shapes["input_norm.weight"] = (features,)
    if c.fc_norm:
        shapes |= {f"fc_norm.{i}.weight": (c.target_hidden_size,) for i in range(READS)}
    return shapes


def _config(path: Path) -> HeadConfig:
    try:
        obj = json.loads((path / CONFIG).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HeadError(f"{path}: no {CONFIG}") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise HeadError(f"{path / CONFIG}: not valid JSON") from None
    if not isinstance(obj, dict):
        raise HeadError(f"{path / CONFIG}: expected a JSON object")
    try:
        config = HeadConfig.from_json(obj)
    except HeadError as refused:
        raise HeadError(f"{path / CONFIG}: {refused}") from None
    except KeyError as missing:
        raise HeadError(f"{path / CONFIG}: missing {missing}") from None
    except (TypeError, ValueError, AttributeError):
        raise HeadError(f"{path / CONFIG}: a field has the wrong type") from None
    if config.aux_layer_ids is not None and len(config.aux_layer_ids) != READS:
        raise HeadError(f"{path / CONFIG}: {config.aux_key} must name {READS} layers, it names "
                        f"{len(config.aux_layer_ids)}")
    if config.num_layers < 1:
        raise HeadError(f"{path / CONFIG}: num_hidden_layers must be at least 1")
    if config.fc_norm and config.norm_before_fc:
        raise HeadError(f"{path / CONFIG}: both fc_norm and norm_before_fc are set: the features would be normed twice")
    return config


def _check_tensors(path: Path, config: HeadConfig, shapes: dict[str, tuple[int, ...]]) -> None:
    expected = expected_shapes(config)
    optional = {EMBEDDING, "d2t", "t2d"}
    for name in sorted(shapes):
        if name not in expected and name not in optional:
            flags = ", ".join(f"{k}={v}" for k, v in config.flags().items())
            raise HeadError(f"{path}: tensor {name} is not read by this head's layout ({flags}); refused, not dropped")
    for name, shape in expected.items():
        if name not in shapes:
            raise HeadError(f"{path}: no tensor {name}")
        if shapes[name] != shape:
            raise HeadError(f"{path}: {name} has shape {list(shapes[name])}, config.json implies {list(shape)}")
    vocab = {"d2t": (config.draft_vocab_size,), "t2d": (config.vocab_size,)}
    for name, shape in vocab.items():
        if name in shapes and shapes[name] != shape:
            raise HeadError(f"{path}: {name} has shape {list(shapes[name])}, config.json implies {list(shape)}")
    if "d2t" not in shapes and config.draft_vocab_size != config.vocab_size:
        raise HeadError(f"{path}: no tensor d2t, which a draft vocabulary smaller than the target's needs")


def _check_target(path: Path, config: HeadConfig, shapes: dict[str, tuple[int, ...]],
                  target: PretrainedConfig) -> tuple[int, ...]:
    """The head against the target: widths, vocabulary, embedding, and the layers it reads (returned)."""
    if config.target_hidden_size != target.hidden_size:
        raise HeadError(f"{path}: the head reads hidden states of width {config.target_hidden_size}, the target's "
                        f"are {target.hidden_size} wide: a head for another target")
    if config.vocab_size != target.vocab_size:
        raise HeadError(f"{path}: the head's vocabulary has {config.vocab_size} tokens, the target's "
                        f"{target.vocab_size}: a head for another target")
    if EMBEDDING in shapes and shapes[EMBEDDING] != (target.vocab_size, config.hidden_size):
        raise HeadError(f"{path}: {EMBEDDING} has shape {list(shapes[EMBEDDING])}, not the target's vocabulary "
                        f"by the head's width {config.hidden_size}")
    if EMBEDDING not in shapes and config.hidden_size != target.hidden_size:
        raise HeadError(f"{path}: the head is {config.hidden_size} wide and the target's embedding "
                        f"{target.hidden_size}: a head of another width must carry its own {EMBEDDING}")
    layers = config.hidden_layers(target.num_hidden_layers)
    if not all(0 <= i <= target.num_hidden_layers for i in layers):
        raise HeadError(f"{path}: the head reads hidden states {list(layers)}, the target has "
                        f"{target.num_hidden_layers} layers, so hidden states 0 to {target.num_hidden_layers}")
    return layers


def check(source: str, target: PretrainedConfig) -> HeadFile:
    """Everything that can be refused without loading a model: files, tensors, and the fit with the target."""
    path = resolve(source)
    config = _config(path)
    weights = find(path)
    _check_tensors(path, config, weights.shapes)
    layers = _check_target(path, config, weights.shapes, target)
    _vocabulary(path, config, weights)
    origin = "read from the file" if "t2d" in weights.shapes else "derived from d2t" if "d2t" in weights.shapes \
        else "none: the full vocabulary, in order"
    return HeadFile(path, config, layers, weights, origin)


def _vocabulary(path: Path, config: HeadConfig, weights: Weights) -> tuple[Tensor, Tensor]:
    """d2t and t2d, t2d derived from d2t when the file has none (vLLM and SGLang never read it); d2t must map the
    draft rows to distinct target ids, exactly the ones a stored t2d marks."""
    stored = weights.get(("d2t", "t2d"))
    d2t = stored.get("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long)).long()
    ids = torch.arange(d2t.numel()) + d2t
    if not bool(((ids >= 0) & (ids < config.vocab_size)).all()) or ids.unique().numel() != ids.numel():
        raise HeadError(f"{path}: d2t does not map the draft vocabulary onto distinct target tokens")
    derived = torch.zeros(config.vocab_size, dtype=torch.bool)
    derived[ids] = True
    if "t2d" in stored and not torch.equal(stored["t2d"].bool(), derived):
        raise HeadError(f"{path}: t2d does not mark exactly the target tokens d2t maps the draft vocabulary onto")
    return d2t, derived


def load(checked: HeadFile, embed_tokens: nn.Embedding, device: torch.device, dtype: torch.dtype) -> EagleHead:
    """The head on `device` in `dtype`, reading its tokens through the target's embedding (or its own)."""
    tensors = checked.weights.read()
    own = tensors.pop(EMBEDDING, None)
    tensors["d2t"], tensors["t2d"] = _vocabulary(checked.path, checked.config, checked.weights)
    head = EagleHead(checked.config, None, checked.layers)  # the embedding is attached once the head is placed
    head.load_state_dict(tensors, strict=True)  # check() refused every tensor outside the layout
    head.placed(device, dtype)
    head.embed_tokens = embed_tokens if own is None else nn.Embedding.from_pretrained(own.to(device, dtype))
    return head.eval().requires_grad_(False)


def save(head: EagleHead, out: Path) -> None:
    """Write `out` whole or not at all (`write_dir`): bf16 weights and the config."""
    write_dir(out, head.weights(), WEIGHTS, head.config.to_json())


def write_dir(out: Path, weights: dict[str, Tensor], weights_name: str, config: dict) -> None:
    """Write a head directory whole or not at all: `config` as config.json and the weights (floats in SAVE_DTYPE) as
    safetensors `weights_name`, staged beside `out`, then swapped in by renames."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        tensors = {name: (t.to(SAVE_DTYPE) if t.is_floating_point() else t).detach().contiguous()
                   for name, t in weights.items()}
        save_file(tensors, staging / weights_name, metadata={"format": "pt"})
        (staging / CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        old = out.with_name(f".{out.name}-old") if out.exists() else None
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
            out.rename(old)
        staging.rename(out)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
