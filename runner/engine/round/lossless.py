"""Greedy lossless, honestly classified: where a speculative output first differs from plain greedy decoding,
and whether the target's choice there was a numeric tie or a real divergence.

A k+1-token verify pass and a 1-token pass run different kernels (another reduction order, another tiling), so
in low precision two near-equal logits can swap between them with nothing wrong in the decoding. The first
differing position is recomputed in one plain pass over the prompt and the common prefix, and the two
contested tokens (the baseline's and the speculative run's) are compared with the position's best logit.
"""

from __future__ import annotations

import torch

from runner.engine.weights.models import Loaded
from runner.records import Divergence, first_difference

# The tolerance per dtype, in units of its unit roundoff u, relative to the position's largest |logit|: two logits
# closer than TIE_ULPS · u · max|logit| can trade places between passes of different widths. Measured with
# bench/tie_tolerance.py (SmolLM2-135M, 1-token against 9-token passes, 270 positions, this project's CPU): a
# logit moved by at most 45 u in float32, 12.3 u in bfloat16 (1.28 logits; 3 argmax swaps, at top-2 gaps of
# 0.125-0.25) and 9.7 u in float16 (0.13 logits). A swap needs the two logits within the sum of their two moves, so
# twice the largest move, rounded up to a power of two for kernels not measured here (GPU GEMMs split their sums
# differently).
TIE_ULPS = {torch.float32: 128, torch.bfloat16: 32, torch.float16: 32}
_UNIT_ROUNDOFF = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the gap between 1 and the next number in `dtype`: its relative rounding error."""
    return _UNIT_ROUNDOFF[dtype]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def classify(target: Loaded, prompt: tuple[int, ...], baseline: tuple[int, ...],
             speculative: tuple[int, ...]) -> Divergence | None:
    """None when the outputs are equal; otherwise where they part and why."""
    at = first_difference(baseline, speculative)
    if at is None:
        return None
    ids = torch.tensor([list(prompt) + list(baseline[:at])], device=target.device)
    with torch.inference_mode():
        logits = target.model(input_ids=ids, logits_to_keep=1).logits[0, -1, : target.vocab_size].float()  # (V,)
    top = logits.topk(2).values
    tolerance = TIE_ULPS[target.dtype] * unit_roundoff(target.dtype) * float(logits.abs().max())
    contested = [seq[at] for seq in (baseline, speculative) if at < len(seq)]
    behind = max(float(top[0] - logits[token]) for token in contested)
    tie = len(contested) == 2 and behind <= tolerance
    return Divergence(at=at, gap=float(top[0] - top[1]), tolerance=tolerance, kind="tie" if tie else "real")
