"""The engine's own C++ product: the blocked layout element by element, each output the exact fused
multiply-add chain it is meant to be, any row count, feature count and bias, the huge-page slabs, clear refusals."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from torch.utils import cpp_extension

from runner.engine.weights import kernels, native
from runner.engine.weights.compact_llama import Steps

pytestmark = pytest.mark.skipif(native.supported() is not None, reason=f"{native.supported()}")


def fma_chain(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """What the kernel computes, by an independent path: per output, starting from the bias (or 0), one float32 fused
    multiply-add per input feature in order. The product of two float32 values is exact in float64, so float64's sum
    rounded to float32 is the fused multiply-add's single rounding (a double rounding differs only at a tie of
    float32's last bit, which the random values here do not meet)."""
    rows, features = x.shape[0], w.shape[0]
    acc = (torch.zeros(rows, features) if b is None else b.expand(rows, features).clone()).double()
    for c in range(w.shape[1]):
        acc = (acc + x[:, c : c + 1].double() * w[:, c].double()).float().double()
    return acc.float()


def test_the_blocked_layout_holds_eight_features_side_by_side_per_input_feature_and_pads_with_zeros():
    w = torch.arange(13 * 5, dtype=torch.float32).view(13, 5)  # 13 features: two blocks, the second of five
    blocks = native.blocked(w)
    assert blocks.shape == (2, 5, 8) and blocks.is_contiguous()
    for b in range(2):
        for c in range(5):
            for j in range(8):
                expected = w[8 * b + j, c] if 8 * b + j < 13 else 0.0
                assert blocks[b, c, j] == expected, (b, c, j)


# Up to 8 rows, blocks are swept in groups of 4 or 6, from 3 rows on (AVX2) in parts of up to 3 rows over spans of
# 32 inputs (k = 7, 20 and 33 end in a span cut short, 64 in a whole one); past 8, in groups of 2 for 6 rows at a
# time. 96 features are 12 blocks, whole groups of 4 and 6 and in the wide groups; 187 are 23 full blocks and a partial
# one, so a group of 6 is cut short and ends in the partial block; 8 features are one block, a group cut short at
# once.
@pytest.mark.parametrize("features,k", [(16, 64), (13, 7), (300, 64), (8, 1), (96, 20), (187, 33)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_each_output_is_exactly_the_fused_multiply_add_chain(features, k, with_bias):
    generator = torch.Generator().manual_seed(features * k)
    w = torch.randn(features, k, generator=generator)
    b = torch.randn(features, generator=generator) if with_bias else None
    blocks = native.blocked(w)
    # one sweep up to 8 rows; past them 6 rows at a time and the rest; past 768, a second panel of rows
    for rows in (*range(1, 10), 13, 17, 64, 800):
        x = torch.randn(rows, k, generator=generator)
        out = native.product(x, blocks, b, features)
        assert out.shape == (rows, features) and out.is_contiguous()
        assert torch.equal(out, fma_chain(x, w, b)), (rows, features, k)


class SlowSlab:
    """A slab whose cutting sleeps: a thread holds the offset it read while the others run."""

    def __init__(self, floats: int) -> None:
        self.tensor = torch.empty(floats)

    def numel(self) -> int:
        return self.tensor.numel()

    def __getitem__(self, cut: slice) -> torch.Tensor:
        time.sleep(0.002)
        return self.tensor[cut]


def test_cuts_taken_by_threads_at_once_never_overlap(monkeypatch):
    monkeypatch.setattr(native, "_slab", SlowSlab(1 << 20))
    monkeypatch.setattr(native, "_slab_used", 0)
    cuts: list[torch.Tensor] = []

    def take() -> None:
        cuts.extend(native.huge_empty(1000) for _ in range(10))

    workers = [threading.Thread(target=take) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    spans = sorted((c.data_ptr(), c.data_ptr() + c.numel() * 4) for c in cuts)
    assert len(spans) == 40
    assert all(end <= start for (_, end), (start, _) in zip(spans[:-1], spans[1:], strict=True))
    assert native._slab_used == 40 * 1008  # each cut rounded up to 64 bytes


def test_copies_made_in_inference_mode_and_out_of_it_share_slabs():
    native._slab = None
    with torch.inference_mode():
        inside = native.blocked(torch.ones(8, 4))
    outside = native.blocked(torch.full((8, 4), 2.0))  # cut from the slab made in inference mode
    assert not inside.is_inference() and inside.eq(1.0).all() and outside.eq(2.0).all()


def test_a_strided_input_is_read_as_its_values():
    w = torch.randn(24, 10)
    x = torch.randn(10, 3).T  # (3, 10), not contiguous
    assert torch.equal(native.product(x, native.blocked(w), None, 24), fma_chain(x.contiguous(), w, None))


def test_copies_are_cut_from_two_megabyte_aligned_slabs_without_overlap():
    native._slab = None  # a fresh slab
    first, second = native.huge_empty(1000), native.huge_empty(5)
    assert first.data_ptr() % native.HUGE_PAGE == 0
    assert second.data_ptr() >= first.data_ptr() + 1000 * 4 and second.data_ptr() % 64 == 0
    first.fill_(1.0)
    second.fill_(2.0)
    assert first.eq(1.0).all() and second.eq(2.0).all()
    big = native.huge_empty(native.SLAB // 4 + 1)  # larger than a slab: a slab of its own
    assert big.numel() >= native.SLAB // 4 + 1 and big.data_ptr() % native.HUGE_PAGE == 0


def test_bad_operands_are_refused_with_a_clear_error():
    w = torch.randn(16, 8)
    with pytest.raises(RuntimeError, match="x's width"):
        native.product(torch.randn(1, 9), native.blocked(w), None, 16)
    with pytest.raises(RuntimeError, match="one per feature"):
        native.product(torch.randn(1, 8), native.blocked(w), torch.randn(15), 16)
    with pytest.raises(RuntimeError, match="float32 only"):  # the candidate refuses, so the table leaves it out
        kernels.CANDIDATES[kernels.BLOCKED](torch.randn(1, 8).half(), w.half(), None)


@pytest.mark.parametrize("batch,rows", [(1, 1), (2, 1), (1, 5), (3, 4)])
@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (4, 4)])
def test_the_native_steps_agree_with_the_python_steps(batch, rows, heads, kv_heads):
    """RoPE's split, the residual sums and SwiGLU's gate bit for bit (the same ATen operators); the norm and the
    attention, which native.cpp sums in its own order, to float32's rounding."""
    generator = torch.Generator().manual_seed(batch * 100 + rows * 10 + heads)
    dim, past = 16, 7
    native_steps = native.module()

    def same(a, b):
        assert a.shape == b.shape and torch.equal(a, b)

    def close(a, b):
        torch.testing.assert_close(a, b, rtol=2e-6, atol=2e-6)

    qkv = torch.randn(batch, rows, (heads + 2 * kv_heads) * dim, generator=generator)
    cos, sin = torch.randn(2, batch, 1, rows, dim, generator=generator)
    for ours, theirs in zip(native_steps.attention_in(qkv, cos, sin, heads, kv_heads, dim),
                            Steps.attention_in(qkv, cos, sin, heads, kv_heads, dim), strict=True):
        same(ours, theirs)
    query, key, value = Steps.attention_in(qkv, cos, sin, heads, kv_heads, dim)
    key = torch.cat([torch.randn(batch, kv_heads, past, dim, generator=generator), key], dim=2)
    value = torch.cat([torch.randn(batch, kv_heads, past, dim, generator=generator), value], dim=2)
    additive = torch.randn(batch, 1, rows, past + rows, generator=generator)  # a float mask, as trees and batches pass
    for mask in (None, additive):  # None: a chain after the cache
        close(native_steps.attention_out(query, key, value, mask, 0.25),
              Steps.attention_out(query, key, value, mask, 0.25))
    x, delta = torch.randn(2, batch, rows, 48, generator=generator)
    weight = torch.randn(48, generator=generator)
    (total, normed), (their_total, their_normed) = (native_steps.residual_norm(x, delta, weight, 1e-5),
                                                    Steps.residual_norm(x, delta, weight, 1e-5))
    same(total, their_total)
    close(normed, their_normed)
    gate_up = torch.randn(batch, rows, 2 * 40, generator=generator)
    same(native_steps.gated(gate_up), Steps.gated(gate_up))


@pytest.mark.parametrize("batch,tables,dim", [(3, 1, 64), (2, 2, 96), (2, 1, 8), (1, 1, 24)])
def test_the_native_rope_is_the_python_steps_floats(batch, tables, dim):
    """RoPE's split bit for bit: heads of 64 and 96 (our loop), 8 and 24 (not a multiple of 16: ATen's operators),
    cos and sin of one batch row broadcast over a batch (positions (1, T), as the compact forward makes them)."""
    generator = torch.Generator().manual_seed(batch * dim)
    heads, kv_heads, rows = 9, 3, 5
    qkv = torch.randn(batch, rows, (heads + 2 * kv_heads) * dim, generator=generator) * 5
    cos, sin = torch.randn(2, tables, 1, rows, dim, generator=generator)
    ours = native.module().attention_in(qkv, cos, sin, heads, kv_heads, dim)
    theirs = Steps.attention_in(qkv, cos, sin, heads, kv_heads, dim)
    for mine, expected in zip(ours, theirs, strict=True):
        assert mine.shape == expected.shape and torch.equal(mine, expected)


def attention_reference(query, key, value, scale):
    """A chain's attention in float64, from the definition: row i of T sees all keys but the last T - 1 - i."""
    rows, keys = query.shape[2], key.shape[2]
    group = query.shape[1] // key.shape[1]
    k, v = key.double().repeat_interleave(group, 1), value.double().repeat_interleave(group, 1)
    scores = query.double() @ k.transpose(-1, -2) * scale
    hidden = torch.ones(rows, keys, dtype=torch.bool).tril(diagonal=keys - rows).logical_not()
    out = scores.masked_fill(hidden, float("-inf")).softmax(-1) @ v
    return out.transpose(1, 2).reshape(query.shape[0], rows, -1)


@pytest.mark.parametrize("keys,dim", [(1, 64), (7, 64), (8, 64), (81, 64), (2003, 64), (81, 96), (30, 8)])
def test_the_native_attention_is_the_definitions_to_float32s_rounding(keys, dim):
    """Long and short contexts, a tail of keys not a multiple of eight, heads wider than the registers' span (96),
    scores spread widely enough that e^x meets both ends of its range, and keys read through a cache's strides
    (storage with room past the end)."""
    generator = torch.Generator().manual_seed(keys)
    rows = min(keys, 4)
    query = torch.randn(2, 9, rows, dim, generator=generator) * 3
    room = torch.randn(2, 3, keys + 50, dim, generator=generator)
    key, value = room[:, :, :keys], torch.randn(2, 3, keys + 50, dim, generator=generator)[:, :, :keys]
    out = native.module().attention_out(query, key, value, None, 0.125)
    expected = attention_reference(query, key, value, 0.125)
    assert out.shape == expected.shape
    assert (out.double() - expected).abs().max() < 1e-5 * max(1.0, expected.abs().max().item())


@pytest.mark.parametrize("keys,rows,dim", [(5, 5, 64), (300, 5, 64), (83, 9, 128), (17, 3, 8)])
def test_a_chain_rows_attention_is_the_same_floats_as_that_row_alone(keys, rows, dim):
    """Row i of a pass sees the keys up to its own: its output must be bit for bit what a pass of that row alone over
    those keys gives, whatever rows share its sweep, or a verify pass and plain decoding would round apart."""
    generator = torch.Generator().manual_seed(keys * rows)
    query = torch.randn(1, 9, rows, dim, generator=generator) * 3
    key, value = torch.randn(2, 1, 3, keys, dim, generator=generator)
    out = native.module().attention_out(query, key, value, None, 0.125).view(1, rows, 9, dim)
    for i in range(rows):
        seen = keys - (rows - 1 - i)
        alone = native.module().attention_out(query[:, :, i : i + 1].contiguous(), key[:, :, :seen], value[:, :, :seen],
                                              None, 0.125)
        assert torch.equal(out[:, i].reshape(1, 1, -1), alone), (keys, rows, dim, i)


def test_the_native_norm_is_the_definitions_to_float32s_rounding():
    x = torch.randn(3, 5, 576) * 10
    weight = torch.randn(576)
    expected = weight.double() * (x.double() / (x.double().pow(2).mean(-1, keepdim=True) + 1e-5).sqrt())
    out = native.module().rms_norm(x, weight, 1e-5)
    assert ((out.double() - expected).abs() <= 1e-5 * expected.abs() + 1e-6).all()


def test_a_lock_left_by_a_killed_build_does_not_stall_the_next():
    """torch's builder waits forever on its lock file while it exists; a build killed midway leaves one behind."""
    build = Path(cpp_extension._get_build_directory(native.NAME, verbose=False))
    with native.exclusive(build / "specdash.lock"):  # as a killed build leaves it: the file, no process behind it
        (build / "lock").touch()
    done = subprocess.run([sys.executable, "-m", "runner.engine.weights.native"], capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).parents[2])
    assert done.returncode == 0 and done.stdout.startswith(f"native code: {build}"), done.stdout + done.stderr
    assert not (build / "lock").exists()
