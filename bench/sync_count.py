"""Host syncs per round on a GPU, counted by CUDA itself: torch's sync debug mode warns at every operation that
makes the host wait for the device, and this counts the warnings inside each speculative round.

Run from the repository root on a CUDA machine: `python bench/sync_count.py --device cuda`.
"""

from __future__ import annotations

import argparse
import collections
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from runner.engine.drafters.registry import parse_draft
from runner.engine.drafters.spec import PLAIN
from runner.engine.pair import Pair  # noqa: E402
from runner.engine.round import decode
from runner.engine.round.decoding_rule import Decoding  # noqa: E402
from runner.engine.weights import models  # noqa: E402
from runner.prompts import load_prompts  # noqa: E402


def syncs_per_round(pair: Pair, spec_text: str, decoding: Decoding, prompt: list[int], k: int) -> collections.Counter:
    """How many rounds made 0, 1, 2, … synchronising calls."""
    spec = parse_draft(spec_text)
    counts: collections.Counter = collections.Counter()
    real_round = decode.speculative_round

    def counted(*args, **kwargs):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                return real_round(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("default")
                counts[sum("synchroniz" in str(w.message) for w in caught)] += 1

    decode.speculative_round = counted
    try:
        pair.run(spec, prompt, None if spec.baseline else k, decoding, 48, seed=0)
    finally:
        decode.speculative_round = real_round
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=models.DEFAULT_MODEL)
    parser.add_argument("--drafts", default="ngram,layerskip:24")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--k", type=int, default=4)
    args = parser.parse_args()
    target = models.load(args.target, args.device, args.dtype)
    if target.device.type != "cuda":
        sys.exit("sync_count: needs a CUDA device")
    drafts = args.drafts.split(",")
    pair = Pair(target, [parse_draft(d) for d in drafts])
    prompt = models.encode_chat(target, load_prompts()[0].text)
    for decoding in (Decoding("greedy", 0.0, 1.0), Decoding("sample", 0.7, 1.0)):
        pair.warm_up([PLAIN, *(parse_draft(d) for d in drafts)], prompt, (args.k,), decoding, 48)
        for spec in [PLAIN.text, *drafts]:
            counts = syncs_per_round(pair, spec, decoding, prompt, args.k)
            shown = ", ".join(f"{n} sync(s): {rounds} round(s)" for n, rounds in sorted(counts.items()))
            print(f"{decoding.mode:6} {spec:14} {shown}")


if __name__ == "__main__":
    main()
