"""A prompt that does not fit the model's context with its new tokens is refused before anything runs, never
truncated: `generate` and `sweep` say it in the same one line."""

from __future__ import annotations

from collections.abc import Sequence


def check_fit(lengths: Sequence[tuple[str, int]], max_new_tokens: int, context: int) -> None:
    """ValueError naming the first prompt (id, tokens) whose tokens + `max_new_tokens` pass `context`, with its
    lengths and how many more do."""
    over = [(prompt_id, n) for prompt_id, n in lengths if n + max_new_tokens > context]
    if not over:
        return
    (prompt_id, n), more = over[0], len(over) - 1
    others = f" (and {more} more prompt{'s' if more > 1 else ''})" if more else ""
    raise ValueError(f'prompt "{prompt_id}" ({n:,} tokens) + max-new-tokens ({max_new_tokens:,}) exceeds the '
                     f"model's context of {context:,} tokens{others}; nothing is truncated: leave it out or lower "
                     "--max-new-tokens")
