"""The compact Llama forward against transformers' own: the same logits, hidden states and cache on a tiny random
Llama for every kind of call the engine makes, transformers' forward for every call it does not serve, the same
greedy text on the real SmolLM2, and a cached kernel choice that loses to stock falling back to stock."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM
from transformers.cache_utils import DynamicLayer

from runner.engine.drafters.model import layer_skip
from runner.engine.drafters.spec import PLAIN
from runner.engine.pair import Pair
from runner.engine.round import lossless, trees
from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.draft import new_cache
from runner.engine.weights import compact_llama, kernels
from runner.engine.weights.models import encode_chat
from runner.prompts import load_prompts
from tests.conftest import tiny_llama

GREEDY = Decoding("greedy", 0.0, 1.0)
TOLERANCE = 1e-5  # float32 sums of 64-128 terms in another order


class Switch:
    def __init__(self) -> None:
        self.on = False


@pytest.fixture(params=["native", "python"])
def pair(request):
    """A tiny Llama (the stock forward) and a structurally equal copy with the compact forward switched on, its steps
    between products native (where native.cpp builds) or in Python (`Steps`, a machine without a compiler)."""
    stock, compact = tiny_llama(100, seed=11, layers=3), tiny_llama(100, seed=11, layers=3)
    switch = Switch()
    installed = compact_llama.install(compact, lambda: switch.on)
    assert installed is not None
    if request.param == "python":
        installed.steps = compact_llama.Steps
    elif installed.steps is compact_llama.Steps:
        pytest.skip("the native code does not build here")
    switch.on = True
    return stock, compact


def _both(pair, prefix: list[int], **call):
    """The same call on each model after the same prefix in a fresh cache: (stock's output, cache), (compact's)."""
    results = []
    for model in pair:
        cache = new_cache(model)
        with torch.inference_mode():
            if prefix:
                model(input_ids=torch.tensor([prefix]), cache=cache, use_cache=True, logits_to_keep=1)
            out = model(cache=cache, use_cache=True, output_hidden_states=True, **call)
        results.append((out, cache))
    return results


def _assert_close(stock, compact) -> None:
    (a, cache_a), (b, cache_b) = stock, compact
    assert a.logits.shape == b.logits.shape
    torch.testing.assert_close(b.logits, a.logits, atol=TOLERANCE, rtol=0)
    assert len(a.hidden_states) == len(b.hidden_states)  # the embeddings, each layer's output, the normed last one
    for x, y in zip(a.hidden_states, b.hidden_states, strict=True):
        torch.testing.assert_close(y, x, atol=TOLERANCE, rtol=0)
    assert cache_a.get_seq_length() == cache_b.get_seq_length()
    for x, y in zip(cache_a.layers, cache_b.layers, strict=True):
        torch.testing.assert_close(y.keys, x.keys, atol=TOLERANCE, rtol=0)
        torch.testing.assert_close(y.values, x.values, atol=TOLERANCE, rtol=0)


PREFIX = [5, 17, 42, 8, 99, 3, 61]


@pytest.mark.parametrize("prefix, fed, keep", [([], PREFIX, 1), ([], PREFIX, 7), (PREFIX, [12], 1),
                                               (PREFIX, [12, 7, 30], 3)])
def test_prefill_one_token_and_chain_passes_match_transformers(pair, prefix, fed, keep):
    _assert_close(*_both(pair, prefix, input_ids=torch.tensor([fed]), logits_to_keep=keep))


def test_a_tree_pass_under_its_mask_and_positions_matches_transformers(pair):
    parents = (-1, 0, 0, 1, 2)
    mask = trees.attention_mask(parents, len(PREFIX), torch.float32, torch.device("cpu"))
    positions = trees.position_ids(parents, len(PREFIX), torch.device("cpu"))
    _assert_close(*_both(pair, PREFIX, input_ids=torch.tensor([[12, 7, 30, 4, 9, 2]]), attention_mask=mask,
                         position_ids=positions, logits_to_keep=6))


def test_a_batch_pass_with_padding_holes_matches_transformers(pair):
    """Two sequences in one cache, the second left-padded (its first two columns hidden), each at its positions."""
    past, fed = len(PREFIX), 3
    sees = torch.ones(2, fed, past + fed, dtype=torch.bool)
    sees[:, :, past:] = torch.ones(fed, fed, dtype=torch.bool).tril()
    sees[1, :, :2] = False
    mask = torch.full(sees.shape, torch.finfo(torch.float32).min).masked_fill(sees, 0.0)[:, None]
    positions = torch.tensor([[past, past + 1, past + 2], [past - 2, past - 1, past]])
    results = []
    for model in pair:
        cache = new_cache(model)
        with torch.inference_mode():
            model(input_ids=torch.tensor([PREFIX, PREFIX[::-1]]), cache=cache, use_cache=True, logits_to_keep=1)
            results.append((model(input_ids=torch.tensor([[1, 2, 3], [4, 5, 6]]), attention_mask=mask,
                                  position_ids=positions, cache=cache, use_cache=True, logits_to_keep=fed,
                                  output_hidden_states=True), cache))
    _assert_close(*results)


def _spy(monkeypatch) -> list[int]:
    served, forward = [], compact_llama.Compact.forward

    def spy(self, **kwargs):
        served.append(kwargs["input_ids"].shape[1])
        return forward(self, **kwargs)

    monkeypatch.setattr(compact_llama.Compact, "forward", spy)
    return served


def test_appending_keeps_exactly_what_transformers_update_keeps():
    """A layer fed by `append` holds the same keys and values as one fed by `update`, through the steps decoding
    takes: a prefill, passes that fit the room (written in place), a crop (a rejected draft) and the pass over it,
    a gather (the tensors replaced: moved once), a batch of two, and growth past the room."""
    generator = torch.Generator().manual_seed(3)

    def rows(n: int, batch: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(batch, 2, n, 4, generator=generator), torch.randn(batch, 2, n, 4, generator=generator)

    theirs, ours = DynamicLayer(), DynamicLayer()

    def both(step) -> None:
        step(theirs)
        step(ours)
        assert torch.equal(ours.keys, theirs.keys) and torch.equal(ours.values, theirs.values)

    def fed(n: int, batch: int = 1):
        new = rows(n, batch)
        return lambda layer: (compact_llama.append(layer, *new) if layer is ours else layer.update(*new))

    both(fed(5))
    storage = ours.keys.data_ptr()
    both(fed(1))
    both(fed(3))
    assert ours.keys.data_ptr() == storage  # in place: no copy of the 6 positions before
    both(lambda layer: layer.crop(-2))
    both(fed(2))
    assert ours.keys.data_ptr() == storage and ours.keys.shape[2] == 9
    index = torch.tensor([0, 1, 2, 3, 4, 6, 8])
    both(lambda layer: setattr(layer, "keys", layer.keys.index_select(2, index)))
    both(lambda layer: setattr(layer, "values", layer.values.index_select(2, index)))
    both(fed(1))
    assert ours.keys.data_ptr() != storage  # the gathered tensors moved into storage of their own
    both(lambda layer: (setattr(layer, "keys", layer.keys.repeat(2, 1, 1, 1)),
                        setattr(layer, "values", layer.values.repeat(2, 1, 1, 1))))
    both(fed(2, batch=2))
    for _ in range(3):  # past ROOM positions: the storage grows, the contents stay
        both(fed(compact_llama.ROOM // 2, batch=2))
    assert ours.keys.shape[2] == 10 + 3 * (compact_llama.ROOM // 2)


def test_calls_it_does_not_serve_run_transformers_forward(pair, monkeypatch):
    _, model = pair
    served = _spy(monkeypatch)
    ids = torch.tensor([PREFIX])
    with torch.inference_mode():
        model(input_ids=ids, cache=new_cache(model), use_cache=True)
        assert served == [7]
        model(input_ids=ids)  # no cache
        model(input_ids=ids, attention_mask=torch.ones_like(ids), cache=new_cache(model), use_cache=True)  # 2D mask
        model(inputs_embeds=model.get_input_embeddings()(ids), cache=new_cache(model), use_cache=True)
        model(ids)  # positional
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, do_sample=False)
    assert served == [7]


def test_switched_off_it_is_transformers_forward(monkeypatch):
    model, switch = tiny_llama(100, seed=12, layers=1), Switch()
    compact_llama.install(model, lambda: switch.on)
    served = _spy(monkeypatch)
    with torch.inference_mode():
        model(input_ids=torch.tensor([PREFIX]), cache=new_cache(model), use_cache=True)
    assert served == []


def test_only_llama_style_models_are_installed():
    mistral = MistralForCausalLM(MistralConfig(vocab_size=50, hidden_size=32, intermediate_size=64,
                                               num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    assert compact_llama.install(mistral, lambda: True) is None
    gelu = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, hidden_act="gelu"))
    assert "activation gelu" in compact_llama.refusal(gelu)
    assert compact_llama.install(gelu, lambda: True) is None


def test_fusing_adds_no_memory_and_keeps_every_weight():
    model = tiny_llama(100, seed=13, layers=2)
    before = {name: p.clone() for name, p in model.named_parameters()}
    compact = compact_llama.install(model, lambda: True)
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), name
    attn, mlp = model.model.layers[1].self_attn, model.model.layers[1].mlp
    qkv, gate_up = compact.fused[1].qkv.weight, compact.fused[1].gate_up.weight
    assert attn.q_proj.weight.data_ptr() == qkv.data_ptr()
    assert attn.v_proj.weight.data_ptr() == qkv[64 + 32 :].data_ptr()
    assert mlp.up_proj.weight.data_ptr() == gate_up[128:].data_ptr()


def test_a_layer_skip_copy_of_an_installed_model_runs_its_own_depth():
    """A shallow copy must not inherit the target's compact forward (full depth); installed, it runs its own."""
    target, switch = tiny_llama(100, seed=14, layers=3), Switch()
    compact_llama.install(target, lambda: switch.on)
    draft = layer_skip(target, 1)
    ids = torch.tensor([PREFIX])
    with torch.inference_mode():
        stock = draft(input_ids=ids, cache=new_cache(draft), use_cache=True).logits
        switch.on = True
        copied = draft(input_ids=ids, cache=new_cache(draft), use_cache=True).logits
        compact_llama.install(draft, lambda: switch.on)
        own = draft(input_ids=ids, cache=new_cache(draft), use_cache=True).logits
    assert torch.equal(copied, stock)
    torch.testing.assert_close(own, stock, atol=TOLERANCE, rtol=0)


def test_greedy_text_equals_transformers_generate_on_smollm2(smollm2):
    """Our plain decoding with the compact forward and the skinny kernels on, against transformers' `generate`
    (stock), on several prompts: equal, or the first difference a numeric tie."""
    pair = Pair(smollm2, [], kernels.SKINNY)
    assert kernels.attach(smollm2.model).compact is not None
    for prompt in load_prompts()[:4]:
        ids = encode_chat(smollm2, prompt.text)
        ours = pair.run(PLAIN, ids, None, GREEDY, 24, seed=0).output_tokens
        with torch.inference_mode():
            out = smollm2.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                         do_sample=False, max_new_tokens=24)
        theirs = tuple(out[0, len(ids):].tolist())
        divergence = lossless.classify(smollm2, tuple(ids), theirs, ours)
        assert divergence is None or divergence.kind == "tie", (prompt.id, divergence)


def _slow(x, w, b):
    time.sleep(0.002)
    return F.linear(x, w, b)


def test_a_cached_choice_that_loses_to_stock_here_falls_back_to_stock(monkeypatch):
    monkeypatch.setitem(kernels.CANDIDATES, "slow", _slow)
    linear = torch.nn.Linear(64, 32)
    slow = [r for r in kernels.SLOTS if kernels.rung(r) in (5, kernels.WIDE_ROWS)]  # rows 5 and every wider pass
    cached = {(32, 64): tuple("slow" if r in slow else "transposed" if r == 1 else kernels.STOCK
                              for r in kernels.SLOTS)}
    checked = kernels.confirmed(cached, [linear])
    assert checked[(32, 64)][4] == kernels.STOCK and set(checked[(32, 64)][1:]) == {kernels.STOCK}
    assert checked[(32, 64)][0] in ("transposed", kernels.STOCK)  # kept unless it lost here
