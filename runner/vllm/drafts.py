"""Which of our drafts vLLM runs, and the exact speculative config each cell maps to.

vLLM drafts a chain of k tokens per step with one of its methods (`vllm/config/speculative.py`, `method`): prompt
lookup, a draft model, an EAGLE or EAGLE-3 head, Medusa heads, and others this project has no drafter for (suffix
decoding, MTP, DFlash), which `vllm:<method>[:<json>]` passes through. Our trees, token recycling, lookahead, hybrid
and layer-skip drafts have no vLLM method: they are refused before anything runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from runner.engine.drafters.registry import parse_draft
from runner.engine.drafters.spec import DraftSpec
from runner.vllm.head_ids import for_vllm

PASS_THROUGH = "vllm"  # the kind of a `vllm:<method>[:<json>]` draft
RUNS_ON_VLLM = ("baseline", "ngram", "model", "eagle", "medusa", PASS_THROUGH)
VLLM_MATCH = "earliest"  # vLLM's prompt lookup copies from the earliest occurrence (docs/engines.md)


class VllmRefusal(ValueError):
    """A draft, policy or setting vLLM cannot run; the message is one line naming the engine."""


def parse(text: str) -> DraftSpec:
    """A `--draft` for vLLM: ours where vLLM has the method, or `vllm:<method>[:<json>]`; VllmRefusal otherwise."""
    if text.startswith(f"{PASS_THROUGH}:"):
        method, _, extra = text.removeprefix(f"{PASS_THROUGH}:").partition(":")
        if not method:
            raise VllmRefusal(f'"{text}": give vLLM\'s method, e.g. vllm:suffix or vllm:mtp:{{"model": "<dir>"}}')
        if extra:
            _settings(text, extra)
        return DraftSpec(text, PASS_THROUGH, text.removeprefix(f"{PASS_THROUGH}:"))
    spec = parse_draft(text)
    if spec.kind not in RUNS_ON_VLLM:
        raise VllmRefusal(f'draft "{text}" cannot run on vLLM: it has no {spec.kind} method (vLLM drafts chains: '
                          "ngram, model:<spec>, eagle:<head>, medusa:<head>, or vllm:<method>[:<json>])")
    if spec.kind == "ngram" and text.count(":") == 2 and spec.match != VLLM_MATCH:
        raise VllmRefusal(f'draft "{text}" cannot run on vLLM: its prompt lookup copies from the {VLLM_MATCH} '
                          f"occurrence only (ngram:<n>:{VLLM_MATCH}, or ngram:<n>)")
    return spec


def _settings(text: str, extra: str) -> dict:
    try:
        settings = json.loads(extra)
    except json.JSONDecodeError:
        settings = None
    if not isinstance(settings, dict):
        raise VllmRefusal(f'"{text}": what follows the method must be a JSON object of vLLM\'s speculative config')
    return settings


def speculative_config(spec: DraftSpec, k: int | None, resolve: Callable[[str], str] = str) -> dict | None:
    """The speculative config vLLM runs the cell with; None for plain decoding. `resolve` turns a model spec into
    the directory vLLM loads (the target's GGUF, say, into the directory specdash writes for it)."""
    if spec.baseline:
        return None
    if spec.kind == "ngram":  # our ngram:<n> tries n-grams of n down to 1, as vLLM's lookup from max down to min
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": int(spec.arg),
                "prompt_lookup_min": 1}
    if spec.kind == "model":
        return {"method": "draft_model", "model": resolve(spec.arg), "num_speculative_tokens": k}
    if spec.kind == "eagle":  # an EAGLE-3 head's layer ids stated in vLLM's convention (runner/vllm/head_ids.py)
        method = eagle_method(Path(spec.arg))
        head = str(for_vllm(Path(_local(spec.arg)))) if method == "eagle3" else _local(spec.arg)
        return {"method": method, "model": head, "num_speculative_tokens": k}
    if spec.kind == "medusa":
        return {"method": "medusa", "model": _local(spec.arg), "num_speculative_tokens": k}
    method, _, extra = spec.arg.partition(":")
    return {"method": method, "num_speculative_tokens": k, **(_settings(spec.text, extra) if extra else {})}


def _local(head: str) -> str:
    """A head's directory made absolute (the server may run elsewhere than the working directory), a repo id kept."""
    path = Path(head).expanduser()
    return str(path.resolve()) if path.is_dir() else head


def eagle_method(head: Path) -> str:
    """'eagle3' for a head in the EAGLE-3 layout (its architecture says so, or it has a draft vocabulary), else
    'eagle'; a head without a config.json is left to vLLM to refuse."""
    config_file = head / "config.json"
    if not config_file.is_file():
        return "eagle"
    config = json.loads(config_file.read_text())
    eagle3 = any("eagle3" in a.lower() for a in config.get("architectures", [])) or "draft_vocab_size" in config
    return "eagle3" if eagle3 else "eagle"

