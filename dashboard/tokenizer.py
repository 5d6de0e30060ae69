"""The target's tokenizer without its weights, so the replay can show text instead of token ids."""

from __future__ import annotations

from dashboard.fates import Decode
from runner.engine.weights import sources


def load(spec: str) -> Decode:
    """Token id -> its text for a model spec; raises (OSError, ValueError, ModelError) when it cannot be had.

    Where the spec's files hold a plain `tokenizer.json` (the default model once converted, most local
    directories), the `tokenizers` library reads it in a fraction of a second; otherwise transformers loads the
    tokenizer, after importing itself and torch (seconds on a small machine). Both decode a token alike, special
    tokens included (tests/dashboard/test_dashboard_tokenizer.py checks every id of the default model)."""
    if (plain := sources.plain_tokenizer_file(spec)) is not None:
        from tokenizers import Tokenizer

        fast = Tokenizer.from_file(str(plain))
        return lambda token_id: fast.decode([token_id], skip_special_tokens=False)
    from runner.engine.weights import models

    full = models.load_tokenizer(spec)
    return lambda token_id: full.decode([token_id])


def by_id(token_id: int) -> str:
    """Without a tokenizer: the id itself in brackets."""
    return f"[{token_id}]"
