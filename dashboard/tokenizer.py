"""The target's tokenizer without its weights, so the replay can show text instead of token ids.

Resolves a model spec the way `runner.models` does: `smollm2-135m` and `.gguf` files through the
runner's dequantized copy (made once per file and shared with the runner), anything else as a local
directory or a Hugging Face id already in the local cache (there is no hub access).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def load(spec: str) -> PreTrainedTokenizerBase:
    """The tokenizer of a model spec; raises (OSError, ValueError, ModelError) when it cannot be had."""
    # Imported here: transformers and torch take seconds to import, and only the replay needs them.
    from transformers import AutoTokenizer

    from runner import models

    if spec == models.DEFAULT_MODEL or spec.endswith(".gguf"):
        gguf = models.smollm2_gguf() if spec == models.DEFAULT_MODEL else Path(spec)
        source = str(models.dequantized(gguf))
    else:
        source = str(Path(spec).expanduser()) if spec.startswith("~") else spec
    return AutoTokenizer.from_pretrained(source, local_files_only=True)


def decoder(tokenizer: PreTrainedTokenizerBase | None) -> Callable[[int], str]:
    """Token id -> its text; without a tokenizer, the id itself in brackets."""
    if tokenizer is None:
        return lambda token_id: f"[{token_id}]"
    return lambda token_id: tokenizer.decode([token_id])
