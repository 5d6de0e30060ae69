"""Where a target pass goes, beside the machine's two limits: the memory bandwidth of a large copy and the FLOP/s of a
large matrix product, measured in the same run at the same thread count.

Each path times a one-token pass and a 64-row pass (a chain after the cache), min and median over repeats: stock
(transformers' layers on F.linear), skinny (transformers' layers on our kernels) and compact (compact_llama.py on our
kernels). Per path it also counts the torch operators a one-token pass dispatches and times its linears alone (each
product of the pass run back to back on the path's kernels), so that the rest is the layer code's own cost. Every
pass, every path's linears, the copy and the product take turns in each repeat, so the fractions set each pass
against limits measured beside it. The fractions: the weight bytes a one-token pass reads over its time against the
copy's bytes/s; a 64-row pass's multiply-adds (2 FLOP each, the linears' weights times the rows) over its time
against the product's.

`python bench/limits.py [--threads N] [--repeats 9] [--context 200]`
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for `runner`

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from bench.passes import COPY_BYTES, copy_job, weight_bytes  # noqa: E402
from runner.engine.round.draft import crop_to, new_cache  # noqa: E402
from runner.engine.weights import kernels, models  # noqa: E402
from runner.engine.weights.kernels import all_cores  # noqa: E402
from runner.prompts import load_prompts  # noqa: E402

STOCK, SKINNY, COMPACT = "stock", "skinny", "compact"
PATHS = (STOCK, SKINNY, COMPACT)
WIDE = 64  # rows of the wide pass: the widest verify pass (a 63-node tree, a batch's B x (k+1))
PRODUCT = 2048  # the large product: (N, N) @ (N, N), far past any cache, 2 N^3 FLOP
# `interleaved`'s job keys beside WIDE: the one-token pass, its products alone, and the machine's two limits
ONE, LINEARS, COPY, PRODUCT_JOB = 1, "linears", "copy", "product"


@dataclass(frozen=True)
class Limits:
    copy_gbs: list[float]  # per repeat: bytes read + written / s, 1e9
    product_gflops: list[float]  # per repeat: 2 N^3 / s, 1e9


def machine_jobs() -> dict[str, Callable[[], None]]:
    """A large copy and a large product at torch's current thread count, one call each per repeat, to be timed in
    turn with the passes (`interleaved`): the memory a shared host serves drifts over minutes (a copy measured
    34.7 GB/s in one run and 54.6 in the next on the 2-core EPYC), so a limit timed before or after the passes is
    not theirs."""
    a, b = torch.randn(PRODUCT, PRODUCT), torch.randn(PRODUCT, PRODUCT)
    return {COPY: copy_job(torch.device("cpu")), PRODUCT_JOB: lambda: torch.mm(a, b)}


def limits_from(times: dict) -> Limits:
    """The limits from `interleaved`'s milliseconds of `machine_jobs`."""
    return Limits([2 * COPY_BYTES / ms / 1e6 for ms in times[COPY]],
                  [2 * PRODUCT**3 / ms / 1e6 for ms in times[PRODUCT_JOB]])


def linear_flops(model: nn.Module, rows: int) -> int:
    """FLOP of the linears of a pass of `rows` rows: 2 per weight per row (each tied tensor counted where used)."""
    return 2 * rows * sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


class Passes:
    """A target with a cache holding `context` tokens, and a pass of `rows` new ones on each path that leaves the
    cache as it found it."""

    def __init__(self, target: models.Loaded, context: int) -> None:
        self.model, self.switch = target.model, kernels.attach(target.model)
        self.switch.table()
        suite = [t for p in load_prompts() for t in models.encode_chat(target, p.text)]
        self.ids = torch.tensor((suite * (1 + (context + WIDE) // len(suite)))[: context + WIDE])
        self.context, self.cache = context, new_cache(self.model)
        with torch.inference_mode():
            self.model(input_ids=self.ids[None, :context], cache=self.cache, use_cache=True, logits_to_keep=1)

    def run(self, path: str, rows: int) -> None:
        fed = self.ids[None, self.context : self.context + rows]
        # return_dict is not a call the compact forward serves: transformers' layers, on our kernels (its rule).
        extra = {"return_dict": True} if path == SKINNY else {}
        with torch.inference_mode(), kernels.using([] if path == STOCK else [self.switch]):
            self.model(input_ids=fed, cache=self.cache, use_cache=True, logits_to_keep=rows, **extra)
        crop_to(self.cache, self.context)

    def linears_only(self, path: str) -> Callable[[], None]:
        """The one-token pass's products alone, on the path's kernels, in the pass's order."""
        compact = self.switch.compact
        every = [m for m in self.model.modules() if isinstance(m, nn.Linear)]
        chosen = self.switch.linears if path == COMPACT and compact else every
        x = {m: torch.randn(1, 1, m.in_features) for m in chosen}

        def run() -> None:
            with torch.inference_mode(), kernels.using([] if path == STOCK else [self.switch]):
                for m in chosen:
                    m(x[m])
        return run

    def operators(self, path: str) -> int:
        """The torch operators one one-token pass calls on this path (top level: not those they call in turn)."""
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            self.run(path, 1)
        return sum(1 for event in prof.events() if event.name.startswith("aten::") and event.cpu_parent is None)


def interleaved(jobs: dict[Hashable, Callable[[], None]], repeats: int) -> dict[Hashable, list[float]]:
    """Milliseconds per call of each job, the jobs taking turns (the order flipping each repeat) after one warm call."""
    times: dict[Hashable, list[float]] = {name: [] for name in jobs}
    for repeat in range(repeats + 1):
        for name in list(jobs) if repeat % 2 else list(reversed(jobs)):
            start = time.perf_counter()
            jobs[name]()
            if repeat:
                times[name].append((time.perf_counter() - start) * 1000)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default=models.DEFAULT_MODEL)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--context", type=int, default=200)
    args = parser.parse_args(argv)
    threads = args.threads or all_cores()
    torch.set_num_threads(threads)
    target = models.load(args.target, "cpu", "float32")
    passes = Passes(target, args.context)
    times = interleaved({**{(ONE, p): lambda p=p: passes.run(p, 1) for p in PATHS},
                         **{(WIDE, p): lambda p=p: passes.run(p, WIDE) for p in PATHS},
                         **{(LINEARS, p): passes.linears_only(p) for p in PATHS}, **machine_jobs()}, args.repeats)
    one, wide, linears = ({p: times[(what, p)] for p in PATHS} for what in (ONE, WIDE, LINEARS))
    limits = limits_from(times)
    copy, product = statistics.median(limits.copy_gbs), statistics.median(limits.product_gflops)
    read, flops = weight_bytes(target.model), linear_flops(target.model, WIDE)
    print(f"{args.target}, {threads} threads, context {args.context}, {args.repeats} repeats (median, min), load "
          f"{os.getloadavg()[0]:.2f}")
    print(f"copy {copy:.1f} GB/s (max {max(limits.copy_gbs):.1f}); {PRODUCT}^2 product {product:.1f} GFLOP/s "
          f"(max {max(limits.product_gflops):.1f}); one-token pass reads {read / 1e6:.0f} MB; 64 rows: "
          f"{flops / 1e9:.2f} GFLOP")
    print("| path | 1-token ms | its linears ms | rest ms | aten ops | GB/s / copy | 64-row ms | GFLOP/s / product |")
    print("|---|---|---|---|---|---|---|---|")
    for p in PATHS:
        t1, tl, tw = (statistics.median(d[p]) for d in (one, linears, wide))
        print(f"| {p} | {t1:.1f} ({min(one[p]):.1f}) | {tl:.1f} ({min(linears[p]):.1f}) | {t1 - tl:.1f} | "
              f"{passes.operators(p)} | {read / t1 / 1e6 / copy:.2f} | {tw:.1f} ({min(wide[p]):.1f}) | "
              f"{flops / tw / 1e6 / product:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
