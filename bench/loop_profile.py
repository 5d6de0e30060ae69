"""Where a generation's time goes outside the target's passes: for plain decoding and a few drafts, the wall time
per round beside the verify pass's own time (the round's clock marks); transformers' plain `generate` on the same
prompt, also with a static cache (which it compiles into CUDA graphs on a GPU); then the host's hottest functions
in one plain generation (cProfile) and torch's operators in another.

`python bench/loop_profile.py [--device cuda] [--dtype bfloat16] [--tokens 32] [--drafts ngram,ngram-tree:nodes=16]`
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for `runner`

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from runner.engine.drafters.registry import parse_draft
from runner.engine.drafters.spec import PLAIN
from runner.engine.pair import Pair  # noqa: E402
from runner.engine.round.clock import Clock  # noqa: E402
from runner.engine.round.decoding_rule import Decoding  # noqa: E402
from runner.engine.weights import models  # noqa: E402
from runner.prompts import load_prompts  # noqa: E402

GREEDY = Decoding("greedy", 0.0, 1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default=models.DEFAULT_MODEL)
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--drafts", default="ngram,ngram-tree:nodes=16")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    target = models.load(args.target, args.device, args.dtype)
    specs = [PLAIN, *(parse_draft(d) for d in args.drafts.split(","))]
    pair = Pair(target, specs[1:])
    clock = Clock(target.device)
    prompt = models.encode_chat(target, load_prompts()[0].text)
    print(f"{args.target} on {target.device} in {target.dtype}, prompt of {len(prompt)} tokens, {args.tokens} new")

    def ours(spec, k):
        return pair.run(spec, prompt, k, GREEDY, args.tokens, seed=0)

    def theirs(**options):
        ids = torch.tensor([prompt], device=target.device)
        with torch.inference_mode():
            return target.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                         max_new_tokens=args.tokens, min_new_tokens=args.tokens, **options)

    def timed(fn):
        """The median wall seconds of `args.repeats` calls after the one before them, and the last call's result."""
        walls = []
        for _ in range(args.repeats):
            start = clock()
            result = fn()
            walls.append(clock() - start)
        return statistics.median(walls), result

    for spec in specs:
        k = None if spec.baseline else args.k
        ours(spec, k)  # warm
        wall, generation = timed(lambda spec=spec, k=k: ours(spec, k))
        rounds = generation.rounds
        n = len(rounds)
        verify, draft = (sum(getattr(r, f) for r in rounds) / n * 1000 for f in ("verify_s", "draft_s"))
        print(f"ours {spec.text:22} {wall * 1000:7.1f} ms, prefill {generation.prefill_s * 1000:6.1f}, {n} rounds: "
              f"{(wall - generation.prefill_s) / n * 1000:6.2f} ms a round, of which verify {verify:6.2f}, "
              f"draft {draft:6.2f}")
    # A static cache makes transformers compile the forward on CUDA (mode reduce-overhead: CUDA graphs, one launch a
    # pass); on a CPU it only changes the cache.
    for label, options in (("", {}), (", static cache", {"cache_implementation": "static"})):
        start = clock()
        first = theirs(**options)
        first_s = clock() - start
        wall, again = timed(lambda options=options: theirs(**options))
        same = torch.equal(first, again)
        print(f"transformers generate{label}: {wall * 1000:7.1f} ms, {wall / args.tokens * 1000:6.2f} ms a token "
              f"(first call {first_s:.1f} s; later calls {'the same' if same else 'OTHER'} tokens)")

    for label, fn in (("ours plain", lambda: ours(PLAIN, None)), ("transformers plain", theirs)):
        profiler = cProfile.Profile()
        profiler.enable()
        fn()
        clock.settle()
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(18)
        print(f"\n--- cProfile, {label}, by own time\n" + "\n".join(out.getvalue().splitlines()[4:]))

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if target.device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        ours(PLAIN, None)
        clock.settle()
    print("\n--- torch.profiler, ours plain, by CPU time\n"
          + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=50))


if __name__ == "__main__":
    main()
