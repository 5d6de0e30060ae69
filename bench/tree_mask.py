"""What a tree's mask costs: one verify pass over a tree of N nodes against a chain pass of the same width (N + 1
rows), on the same cache, the two interleaved; medians over repeats and their ratio.

`python -m bench.tree_mask [--context 200] [--repeats 30] [--kernels skinny]`
"""

from __future__ import annotations

import statistics

import torch
import typer

from runner.engine import kernels, models
from runner.engine.decode import Clock, Target
from runner.engine.trees import keep
from runner.prompts import load_prompts

WIDTHS = (4, 8, 15, 32, 63)  # nodes; each pass feeds the root and them


def binary_tree(nodes: int) -> tuple[int, ...]:
    """Parents of a tree where node j hangs under node (j - 2) // 2: two children each, as deep as it fills."""
    return tuple((j - 2) // 2 if j >= 2 else -1 for j in range(nodes))


def main(context: int = 200, repeats: int = 30, kernels_name: str = typer.Option(kernels.SKINNY, "--kernels")) -> None:
    target = models.load(models.DEFAULT_MODEL)
    suite = [t for p in load_prompts() for t in models.encode_chat(target, p.text)]
    ids = torch.tensor((suite * (1 + (context + 64) // len(suite)))[: context + 64])
    switches = [kernels.attach(target.model)] if kernels_name == kernels.SKINNY else []
    clock = Clock(target.device)
    print(f"{'nodes':>5} {'chain ms':>9} {'tree ms':>8} {'tree / chain':>12}")
    with torch.inference_mode(), kernels.using(switches):
        model = Target(target)
        model.prefill(ids[:context])
        for nodes in WIDTHS:
            fed = ids[context : context + nodes + 1]
            times: dict[str, list[float]] = {"chain": [], "tree": []}
            for repeat in range(repeats + 1):  # the first repeat warms both shapes up and is not kept
                for shape in ("chain", "tree") if repeat % 2 else ("tree", "chain"):
                    start = clock()
                    model.verify(fed, (), binary_tree(nodes) if shape == "tree" else None)
                    if repeat:
                        times[shape].append((clock() - start) * 1000)
                    keep(model.cache, context, [])  # back to the context alone
            chain, tree = (statistics.median(times[s]) for s in ("chain", "tree"))
            print(f"{nodes:>5} {chain:>9.2f} {tree:>8.2f} {tree / chain:>12.3f}")


if __name__ == "__main__":
    typer.run(main)
