"""Our native code against another revision's, alternated in one process: that revision's native.cpp is built as a
second extension, and per repeat each build in turn sweeps every product of the target's passes (each linear's
blocked copy, back to back, as a pass runs them) at 1-8, 16, 32 and 64 rows, computes one layer's attention of 1, 5
and 64 rows after 100, 300 and 1,000 keys and its RoPE split of those rows, and runs a target pass of 1, k + 1 = 5
and 64 rows after a cache of `--context` tokens on the engine's kernels (the kernel table chosen with this
revision's build; the other build serves the same choices and the compact forward's steps, so the pass compares the
native code alone). Medians over repeats, and the median of the per-repeat ratios, which a load that drifts slowly
affects less.

`python bench/native_ab.py --against REV [--flags "-O3 -mavx2 -mfma -fopenmp"] [--repeats 15] [--threads N]`
(`--flags`: the other build's compiler flags; default this revision's, `native.flags()`)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for `runner`

import torch  # noqa: E402
from torch.utils import cpp_extension  # noqa: E402

from runner.engine.round.draft import crop_to, new_cache  # noqa: E402
from runner.engine.weights import kernels, models, native  # noqa: E402
from runner.engine.weights.kernels import all_cores  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PASS_ROWS = (1, 5, 64)  # one token, a verify of k = 4, and the wide pass of the limits
PRODUCT_ROWS = (*range(1, 9), 16, 32, 64)  # one sweep over a weight up to 8 rows; the wide path past them
ATTENTION_KEYS = (100, 300, 1000)
ATTENTION_REPEATS = 50  # a layer's attention takes microseconds: timed in a loop


def build_other(revision: str, flags: list[str], where: Path):
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{revision}:runner/engine/weights/native.cpp"],
                            check=True, capture_output=True, text=True).stdout
    path = where / "other_native.cpp"
    path.write_text(source)
    return cpp_extension.load("other_native", [str(path)], extra_cflags=flags, extra_ldflags=["-fopenmp"],
                              build_directory=str(where))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, help="the git revision whose native.cpp is the other build")
    parser.add_argument("--flags", default=None, help="the other build's compiler flags (default: this revision's)")
    parser.add_argument("--target", default=models.DEFAULT_MODEL)
    parser.add_argument("--threads", type=int, default=all_cores())
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--context", type=int, default=250)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ours = native.module()
    with tempfile.TemporaryDirectory() as where:
        other = build_other(args.against, args.flags.split() if args.flags else native.flags(), Path(where))
    builds = {"this": ours, args.against: other}
    target = models.load(args.target, "cpu", "float32")
    switch = kernels.attach(target.model)
    switch.table()
    copies = [(kernels.copy_of(kernels.BLOCKED, m.weight, native.blocked), m.bias, m.weight.shape[0])
              for m in switch.linears]
    generator = torch.Generator().manual_seed(0)
    widths = {m.weight.shape[1] for m in switch.linears}
    xs = {rows: {k: torch.randn(rows, k, generator=generator) for k in widths} for rows in PRODUCT_ROWS}
    vocab = target.model.config.vocab_size
    config = target.model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    attention = {(keys, rows): (torch.randn(1, heads, rows, dim, generator=generator),
                                torch.randn(1, kv_heads, keys + rows, dim, generator=generator),
                                torch.randn(1, kv_heads, keys + rows, dim, generator=generator))
                 for keys in ATTENTION_KEYS for rows in PASS_ROWS}
    rope = {rows: (torch.randn(1, rows, (heads + 2 * kv_heads) * dim, generator=generator),
                   *torch.randn(2, 1, 1, rows, dim, generator=generator)) for rows in PASS_ROWS}
    times: dict[tuple[str, int, str], list[float]] = {}

    def serve(build) -> None:
        """The engine's products call the native code through `native`, the compact forward its steps (RoPE,
        attention, norms) through its own reference: both to `build`."""
        native._built = build
        if switch.compact is not None:
            switch.compact.steps = build

    with torch.inference_mode(), switch.use():
        cache = new_cache(target.model)
        context = torch.randint(vocab, (1, args.context), generator=generator)
        target.model(input_ids=context, cache=cache, use_cache=True, logits_to_keep=1)
        fed = {rows: torch.randint(vocab, (1, rows), generator=generator) for rows in PASS_ROWS}
        for _ in range(args.repeats + 1):  # the first repeat warms up and is dropped
            for name, build in builds.items():
                serve(build)
                for rows in PASS_ROWS:
                    start = time.perf_counter()
                    target.model(input_ids=fed[rows], cache=cache, use_cache=True, logits_to_keep=rows)
                    times.setdefault(("pass", rows, name), []).append(time.perf_counter() - start)
                    crop_to(cache, args.context)
                for rows, x in xs.items():
                    start = time.perf_counter()
                    for blocks, bias, features in copies:
                        build.product(x[blocks.shape[1]], blocks, bias, features)
                    times.setdefault(("products", rows, name), []).append(time.perf_counter() - start)
                for (keys, rows), (query, key, value) in attention.items():
                    start = time.perf_counter()
                    for _ in range(ATTENTION_REPEATS):
                        build.attention_out(query, key, value, None, dim**-0.5)
                    seconds = (time.perf_counter() - start) / ATTENTION_REPEATS
                    times.setdefault((f"attention after {keys} keys,", rows, name), []).append(seconds)
                for rows, (qkv, cos, sin) in rope.items():
                    start = time.perf_counter()
                    for _ in range(ATTENTION_REPEATS):
                        build.attention_in(qkv, cos, sin, heads, kv_heads, dim)
                    seconds = (time.perf_counter() - start) / ATTENTION_REPEATS
                    times.setdefault(("attention_in (RoPE's split),", rows, name), []).append(seconds)
    serve(ours)
    print(f"{args.target}, {args.threads} threads, {args.repeats} repeats; this revision's build against "
          f"{args.against}'s; medians")
    for what, rows in dict.fromkeys(key[:2] for key in times):  # in the order first timed
        mine, theirs = (times[(what, rows, name)][1:] for name in builds)
        ratio = statistics.median(a / b for a, b in zip(mine, theirs, strict=True))
        scale, unit = (1e6, "us") if what.startswith("attention") else (1e3, "ms")
        print(f"{what} {rows} row(s): this {statistics.median(mine) * scale:6.2f} {unit}  {args.against} "
              f"{statistics.median(theirs) * scale:6.2f} {unit}  this/other {ratio:.3f}")


if __name__ == "__main__":
    main()
