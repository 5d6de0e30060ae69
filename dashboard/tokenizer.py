"""The target's tokenizer without its weights, so the replay can show text instead of token ids."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def load(spec: str) -> PreTrainedTokenizerBase:
    """The tokenizer of a model spec; raises (OSError, ValueError, ModelError) when it cannot be had."""
    # Imported here: transformers and torch take seconds to import, and only the replay needs them.
    from runner.engine import models

    return models.load_tokenizer(spec)


def decoder(tokenizer: PreTrainedTokenizerBase | None) -> Callable[[int], str]:
    """Token id -> its text; without a tokenizer, the id itself in brackets."""
    if tokenizer is None:
        return lambda token_id: f"[{token_id}]"
    return lambda token_id: tokenizer.decode([token_id])
