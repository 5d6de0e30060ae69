"""A draft head's tensors on disk, in each layout the serving engines load: `model.safetensors`, shards listed by
`model.safetensors.index.json`, `pytorch_model.bin` (read with `weights_only`, so a pickle cannot run code) or its
shards by `pytorch_model.bin.index.json`. Anything unreadable is refused in one line (HeadError)."""

from __future__ import annotations

import json
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from torch import Tensor

from runner.engine.weights.head_config import HeadError

SAFETENSORS, BIN = "model.safetensors", "pytorch_model.bin"
INDEX = ".index.json"
# What a directory is looked up for, in this order; also what a repo id downloads.
LAYOUTS = (SAFETENSORS, SAFETENSORS + INDEX, BIN, BIN + INDEX)
PATTERNS = ["config.json", SAFETENSORS, "model-*.safetensors", SAFETENSORS + INDEX, BIN, "pytorch_model-*.bin",
            BIN + INDEX]


@dataclass(frozen=True)
class Weights:
    """Where a head's tensors are: one file, or the shards an index names."""

    layout: str  # one of LAYOUTS
    files: tuple[Path, ...]
    shapes: dict[str, tuple[int, ...]]  # every tensor's name and shape

    def read(self) -> dict[str, Tensor]:
        tensors: dict[str, Tensor] = {}
        for path in self.files:
            tensors |= _read(path, mmap=False)
        return tensors

    def get(self, names: tuple[str, ...]) -> dict[str, Tensor]:
        """Some of the tensors, without reading the rest (the safetensors way) or with the file mapped (.bin)."""
        found: dict[str, Tensor] = {}
        for path in self.files:
            if path.suffix == ".safetensors":
                with _opened(path) as f:
                    found |= {name: f.get_tensor(name) for name in names if name in f.keys()}
            else:
                found |= {name: t for name, t in _read(path, mmap=True).items() if name in names}
        return found

    @property
    def described(self) -> str:
        return f"{self.layout} ({len(self.files)} shards)" if self.layout.endswith(INDEX) else self.layout


def find(path: Path, layouts: tuple[str, ...] = LAYOUTS) -> Weights:
    """The first of `layouts` the directory holds, with every tensor's shape; HeadError if none is readable."""
    layout = next((name for name in layouts if (path / name).is_file()), None)
    if layout is None:
        raise HeadError(f"{path}: no weights ({', '.join(layouts)})")
    files = _shards(path, layout) if layout.endswith(INDEX) else (path / layout,)
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        if file.suffix == ".safetensors":
            with _opened(file) as f:
                found = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
        else:
            found = {name: tuple(t.shape) for name, t in _read(file, mmap=True).items()}
        if set(found) & set(shapes):
            raise HeadError(f"{file}: holds tensors another shard holds too")
        shapes |= found
    return Weights(layout, files, shapes)


def _shards(path: Path, layout: str) -> tuple[Path, ...]:
    index = path / layout
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        names = sorted(set(weight_map.values()))
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
        raise HeadError(f"{index}: not an index of shards (a JSON object with a weight_map)") from None
    if not names or not all(isinstance(n, str) and "/" not in n for n in names):
        raise HeadError(f"{index}: its weight_map names no shard files beside it")
    missing = [n for n in names if not (path / n).is_file()]
    if missing:
        raise HeadError(f"{index}: names {missing[0]}, which is not there")
    return tuple(path / n for n in names)


def _opened(path: Path):
    try:
        return safe_open(path, framework="pt")
    except (SafetensorError, OSError, ValueError):
        raise HeadError(f"{path}: not a readable safetensors file") from None


def _read(path: Path, mmap: bool) -> dict[str, Tensor]:
    if path.suffix == ".safetensors":
        try:
            return load_file(path)
        except (SafetensorError, OSError, ValueError):
            raise HeadError(f"{path}: not a readable safetensors file") from None
    try:
        # mapped when it can be: only the zip format torch.save writes since 1.6 maps
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap and zipfile.is_zipfile(path))
    except (pickle.UnpicklingError, RuntimeError, OSError, EOFError, ValueError):
        raise HeadError(f"{path}: not a PyTorch state dict of plain tensors (read with weights_only)") from None
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, Tensor) for k, v in obj.items()):
        raise HeadError(f"{path}: not a state dict (names to tensors)")
    return obj
