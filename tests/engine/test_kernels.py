"""The skinny CPU kernels: every candidate agrees with F.linear, the choice follows the timings and never
loses to stock, the switch is per model and recorded per run, and greedy decoding stays lossless."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from runner.engine.drafters.registry import parse_draft
from runner.engine.pair import Pair
from runner.engine.round import trees
from runner.engine.round.draft import crop_to
from runner.engine.weights import attention, kernels
from runner.engine.weights.kernels import parse_kernels
from tests.helpers.tiny import tiny_llama

UNIT = torch.finfo(torch.float32).eps / 2


def summation_bound(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """How far two fp32 sums of the same K products may differ, whatever their order: 2·K·u·Σ|x_i·w_i| (+ |b|)."""
    return 2 * w.shape[1] * UNIT * (x.abs() @ w.abs().T + (0 if b is None else b.abs()))


@pytest.mark.parametrize("shape", [(96, 64), (64, 160), (300, 64)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_every_candidate_agrees_with_stock_within_the_summation_bound(shape, with_bias):
    generator = torch.Generator().manual_seed(0)
    w = torch.randn(shape, generator=generator)
    b = torch.randn(shape[0], generator=generator) if with_bias else None
    for rows in (*range(1, kernels.MAX_ROWS + 1), kernels.WIDE_ROWS, 200):
        x = torch.randn(rows, shape[1], generator=generator)
        stock = F.linear(x, w, b)
        assert kernels.candidates(rows)[0] == kernels.STOCK and len(kernels.candidates(rows)) >= 2
        for name in kernels.candidates(rows):
            out = kernels.CANDIDATES[name](x, w, b)
            assert out.shape == stock.shape and out.is_contiguous(), name
            assert ((out - stock).abs() <= summation_bound(x, w, b)).all(), (name, rows)


@pytest.mark.parametrize("columns", [1, kernels.FEW_COLUMNS, kernels.FEW_COLUMNS + 1])
def test_product_columns_become_exactly_the_transposed_rows(columns):
    product = torch.randn(300, 2 * columns)[:, ::2]  # strided, as the first column of a two-column product is
    rows = kernels._as_rows(product)
    assert rows.is_contiguous() and torch.equal(rows, product.T)


def test_choose_takes_the_fastest_only_when_it_beats_stock_by_the_margin():
    assert kernels.MARGIN == 0.05
    assert kernels.choose({"stock": 10.0, "transposed": 4.0, "packed": 5.0}) == "transposed"
    assert kernels.choose({"stock": 10.0, "transposed": 9.6}) == "stock"  # 4% faster: within the noise
    assert kernels.choose({"stock": 10.0, "transposed": 9.4}) == "transposed"  # 6% faster
    assert kernels.choose({"stock": 3.0, "transposed": 4.0, "two_columns": 3.5}) == "stock"
    assert kernels.choose({"stock": 3.0, "transposed": 3.0}) == "stock"


def test_the_table_is_the_median_choice_per_shape_and_rung_and_each_rung_serves_the_rows_below_it():
    assert kernels.RUNGS[0] == 1 and kernels.RUNGS[-2:] == (kernels.MAX_ROWS, kernels.WIDE_ROWS) == (64, 128)
    assert [kernels.rung(r) for r in (1, 5, 7, 8, 9, 13, 17, 33, 49, 64, 65, 128, 500)] == [
        1, 5, 8, 8, 12, 16, 24, 48, 64, 64, 128, 128, 128]
    # a slot per row count up to MAX_ROWS, then one for every wider pass (a prompt's)
    assert [kernels.slot(r) for r in (1, 64, 65, 128, 500)] == [0, 63, 64, 64, 64]
    # One slow outlier must not decide: [1, 9, 1] against [2, 2, 2], sweep by sweep 0.5, 4.5, 0.5.
    timings = {(8, 4): {r: {"stock": [2.0, 2.0, 2.0], "transposed": [1.0, 9.0, 1.0] if r <= 3 else [2.5] * 3}
                        for r in kernels.RUNGS},
               (4, 8): {r: {"stock": [1.0], "transposed": [2.0], **({"two_columns": [0.5]} if r == 1 else {})}
                        for r in kernels.RUNGS},
               # packed wins only at the rungs 24, 64 and 128: rows 17-24, 49-64 and every wider pass take it
               (6, 6): {r: {"stock": [1.0], "packed": [0.5 if r in (24, 64, 128) else 1.5]} for r in kernels.RUNGS}}
    table = kernels.table_from(timings)
    assert table[(8, 4)] == ("transposed",) * 3 + ("stock",) * (kernels.MAX_ROWS - 2)
    assert table[(4, 8)] == ("two_columns",) + ("stock",) * kernels.MAX_ROWS
    assert table[(6, 6)] == ("stock",) * 16 + ("packed",) * 8 + ("stock",) * 24 + ("packed",) * 17
    # Never slower than stock: every row's choice took, in the median sweep at its rung, at most stock's time.
    for shape, choices in table.items():
        for r, name in zip(kernels.SLOTS, choices, strict=True):
            assert kernels.relative(timings[shape][kernels.rung(r)])[name] <= 1.0


def test_each_sweep_sets_a_candidate_against_stock_in_the_same_sweep():
    # A load arrives in the second sweep and stays: by plain medians stock (1.0) beats the candidate (2.7), but in
    # every sweep where both ran under the same load the candidate took 0.9 of stock's time.
    times = {"stock": [1.0, 1.0, 3.0], "packed": [0.9, 2.7, 2.7]}
    assert kernels.relative(times) == {"stock": 1.0, "packed": pytest.approx(0.9)}
    timings = {(6, 6): {r: times for r in kernels.RUNGS}}
    assert kernels.table_from(timings)[(6, 6)] == ("packed",) * (kernels.MAX_ROWS + 1)


@pytest.mark.parametrize("kind", kernels.COPIED)
def test_a_weight_is_copied_once_per_kind_and_its_copy_goes_with_it(kind):
    if kind not in kernels.CANDIDATES:
        pytest.skip(f"{kind} is not available on this machine")
    w = torch.randn(32, 16)
    x = torch.randn(2, 16)
    kernels.CANDIDATES[kind](x, w, None)
    copy = kernels._COPIES[(kind, id(w))][1]
    assert ((kernels.CANDIDATES[kind](x, w, None) - F.linear(x, w)).abs() <= summation_bound(x, w, None)).all()
    assert kernels._COPIES[(kind, id(w))][1] is copy  # made once
    kernels.drop_copy(kind, w)
    assert (kind, id(w)) not in kernels._COPIES
    kernels.CANDIDATES[kind](x, w, None)
    assert kernels._COPIES[(kind, id(w))][1] is not copy  # copied again on demand
    key = (kind, id(w))
    del w
    assert key not in kernels._COPIES  # freed with its weight


def test_a_candidate_the_library_refuses_is_left_out_and_stock_is_chosen(monkeypatch):
    """oneDNN has no float16 inner product on most CPUs: a candidate that raises is dropped for that shape."""
    def refuses(x, w, b):
        if w.shape[0] == 8:
            raise RuntimeError("could not create a primitive descriptor")
        return kernels._transposed(x, w, b)

    monkeypatch.setattr(kernels, "CANDIDATES", {"stock": F.linear, "refuses": refuses})
    timings = kernels.measure([torch.nn.Linear(4, 8), torch.nn.Linear(8, 4)], repeats=1)
    assert all(set(by_name) == {"stock"} for by_name in timings[(8, 4)].values())
    assert all(set(by_name) == {"stock", "refuses"} for by_name in timings[(4, 8)].values())
    assert kernels.table_from(timings)[(8, 4)] == ("stock",) * (kernels.MAX_ROWS + 1)


def forced(switch: kernels.Kernels, name_for_rows) -> None:
    """Set the switch's table at this thread count to `name_for_rows(rows)` for every shape, unmeasured."""
    shapes = {tuple(m.weight.shape) for m in switch.linears}
    switch.tables[torch.get_num_threads()] = {
        s: tuple(name_for_rows(r) for r in kernels.SLOTS) for s in shapes}


def test_the_patched_linears_are_stock_outside_use_and_the_table_inside():
    model = tiny_llama(100, seed=3)
    switch = kernels.attach(model)
    assert kernels.attach(model) is switch  # patched once
    # measured: o and down per layer, the head, and the compact forward's fused qkv and gate_up per layer (it
    # replaces q, k, v, gate and up)
    assert len(switch.linears) == 2 * 2 + 1 + 2 * 2
    forced(switch, lambda r: "transposed")
    head = model.lm_head
    generator = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        for rows in (1, 3, kernels.MAX_ROWS, kernels.MAX_ROWS + 1, 300):  # wider than every rung: the last slot's
            x = torch.randn(1, rows, 64, generator=generator)
            assert torch.equal(head(x), F.linear(x, head.weight))
            with kernels.using([switch]):
                expected = kernels.CANDIDATES["transposed"](x[0], head.weight, None)[None]
                assert torch.equal(head(x), expected), rows
            assert switch.active is None


@pytest.mark.parametrize("kind", kernels.COPIED)
def test_a_linear_finds_its_choices_copy_once_and_a_replaced_weights_afresh(kind, monkeypatch):
    if kind not in kernels.CANDIDATES:
        pytest.skip(f"{kind} is not available on this machine")
    model = tiny_llama(100, seed=5)
    switch = kernels.attach(model)
    forced(switch, lambda r: kind)
    head = model.lm_head
    x = torch.randn(1, 5, 64, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode(), kernels.using([switch]):
        before = head(x)
        assert torch.equal(before, kernels.CANDIDATES[kind](x[0], head.weight, None)[None])
        looked_up = []
        monkeypatch.setattr(kernels, "copy_of", lambda *args: looked_up.append(args))
        assert torch.equal(head(x), before) and looked_up == []  # the second call reads the copy it bound
        monkeypatch.undo()
    head.weight = torch.nn.Parameter(torch.randn(100, 64, generator=torch.Generator().manual_seed(3)))
    with torch.inference_mode(), kernels.using([switch]):
        after = head(x)
        assert torch.equal(after, kernels.CANDIDATES[kind](x[0], head.weight, None)[None])
        assert not torch.equal(after, before)


def test_the_table_is_measured_once_then_read_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDASH_CACHE", str(tmp_path))
    switch = kernels.attach(tiny_llama(100, seed=4, layers=1))
    table = switch.table()
    [saved] = (tmp_path / "kernels").glob("*.json")
    data = json.loads(saved.read_text())
    assert data["key"]["threads"] == torch.get_num_threads() and data["key"]["rungs"] == list(kernels.RUNGS)
    assert data["key"]["shapes"] == [[64, 64], [64, 128], [100, 64], [128, 64], [256, 64]]
    assert data["key"]["cpu"]
    assert kernels.table_from(kernels._timings_from_json(data["timings"])) == table
    assert all(len(timings) == kernels.REPEATS for by_rows in data["timings"].values()
               for names in by_rows.values() for timings in names.values())

    def no_measuring(*args):
        raise AssertionError("measured again")

    monkeypatch.setattr(kernels, "measure", no_measuring)
    checked = []  # timings read back that no process confirmed are timed against stock once (`confirmed`)
    monkeypatch.setattr(kernels, "confirmed", lambda read, linears: checked.append(read) or read)
    assert data["table"] == kernels._table_to_json(table)  # measured here: confirmed as it was measured
    assert kernels.attach(tiny_llama(100, seed=5, layers=1)).table() == table  # same shapes: read back
    assert checked == []
    del data["table"]  # timings alone, as another host of the same CPU name would leave them
    saved.write_text(json.dumps(data))
    assert kernels.attach(tiny_llama(100, seed=5, layers=1)).table() == table
    assert checked == [table] and json.loads(saved.read_text())["table"] == kernels._table_to_json(table)
    assert kernels.attach(tiny_llama(100, seed=5, layers=1)).table() == table  # confirmed once, then trusted
    assert checked == [table]


def test_two_measuring_the_same_shapes_at_once_measure_them_once(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDASH_CACHE", str(tmp_path))
    measure, calls = kernels.measure, []

    def slow_measure(linears, repeats=kernels.REPEATS):  # the real measurement, slow enough that both overlap
        calls.append(len(linears))
        time.sleep(0.5)
        return measure(linears, 1)

    monkeypatch.setattr(kernels, "measure", slow_measure)
    switches = [kernels.attach(tiny_llama(100, seed=seed, layers=1)) for seed in (6, 7)]
    tables = []
    callers = [threading.Thread(target=lambda s=s: tables.append(s.table())) for s in switches]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert len(calls) == 1 and len(tables) == 2 and tables[0] == tables[1]


def test_kernels_are_validated_and_cuda_keeps_stock(tiny):
    assert parse_kernels("stock") == "stock" and parse_kernels("skinny") == "skinny"
    with pytest.raises(ValueError, match='unknown kernels "fast"'):
        parse_kernels("fast")
    assert Pair(tiny, [], "stock").switches == [] and Pair(tiny, [], "stock").kernels == "stock"
    pair = Pair(tiny, [parse_draft("layerskip:2")], "skinny")
    assert pair.kernels == "skinny" and pair.switches == [kernels.attach(tiny.model)]  # the draft shares them


def test_a_verify_pass_on_every_candidate_agrees_with_stock_on_the_real_model(smollm2):
    """Each candidate forced on every linear of SmolLM2: a pass over 1..9 and 64 tokens at a 40-token context keeps
    the logits within 1e-3 of stock's (they are ~10 in size) and the same argmax at every position."""
    model, switch = smollm2.model, kernels.attach(smollm2.model)
    ids = torch.tensor(smollm2.tokenizer("The quick brown fox jumps over the lazy dog. " * 12)["input_ids"][:104])
    assert len(ids) == 104
    saved = dict(switch.tables)
    try:
        with torch.inference_mode():
            cache = DynamicCache(config=model.config)
            model(input_ids=ids[None, :40], cache=cache, use_cache=True)
            for width in (*range(1, 10), 64):  # 64: the blocked product's wide path
                def logits(width: int = width) -> torch.Tensor:
                    out = model(input_ids=ids[None, 40:40 + width], cache=cache, use_cache=True,
                                logits_to_keep=width).logits[0]
                    crop_to(cache, 40)
                    return out
                stock = logits()
                for name in kernels.candidates(width):
                    forced(switch, lambda r, name=name: name if name in kernels.candidates(r) else kernels.STOCK)
                    with kernels.using([switch]):
                        ours = logits()
                    assert (ours - stock).abs().max() < 1e-3, (name, width)
                    assert torch.equal(ours.argmax(-1), stock.argmax(-1)), (name, width)
    finally:
        switch.tables = saved


def test_masked_attention_inside_use_reads_grouped_heads_in_place_and_gives_stocks_logits_exactly(smollm2,
                                                                                                   monkeypatch):
    """SmolLM2 (9 query heads over 3 key/value heads), linears forced stock so only attention differs: a chain of
    2, 9 and 64 rows, a tree of 16 under its mask and a left-padded batch of 3 x 5 give stock's logits bit for bit,
    and none of their layers runs transformers' function inside `use()`; a one-token pass still does."""
    model, switch = smollm2.model, kernels.attach(smollm2.model)
    layers = model.config.num_hidden_layers
    stock_calls = []
    monkeypatch.setattr(attention, "sdpa_attention_forward",
                        lambda *a, **kw: stock_calls.append(1) or sdpa_attention_forward(*a, **kw))
    saved = dict(switch.tables)
    forced(switch, lambda r: kernels.STOCK)
    ids = torch.tensor(smollm2.tokenizer("The quick brown fox jumps over the lazy dog. " * 12)["input_ids"][:120])
    context = 40

    def chain(width: int) -> dict:
        return {"input_ids": ids[None, context:context + width]}

    def tree(parents: tuple[int, ...]) -> dict:
        return {"input_ids": ids[None, context:context + len(parents) + 1],
                "attention_mask": trees.attention_mask(parents, context, model.dtype, ids.device),
                "position_ids": trees.position_ids(parents, context, ids.device)}

    def batch(rows: int, width: int) -> dict:  # row r's first r cache columns are padding
        sees = torch.ones(rows, width, context + width, dtype=torch.bool)
        sees[:, :, context:] = torch.ones(width, width, dtype=torch.bool).tril()
        for r in range(rows):
            sees[r, :, :r] = False
        mask = torch.zeros(sees.shape).masked_fill(~sees, torch.finfo(model.dtype).min)[:, None]
        return {"input_ids": torch.stack([ids[context + 7 * r:context + 7 * r + width] for r in range(rows)]),
                "attention_mask": mask}

    passes = {"chain 2": (1, chain(2)), "chain 9": (1, chain(9)), "chain 64": (1, chain(64)),
              "tree 16": (1, tree((-1, -1, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6))), "batch 3x5": (3, batch(3, 5))}
    try:
        with torch.inference_mode():
            for name, (rows, inputs) in passes.items():
                cache = DynamicCache(config=model.config)
                model(input_ids=torch.stack([ids[7 * r:7 * r + context] for r in range(rows)]), cache=cache,
                      use_cache=True)
                stock_calls.clear()
                stock = model(**inputs, cache=cache, use_cache=True).logits
                assert len(stock_calls) == layers, name  # outside use(): transformers' own function
                crop_to(cache, context)
                stock_calls.clear()
                with kernels.using([switch]):
                    # return_dict: a call the compact forward does not serve, so transformers' layers run
                    ours = model(**inputs, cache=cache, use_cache=True, return_dict=True).logits
                    assert stock_calls == [], name
                    crop_to(cache, context)
                    model(input_ids=ids[None, context:context + 1].expand(rows, 1), cache=cache, use_cache=True,
                          return_dict=True)
                    assert len(stock_calls) == layers, name  # one token: transformers folds the heads itself
                assert torch.equal(ours, stock), name
    finally:
        switch.tables = saved
