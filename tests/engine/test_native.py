"""The engine's own C++ product: the blocked layout element by element, each output the exact fused
multiply-add chain it is meant to be, any row count, feature count and bias, the huge-page slabs, clear refusals."""

from __future__ import annotations

import pytest
import torch

from runner.engine.weights import kernels, native

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


@pytest.mark.parametrize("features,k", [(16, 64), (13, 7), (300, 64), (8, 1)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_each_output_is_exactly_the_fused_multiply_add_chain(features, k, with_bias):
    generator = torch.Generator().manual_seed(features * k)
    w = torch.randn(features, k, generator=generator)
    b = torch.randn(features, generator=generator) if with_bias else None
    blocks = native.blocked(w)
    for rows in (1, 2, 3, 4, 5, 9):  # sums of up to four rows per sweep over a block: 5 and 9 sweep it again
        x = torch.randn(rows, k, generator=generator)
        out = native.product(x, blocks, b, features)
        assert out.shape == (rows, features) and out.is_contiguous()
        assert torch.equal(out, fma_chain(x, w, b)), (rows, features, k)


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
