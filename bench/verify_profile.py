"""Where a verify pass spends its time: torch.profiler's top operators for passes over 1 and k+1 tokens,
and the LM head's matrix product by the number of rows it multiplies.

`python bench/verify_profile.py [--target SPEC] [--device cuda] [--context 200] [--threads 1] [--widths 1,3]
[--kernels stock]`; on CUDA each timed pass ends with a synchronize and the profile holds the device's kernels too.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for `runner`

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from runner.engine.round.draft import crop_to, new_cache  # noqa: E402
from runner.engine.weights import kernels, models  # noqa: E402


def _median_ms(fn, repeats: int, device: torch.device) -> float:
    fn()  # warm
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    parser.add_argument("--context", type=int, default=200, help="tokens already in the KV cache")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--widths", default="1,3", help="tokens per profiled pass, comma-separated")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--kernels", default=kernels.SKINNY, choices=[kernels.SKINNY, kernels.STOCK],
                        help="the linears of the passes (default: %(default)s)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = models.load(args.target, args.device)
    model, vocab, device = target.model, target.model.config.vocab_size, target.device
    generator = torch.Generator().manual_seed(0)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sort_by = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    switches = [kernels.attach(model)] if args.kernels == kernels.SKINNY and device.type == "cpu" else []
    with torch.inference_mode(), kernels.using(switches):
        cache = new_cache(model)
        context = torch.randint(vocab, (1, args.context), generator=generator).to(device)
        model(input_ids=context, cache=cache, use_cache=True, logits_to_keep=1)
        for width in (int(w) for w in args.widths.split(",")):
            def verify(width: int = width) -> None:
                fed = torch.randint(vocab, (1, width), generator=generator).to(device)
                model(input_ids=fed, cache=cache, use_cache=True, logits_to_keep=width)
                crop_to(cache, args.context)

            def verify_transposed_head(width: int = width) -> None:
                fed = torch.randint(vocab, (1, width), generator=generator).to(device)
                hidden = model.get_decoder()(input_ids=fed, cache=cache, use_cache=True).last_hidden_state[0]
                model.get_output_embeddings().weight @ hidden.T  # the logits, transposed
                crop_to(cache, args.context)

            print(f"\none verify pass over {width} token(s) at a {args.context}-token context: "
                  f"{_median_ms(verify, args.repeats, device):.1f} ms; with the LM head as W @ hᵀ: "
                  f"{_median_ms(verify_transposed_head, args.repeats, device):.1f} ms (medians of {args.repeats})")
            with profile(activities=activities) as prof:
                for _ in range(args.repeats):
                    verify()
            print(prof.key_averages().table(sort_by=sort_by, row_limit=8))
        head = model.get_output_embeddings().weight  # (V, H)
        print(f"LM head {tuple(head.shape)}, milliseconds by rows: linear(x, W) | W @ xᵀ")
        for rows in (1, 2, 3, 4, 5, 9):
            x = torch.randn(rows, head.shape[1], generator=generator, dtype=head.dtype).to(device)
            linear = _median_ms(lambda x=x: torch.nn.functional.linear(x, head), args.repeats, device)
            transposed = _median_ms(lambda x=x: head @ x.T, args.repeats, device)
            print(f"  {rows} row(s): {linear:6.1f} | {transposed:6.1f}")


if __name__ == "__main__":
    main()
