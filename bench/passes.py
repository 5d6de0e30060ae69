"""Single target passes, timed: the verify curve (one pass over 1-64 rows: a chain, a tree under its mask, a batch
of sequences) on each kernel path and thread count, and the roofline's two sides (the weight bytes a one-token
pass reads, and the memory bandwidth a STREAM-style copy reaches at the same thread count, timed among the
passes)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from runner.engine.round import trees
from runner.engine.round.clock import Clock
from runner.engine.round.draft import crop_to, new_cache
from runner.engine.weights import kernels, models
from runner.prompts import load_prompts

# The verify curve, by the rows of one target pass: a chain (the last committed token and k drafts), a tree (the root
# and a binary tree of rows - 1 nodes, under its mask) and a batch (B sequences, each the last token and 4 drafts).
CHAIN, TREE, BATCH = "chain", "tree", "batch"
WIDTHS = {CHAIN: (1, 2, 3, 5, 9, 16, 32, 64), TREE: (5, 9, 16, 32, 64), BATCH: (10, 20, 40, 60)}
BATCH_ROWS = 5  # tokens per sequence in a batched pass: k = 4
COPY_BYTES = 512 * 2**20  # the copied tensor: many times any CPU's last-level cache

Curve = dict[tuple[str, int], list[float]]  # (shape, rows) -> milliseconds per repeat
Curves = dict[tuple[str, int], Curve]  # (kernels, threads) -> its curve


def binary_tree(nodes: int) -> tuple[int, ...]:
    """Parents of a tree where node j hangs under node (j - 2) // 2: two children each, as deep as it fills."""
    return tuple((j - 2) // 2 if j >= 2 else -1 for j in range(nodes))


def _passes(target: models.Loaded, context: int) -> dict[tuple[str, int], Callable[[], None]]:
    """One pass per shape and width, each after `context` cached tokens and leaving the cache as it found it."""
    model = target.model
    suite = [t for p in load_prompts() for t in models.encode_chat(target, p.text)]
    longest = context + max(WIDTHS[CHAIN])
    ids = torch.tensor((suite * (1 + longest // len(suite)))[:longest], device=target.device)
    widest = max(WIDTHS[BATCH]) // BATCH_ROWS
    rows = torch.stack([ids.roll(-37 * b)[: context + BATCH_ROWS] for b in range(widest)])  # each row its own text
    single = new_cache(model)
    model(input_ids=ids[None, :context], cache=single, use_cache=True, logits_to_keep=1)

    def chain(width: int) -> Callable[[], None]:
        def run() -> None:
            model(input_ids=ids[None, context: context + width], cache=single, use_cache=True, logits_to_keep=width)
            crop_to(single, context)
        return run

    def tree(width: int) -> Callable[[], None]:
        parents = binary_tree(width - 1)

        def run() -> None:  # the mask is made in the pass's time, as a round makes it
            mask = trees.attention_mask(parents, context, model.dtype, ids.device)
            positions = trees.position_ids(parents, context, ids.device)
            model(input_ids=ids[None, context: context + width], attention_mask=mask, position_ids=positions,
                  cache=single, use_cache=True, logits_to_keep=width)
            crop_to(single, context)
        return run

    def batch(width: int) -> Callable[[], None]:
        fed, cache = rows[: width // BATCH_ROWS], new_cache(model)
        model(input_ids=fed[:, :context], cache=cache, use_cache=True, logits_to_keep=1)

        def run() -> None:
            model(input_ids=fed[:, context:], cache=cache, use_cache=True, logits_to_keep=BATCH_ROWS)
            crop_to(cache, context)
        return run

    makers = {CHAIN: chain, TREE: tree, BATCH: batch}
    return {(shape, width): makers[shape](width) for shape, widths in WIDTHS.items() for width in widths}


def verify_curve(target: models.Loaded, context: int, repeats: int,
                 paths: dict[str, list[kernels.Kernels]]) -> tuple[dict[str, Curve], list[float]]:
    """Milliseconds of ONE target pass of each shape and width after `context` cached tokens, per repeat, on each
    kernel path (a name and the switches it turns on), and the GB/s of a copy (`copy_job`: bytes read + written
    over its time), once per repeat. Each pass runs on every path back to back before the next pass, the paths'
    order and the passes' order flipping each repeat: a load that comes or goes slows both sides of a comparison
    alike; the copy runs among the passes, mid-repeat: the memory a shared host serves drifts over minutes, so a
    copy timed before or after the passes is not theirs."""
    clock, copy = Clock(target.device), copy_job(target.device)
    copy_gbs = []
    with torch.inference_mode():
        passes = _passes(target, context)
        times = {name: {key: [] for key in passes} for name in paths}
        middle = len(passes) // 2
        for repeat in range(repeats + 1):  # the first round warms every shape up and is not kept
            order = list(paths) if repeat % 2 else list(reversed(paths))
            for index, key in enumerate(passes if repeat % 2 else reversed(passes)):
                if index == middle:
                    start = clock()
                    copy()
                    if repeat:
                        copy_gbs.append(2 * COPY_BYTES / (clock() - start) / 1e9)
                for name in order:
                    with kernels.using(paths[name]):
                        start = clock()
                        passes[key]()
                        elapsed = clock() - start
                    if repeat:
                        times[name][key].append(elapsed * 1000)
    return times, copy_gbs


def verify_curves(target: models.Loaded, context: int, repeats: int,
                  thread_counts: list[int]) -> tuple[Curves, dict[int, list[float]]]:
    """The verify curve on stock (F.linear, transformers' attention) and on the skinny kernels, interleaved, at each
    thread count (CPU); stock alone on a GPU, where the kernels never apply. With them, the copy's GB/s at each
    thread count, timed among the passes (`verify_curve`)."""
    if target.device.type != "cpu":
        curve, copy_gbs = verify_curve(target, context, repeats, {kernels.STOCK: []})
        return {(kernels.STOCK, torch.get_num_threads()): curve[kernels.STOCK]}, {torch.get_num_threads(): copy_gbs}
    paths = {kernels.STOCK: [], kernels.SKINNY: [kernels.attach(target.model)]}
    curves, copies = {}, {}
    for threads in at_each(thread_counts):
        by_path, copies[threads] = verify_curve(target, context, repeats, paths)
        curves |= {(name, threads): curve for name, curve in by_path.items()}
    return curves, copies


def at_each(thread_counts: list[int]) -> Iterator[int]:
    """Each thread count in turn, set as torch's for the body of the loop; the count before is set back after."""
    before = torch.get_num_threads()
    try:
        for threads in thread_counts:
            torch.set_num_threads(threads)
            yield threads
    finally:
        torch.set_num_threads(before)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the parameters a one-token pass reads in full: all of them, each tied tensor once, except an
    input embedding table of its own (a pass reads one row of it)."""
    embedding, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    unique = {p.data_ptr(): p for p in model.parameters()}
    if embedding.data_ptr() != head.data_ptr():
        unique.pop(embedding.data_ptr())
    return sum(p.numel() * p.element_size() for p in unique.values())


def copy_job(device: torch.device) -> Callable[[], torch.Tensor]:
    """One STREAM-style copy of COPY_BYTES per call, its pages touched once already (page faults are not
    bandwidth); COPY_BYTES read and written per call."""
    source = torch.ones(COPY_BYTES // 4, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    return lambda: target.copy_(source)
