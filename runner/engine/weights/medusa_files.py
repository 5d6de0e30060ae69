"""Medusa-1 heads on disk, in the layout they are published in: find them (a directory or a repo id), check every
tensor against the target before any model work, load them, save them.

`config.json` holds `medusa_num_heads` and `medusa_num_layers` at its top level; the weights are
`medusa_lm_head.safetensors` or `medusa_lm_head.pt` (read with `weights_only`), named with or without the
`medusa_head.` prefix: head i's residual blocks `{i}.{j}.linear.weight` and `.bias` for j < medusa_num_layers, then
its LM head `{i}.{medusa_num_layers}.weight` (no bias), which may be left out to share the target's. Anything else is
refused in one line (HeadError), never dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PretrainedConfig

from runner.engine.weights.head_config import HeadError
from runner.engine.weights.head_files import CONFIG, resolve, write_dir
from runner.engine.weights.head_weights import Weights, find
from runner.engine.weights.medusa_heads import MedusaHeads

SAFETENSORS, PT = "medusa_lm_head.safetensors", "medusa_lm_head.pt"
PREFIX = "medusa_head."
PATTERNS = [CONFIG, SAFETENSORS, PT]  # what a repo id fetches


@dataclass(frozen=True)
class MedusaFile:
    """Heads checked against one target."""

    path: Path
    heads: int  # medusa_num_heads
    layers: int  # medusa_num_layers: residual blocks per head
    weights: Weights
    names: dict[str, str]  # published name without the prefix -> the name stored in the file
    own_lm_heads: tuple[bool, ...]  # per head: it carries its own LM head (else it reads the target's)


def _count(obj: dict, key: str, least: int, where: Path) -> int:
    value = obj[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise HeadError(f"{where}: {key} must be a whole number >= {least}, got {json.dumps(value)}")
    return value


def _config(path: Path) -> tuple[int, int]:
    """(medusa_num_heads, medusa_num_layers) from config.json."""
    where = path / CONFIG
    try:
        obj = json.loads(where.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HeadError(f"{path}: no {CONFIG}") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise HeadError(f"{where}: not valid JSON") from None
    if not isinstance(obj, dict) or "medusa_num_heads" not in obj or "medusa_num_layers" not in obj:
        raise HeadError(f"{where}: no medusa_num_heads and medusa_num_layers at its top level, so not the Medusa-1 "
                        "layout (other layouts are refused)")
    return _count(obj, "medusa_num_heads", 1, where), _count(obj, "medusa_num_layers", 0, where)


def expected_shapes(heads: int, layers: int, hidden: int, vocab: int) -> dict[str, tuple[int, ...]]:
    """Every tensor the layout may hold and its shape, the LM heads `{i}.{layers}.weight` included."""
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(heads):
        for j in range(layers):
            shapes |= {f"{i}.{j}.linear.weight": (hidden, hidden), f"{i}.{j}.linear.bias": (hidden,)}
        shapes[f"{i}.{layers}.weight"] = (vocab, hidden)
    return shapes


def _names(path: Path, stored: list[str]) -> dict[str, str]:
    """Published name -> stored name, the `medusa_head.` prefix taken off; two tensors of one name are refused."""
    names: dict[str, str] = {}
    for name in sorted(stored):
        bare = name.removeprefix(PREFIX)
        if bare in names:
            raise HeadError(f"{path}: holds both {names[bare]} and {name}")
        names[bare] = name
    return names


def published_as_medusa(source: str) -> bool:
    """Whether a head's config.json has Medusa-1's keys at its top level: how `check-head` tells the layout."""
    try:
        obj = json.loads((resolve(source, PATTERNS) / CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # HeadError is a ValueError: `check` then says what is wrong
        return False
    return isinstance(obj, dict) and "medusa_num_heads" in obj


def check(source: str, target: PretrainedConfig) -> MedusaFile:
    """Everything that can be refused before a model loads: the files, every tensor, and its fit with the target."""
    path = resolve(source, PATTERNS)
    heads, layers = _config(path)
    weights = find(path, (SAFETENSORS, PT))
    names = _names(weights.files[0], list(weights.shapes))
    hidden, vocab = target.hidden_size, target.vocab_size
    expected = expected_shapes(heads, layers, hidden, vocab)
    for bare, name in names.items():
        if bare not in expected:
            raise HeadError(f"{weights.files[0]}: tensor {name} is not in the layout of {heads} heads of {layers} "
                            "residual blocks each; refused, not dropped")
        if weights.shapes[name] != expected[bare]:
            raise HeadError(f"{weights.files[0]}: {name} has shape {list(weights.shapes[name])}, the target (hidden "
                            f"size {hidden}, vocabulary {vocab}) implies {list(expected[bare])}")
    lm_heads = {f"{i}.{layers}.weight" for i in range(heads)}
    for bare in expected:
        if bare not in names and bare not in lm_heads:
            raise HeadError(f"{weights.files[0]}: no tensor {bare} (with or without the {PREFIX} prefix)")
    own = tuple(f"{i}.{layers}.weight" in names for i in range(heads))
    return MedusaFile(path, heads, layers, weights, names, own)


def load(checked: MedusaFile, target_lm: torch.Tensor, vocab: int, device: torch.device,
         dtype: torch.dtype) -> MedusaHeads:
    """The heads on `device` in `dtype`; a head without its own LM head reads `target_lm` (V, H)."""
    tensors = checked.weights.read()
    heads = MedusaHeads(checked.heads, checked.layers, target_lm.shape[1], checked.own_lm_heads, target_lm, vocab)
    heads.load_weights({bare: tensors[name] for bare, name in checked.names.items()})
    return heads.to(device=device, dtype=dtype).eval().requires_grad_(False)


def save(heads: MedusaHeads, out: Path, target: str) -> None:
    """Write `out` whole or not at all, in the published layout (no prefix; the target's name alongside)."""
    config = {"medusa_num_heads": heads.heads, "medusa_num_layers": heads.layers, "base_model_name_or_path": target}
    write_dir(out, heads.weights(), SAFETENSORS, config)
