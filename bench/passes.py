"""Single target passes, timed: the verify curve (one pass over k+1 tokens, k = 0..8) on each kernel path and
thread count, and the roofline's two sides (the weight bytes a one-token pass reads, and the memory bandwidth
a STREAM-style copy reaches on the same machine in the same run)."""

from __future__ import annotations

import torch

from runner.engine import kernels, models
from runner.engine.decode import Clock
from runner.engine.drafters import crop_to, new_cache
from runner.prompts import load_prompts

VERIFY_KS = range(9)  # the verify curve: one target pass over k+1 tokens, k = 0..8
COPY_BYTES = 512 * 2**20  # the copied tensor: many times any CPU's last-level cache

Curves = dict[tuple[str, int], dict[int, list[float]]]  # (kernels, threads) -> k -> milliseconds per repeat


def verify_curve(target: models.Loaded, context: int, repeats: int,
                 switches: list[kernels.Kernels]) -> dict[int, list[float]]:
    """Milliseconds of ONE target pass over k+1 tokens after `context` cached tokens, per repeat, for each k."""
    suite = [t for p in load_prompts() for t in models.encode_chat(target, p.text)]
    ids = torch.tensor((suite * (1 + (context + len(VERIFY_KS)) // len(suite)))[: context + len(VERIFY_KS)],
                       device=target.device)
    clock, cache = Clock(target.device), new_cache(target.model)
    times: dict[int, list[float]] = {k: [] for k in VERIFY_KS}
    with torch.inference_mode(), kernels.using(switches):
        target.model(input_ids=ids[None, :context], cache=cache, use_cache=True, logits_to_keep=1)
        for repeat in range(repeats + 1):  # the first round warms every shape up and is not kept
            for k in VERIFY_KS if repeat % 2 else reversed(VERIFY_KS):
                start = clock()
                target.model(input_ids=ids[None, context: context + k + 1], cache=cache, use_cache=True,
                             logits_to_keep=k + 1)
                if repeat:
                    times[k].append((clock() - start) * 1000)
                crop_to(cache, context)
    return times


def verify_curves(target: models.Loaded, context: int, repeats: int, thread_counts: list[int]) -> Curves:
    """The verify curve on stock F.linear and on the skinny kernels, at each thread count (CPU); stock alone on a
    GPU, where the kernels never apply."""
    if target.device.type != "cpu":
        return {(kernels.STOCK, torch.get_num_threads()): verify_curve(target, context, repeats, [])}
    paths = {kernels.STOCK: [], kernels.SKINNY: [kernels.attach(target.model)]}
    before, curves = torch.get_num_threads(), {}
    try:
        for threads in thread_counts:
            torch.set_num_threads(threads)
            for name, switches in paths.items():
                curves[(name, threads)] = verify_curve(target, context, repeats, switches)
    finally:
        torch.set_num_threads(before)
    return curves


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the parameters a one-token pass reads in full: all of them, each tied tensor once, except an
    input embedding table of its own (a pass reads one row of it)."""
    embedding, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    unique = {p.data_ptr(): p for p in model.parameters()}
    if embedding.data_ptr() != head.data_ptr():
        unique.pop(embedding.data_ptr())
    return sum(p.numel() * p.element_size() for p in unique.values())


def copy_bandwidth(device: torch.device, repeats: int) -> list[float]:
    """GB/s of a STREAM-style copy of COPY_BYTES, per repeat: bytes read + bytes written over the time."""
    source = torch.ones(COPY_BYTES // 4, device=device)
    target = torch.empty_like(source)
    clock = Clock(device)
    target.copy_(source)  # first touch: page faults are not bandwidth
    rates = []
    for _ in range(repeats):
        start = clock()
        target.copy_(source)
        rates.append(2 * COPY_BYTES / (clock() - start) / 1e9)
    return rates
