"""Draft-head checkpoints on disk: find one (a directory or a Hugging Face repo id), check it against the target
before any model work, load it, and save one without ever leaving a half-written directory.
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
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import PretrainedConfig

from runner.engine.heads import EagleHead, HeadConfig, HeadError

CONFIG, WEIGHTS = "config.json", "model.safetensors"
SAVE_DTYPE = torch.bfloat16  # half the bytes of fp32; the head runs in the target's dtype once loaded
EMBEDDING = "embed_tokens.weight"  # some published heads carry a copy of the target's embedding


@dataclass(frozen=True)
class HeadFile:
    """A head checked against one target: where it is, its shape, and the target layers it reads."""

    path: Path  # the directory holding config.json and model.safetensors
    config: HeadConfig
    layers: tuple[int, ...]  # indices into the target's hidden_states, as `Drafter.wants_hidden` asks


def resolve(source: str) -> Path:
    """A local directory, else a repo id from the local Hugging Face cache (downloaded when HF_HUB_OFFLINE=0)."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if source.startswith(("/", ".", "~")) or path.exists():
        raise HeadError(f"no such draft head directory: {source}")
    try:
        return Path(snapshot_download(source, allow_patterns=[CONFIG, WEIGHTS],
                                      local_files_only=os.environ.get("HF_HUB_OFFLINE", "1") != "0"))
    except (OSError, ValueError, HfHubHTTPError):
        raise HeadError(f'no draft head "{source}": not a directory, and not in the local Hugging Face cache '
                        "(no hub access)") from None


def expected_shapes(c: HeadConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the published layout and its shape."""
    h, inner = c.hidden_size, c.intermediate_size
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    return {
        "fc.weight": (h, 3 * c.target_hidden_size),
        "midlayer.self_attn.q_proj.weight": (q, 2 * h), "midlayer.self_attn.k_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv, 2 * h), "midlayer.self_attn.o_proj.weight": (h, q),
        "midlayer.mlp.gate_proj.weight": (inner, h), "midlayer.mlp.up_proj.weight": (inner, h),
        "midlayer.mlp.down_proj.weight": (h, inner),
        "midlayer.input_layernorm.weight": (h,), "midlayer.hidden_norm.weight": (h,),
        "midlayer.post_attention_layernorm.weight": (h,), "norm.weight": (h,),
        "lm_head.weight": (c.draft_vocab_size, h), "d2t": (c.draft_vocab_size,), "t2d": (c.vocab_size,),
    }


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
    except KeyError as missing:
        raise HeadError(f"{path / CONFIG}: missing {missing}") from None
    except (TypeError, ValueError, AttributeError):
        raise HeadError(f"{path / CONFIG}: a field has the wrong type") from None
    if config.aux_layer_ids is not None and len(config.aux_layer_ids) != 3:
        raise HeadError(f"{path / CONFIG}: eagle_aux_hidden_state_layer_ids must name 3 layers")
    return config


def _shapes(path: Path) -> dict[str, tuple[int, ...]]:
    weights = path / WEIGHTS
    if not weights.is_file():
        if (path / "pytorch_model.bin").is_file():
            raise HeadError(f"{path}: only {WEIGHTS} is read (a pickled .bin file can run code when loaded); "
                            "convert it with safetensors first")
        raise HeadError(f"{path}: no {WEIGHTS}")
    try:
        with safe_open(weights, framework="pt") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except (SafetensorError, OSError, ValueError):
        raise HeadError(f"{weights}: not a readable safetensors file") from None


def check(source: str, target: PretrainedConfig) -> HeadFile:
    """Everything that can be refused without loading a model: files, shapes, and the fit with the target."""
    path = resolve(source)
    config = _config(path)
    shapes = _shapes(path)
    expected = expected_shapes(config)
    if config.draft_vocab_size == config.vocab_size:  # a full-vocabulary head may omit the identity map
        expected = {name: shape for name, shape in expected.items() if name not in ("d2t", "t2d") or name in shapes}
    for name, shape in expected.items():
        if name not in shapes:
            raise HeadError(f"{path / WEIGHTS}: no tensor {name}")
        if shapes[name] != shape:
            raise HeadError(f"{path / WEIGHTS}: {name} has shape {list(shapes[name])}, config.json implies "
                            f"{list(shape)}")
    if config.target_hidden_size != target.hidden_size:
        raise HeadError(f"{path}: the head reads hidden states of width {config.target_hidden_size}, the target's "
                        f"are {target.hidden_size} wide: a head for another target")
    if config.vocab_size != target.vocab_size:
        raise HeadError(f"{path}: the head's vocabulary has {config.vocab_size} tokens, the target's "
                        f"{target.vocab_size}: a head for another target")
    if EMBEDDING in shapes and shapes[EMBEDDING] != (target.vocab_size, target.hidden_size):
        raise HeadError(f"{path / WEIGHTS}: {EMBEDDING} does not match the target's embedding")
    layers = config.hidden_layers(target.num_hidden_layers)
    if not all(0 <= i <= target.num_hidden_layers for i in layers):
        raise HeadError(f"{path}: the head reads layers {list(layers)}, the target has {target.num_hidden_layers}")
    if "d2t" in shapes:
        _check_vocabulary(path, config)
    return HeadFile(path, config, layers)


def _check_vocabulary(path: Path, config: HeadConfig) -> None:
    """d2t must map the draft rows to distinct target ids, exactly the ones t2d marks."""
    with safe_open(path / WEIGHTS, framework="pt") as f:
        d2t, t2d = f.get_tensor("d2t").long(), f.get_tensor("t2d").bool()
    ids = torch.arange(d2t.numel()) + d2t
    in_range = bool(((ids >= 0) & (ids < config.vocab_size)).all())
    if not in_range or ids.unique().numel() != ids.numel() or not bool(t2d[ids.clamp(0, config.vocab_size - 1)].all()) \
            or int(t2d.sum()) != ids.numel():
        raise HeadError(f"{path / WEIGHTS}: d2t and t2d do not map the draft vocabulary onto distinct target tokens")


def load(checked: HeadFile, embed_tokens: nn.Embedding, device: torch.device, dtype: torch.dtype) -> EagleHead:
    """The head on `device` in `dtype`, reading its tokens through the target's embedding (or its own copy)."""
    try:
        tensors = load_file(checked.path / WEIGHTS)
    except (SafetensorError, OSError, ValueError):
        raise HeadError(f"{checked.path / WEIGHTS}: not a readable safetensors file") from None
    own = tensors.pop(EMBEDDING, None)
    head = EagleHead(checked.config, nn.Embedding(1, 1), checked.layers)  # the embedding is attached after .to()
    if "d2t" not in tensors:
        head.set_vocabulary(torch.arange(checked.config.vocab_size))
    head.load_state_dict(tensors, strict=False)
    head.to(device=device, dtype=dtype)
    head.embed_tokens = embed_tokens if own is None else nn.Embedding.from_pretrained(own.to(device, dtype))
    return head.eval().requires_grad_(False)


def save(head: EagleHead, out: Path) -> None:
    """Write `out` whole or not at all: staged beside it, then swapped in by renames."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        tensors = {name: (t.to(SAVE_DTYPE) if t.is_floating_point() else t).contiguous()
                   for name, t in head.weights().items()}
        save_file(tensors, staging / WEIGHTS, metadata={"format": "pt"})
        (staging / CONFIG).write_text(json.dumps(head.config.to_json(), indent=2) + "\n", encoding="utf-8")
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
