"""Batched throughput: B prompts decoded together, ours (plain and speculative, runner/engine/round/batch.py) against
transformers' own batched greedy `generate` (left-padded, with an attention mask) on the same prompts.

Tokens/s counts every sequence's new tokens up to and including its first end-of-sequence token (transformers pads a
finished row after it) over the batch's wall time. The prompts are taken B at a time in the bench's order; each
batch's engines alternate which goes first. Every output is checked against ours decoded alone.
"""

from __future__ import annotations

import torch

from bench.rows import Row
from bench.side_by_side import GREEDY, Cell, Engines
from runner.cells import Cell as SweepCell
from runner.engine.drafters.spec import PLAIN, DraftSpec
from runner.engine.round.clock import Clock
from runner.prompts import Prompt

BATCH_METRIC = "batch_tokens_per_s"


def _cut(tokens: list[int], eos: frozenset[int]) -> tuple[int, ...]:
    end = next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))
    return tuple(tokens[:end])


def theirs(engines: Engines, prompts: list[list[int]], n: int) -> list[tuple[int, ...]]:
    """transformers' greedy generate over the batch, left-padded as its docs ask for decoder-only models."""
    target = engines.target
    pad = target.tokenizer.pad_token_id
    pad = pad if pad is not None else next(iter(target.eos_ids))
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=target.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=target.device)
    out = target.model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n, pad_token_id=pad)
    return [_cut(row[width:].tolist(), target.eos_ids) for row in out]


def batch_rows(engines: Engines, cells: list[Cell], prompts: list[list[int]], reference: list[tuple[int, ...]],
               size: int, repeats: int, n: int) -> list[Row]:
    """Per cell (plain, then each chain draft at its k): ours at batch `size` over transformers' plain batched
    generate, tokens/s per repeat; mismatches against `reference` (ours alone, plain greedy, per prompt)."""
    clock = Clock(engines.target.device)
    batches = [prompts[i : i + size] for i in range(0, len(prompts) - size + 1, size)]
    refs = [reference[i : i + size] for i in range(0, len(prompts) - size + 1, size)]
    ours: dict[Cell, list[float]] = {cell: [] for cell in cells}
    mismatches = dict.fromkeys(cells, 0)
    plain: list[float] = []
    for repeat in range(repeats):
        tokens = dict.fromkeys([*cells, None], 0)
        seconds = dict.fromkeys([*cells, None], 0.0)
        for b, (batch, ref) in enumerate(zip(batches, refs, strict=True)):
            order = [None, *cells] if (repeat + b) % 2 else [*cells, None]
            for cell in order:
                start = clock()
                if cell is None:
                    outputs = theirs(engines, batch, n)
                else:
                    draft = PLAIN if cell.k is None else cell.draft
                    outputs = [g.output_tokens for g in engines.ours(n).run_batch(_members(draft, cell, batch), batch)]
                    mismatches[cell] += sum(o != r for o, r in zip(outputs, ref, strict=True)) * (repeat == 0)
                seconds[cell] += clock() - start
                tokens[cell] += sum(len(o) for o in outputs)
        plain.append(tokens[None] / seconds[None])
        for cell in cells:
            ours[cell].append(tokens[cell] / seconds[cell])
    return [Row(BATCH_METRIC, cell.draft.text, cell.k, f"batch={size}", ours[cell], plain, mismatches[cell])
            for cell in cells]


def _members(draft: DraftSpec, cell: Cell, batch: list[list[int]]) -> list[SweepCell]:
    """The engine's cells of one batch: the bench hands their ids itself, so each prompt only names its slot."""
    slots = tuple(Prompt(f"batch-{slot}", "bench", "") for slot in range(len(batch)))
    return [SweepCell(prompt, GREEDY, draft, cell.k, cell.policy, slots, slot) for slot, prompt in enumerate(slots)]
