"""An EAGLE-3 head as vLLM must be given it to read the target layers it was trained on.

A head's `eagle_aux_hidden_state_layer_ids` come in two conventions. vLLM 0.32 reads them as indices into the
target's hidden states, layer inputs (`vllm/model_executor/models/interfaces.py`, `_maybe_add_hidden_state`: id i
is the input of layer i, 0 the embeddings). SGLang, SpecForge and this project's trainer write ids that start at 1
as layer outputs (id 1: the output of layer 1, the input of layer 2; runner/engine/head_config.py, `id_shift`).
Given such a head as it is, vLLM reads every feature one layer early. So vLLM gets a copy whose config states the
layers in its own convention (the weights linked, not copied), made once per head in specdash's cache.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from runner.engine.weights.head_config import IDS, HeadConfig
from runner.engine.weights.sources import cache_dir, exclusive


def vllm_ids(config: dict) -> list[int] | None:
    """The layer ids vLLM must read for this head config; None when vLLM reads the head's own as they are meant
    (no explicit ids: both engines take the same default layers; ids not starting at 1: already layer inputs)."""
    head = HeadConfig.from_json(config)
    if head.aux_layer_ids is None or head.id_shift == 0:
        return None
    return list(head.hidden_layers(0))


def for_vllm(head: Path) -> Path:
    """The head itself, or its copy with the layer ids in vLLM's convention."""
    config_file = head / "config.json"
    if not config_file.is_file():
        return head
    config = json.loads(config_file.read_text())
    ids = vllm_ids(config)
    if ids is None:
        return head
    key = hashlib.sha256(config_file.read_bytes() + str(head.resolve()).encode()).hexdigest()[:16]
    copy = cache_dir() / "vllm-heads" / f"{head.name}-{key}"
    with exclusive(copy.parent / f"{copy.name}.lock"):
        if not (copy / "config.json").is_file():
            copy.mkdir(parents=True, exist_ok=True)
            for item in head.iterdir():
                if item.name != "config.json" and not (copy / item.name).exists():
                    (copy / item.name).symlink_to(item.resolve())
            eagle = {**(config.get("eagle_config") or {}), IDS: ids}
            (copy / "config.json").write_text(json.dumps({**config, IDS: ids, "eagle_config": eagle}, indent=2))
    return copy
