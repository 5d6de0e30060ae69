"""How far a target's logits at one position move when the same text is verified in passes of different widths
(1 token against k+1 tokens, as plain decoding and a verify pass do): the measurement behind the numeric-tie
tolerance of `runner/engine/round/lossless.py`.

For every position it compares the two logit vectors and reports the largest |Δ logit| relative to the
position's largest |logit|, in units of the dtype's unit roundoff u, and the argmax flips with their top-2 gaps.
Run from the repository root: `python bench/tie_tolerance.py --dtype bfloat16 --width 9`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from runner.engine.round import lossless
from runner.engine.round.draft import new_cache  # noqa: E402
from runner.engine.weights import models  # noqa: E402
from runner.prompts import load_prompts  # noqa: E402


def logits_by_width(target: models.Loaded, ids: torch.Tensor, prefix: int, width: int) -> torch.Tensor:
    """(positions, V) fp32 logits of ids[prefix:], fed `width` tokens per pass after a prefill of `prefix`."""
    cache, rows = new_cache(target.model), []
    with torch.inference_mode():
        target.model(input_ids=ids[None, :prefix], cache=cache, use_cache=True, logits_to_keep=1)
        for start in range(prefix, ids.numel(), width):
            chunk = ids[None, start: start + width]
            rows.append(target.model(input_ids=chunk, cache=cache, use_cache=True,
                                     logits_to_keep=chunk.shape[1]).logits[0].float())
    return torch.cat(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=models.DEFAULT_MODEL)
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--prefix", type=int, default=100, help="tokens prefilled before the compared positions")
    parser.add_argument("--positions", type=int, default=270, help="positions compared")
    parser.add_argument("--width", type=int, default=9, help="tokens per pass of the wide side (k+1)")
    args = parser.parse_args()
    target = models.load(args.target, args.device, args.dtype)
    text = [t for p in load_prompts() for t in models.encode_chat(target, p.text)]
    ids = torch.tensor(text[: args.prefix + args.positions], device=target.device)
    one, wide = logits_by_width(target, ids, args.prefix, 1), logits_by_width(target, ids, args.prefix, args.width)
    u = lossless.unit_roundoff(target.dtype)
    relative = ((one - wide).abs().amax(-1) / one.abs().amax(-1)) / u
    top2 = one.topk(2, dim=-1).values
    flips = (one.argmax(-1) != wide.argmax(-1)).nonzero().view(-1).tolist()
    print(f"{args.target} on {target.device} in {lossless.dtype_name(target.dtype)}, {len(relative)} positions, "
          f"width 1 against {args.width}")
    print(f"max |Δ logit|: {(one - wide).abs().max():.4g}; relative to the position's max |logit|: "
          f"median {relative.median():.3g} u, max {relative.max():.3g} u (u = {u:.3g}); "
          f"tolerance {lossless.TIE_ULPS[target.dtype]} u")
    print(f"argmax flips: {len(flips)}; their top-2 gaps: "
          + ", ".join(f"{float(top2[i, 0] - top2[i, 1]):.3g}" for i in flips))


if __name__ == "__main__":
    main()
