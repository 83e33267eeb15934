"""The fast decode step's int8 products (engines/fastdecode.py) compute what float32 computes on
inputs whose uint8 x int8 pair sums overflow 16 bits: the case where fbgemm's kernel on a CPU
without VNNI (AVX2) saturates unless the weights' scales keep every pair in range."""
from __future__ import annotations

import warnings

import pytest
import torch

from clawrl.engines.packed import Matrix, int8_available, int8_pairs_overflow, int8_scales

pytestmark = pytest.mark.skipif(not int8_available(), reason="int8 products need fbgemm (an x86 CPU)")


def test_products_whose_pairs_overflow_16_bits_are_computed_right():
    # At 8 bits every pair of products would be 255 x 127 (x at its range's top, w at its row's
    # largest): their sum, 64770, does not fit 16 bits, and saturated the result is about half.
    w, x = torch.ones(8, 256), torch.ones(1, 256)
    got = Matrix(w, None, "int8")(x)
    assert torch.allclose(got, x @ w.T, rtol=0.01), got[0, :3]


def test_same_signed_activations_and_weights_stay_within_quantization_error():
    # Post-activation inputs (all positive) against rows of one sign.
    g = torch.Generator().manual_seed(0)
    w = torch.rand(64, 512, generator=g) * 0.5 + 0.5
    x = torch.rand(3, 512, generator=g) * 4
    got, want = Matrix(w, None, "int8")(x), x @ w.T
    assert float(((got - want).norm() / want.norm())) < 0.01


def test_scales_keep_every_pair_in_range_and_cost_only_where_pairs_overflow():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(256, 577, generator=g)            # an odd width: the last channel has no pair
    w[:, 10] *= 8                                      # a column of outliers, as real rows have
    w[:, 11] = w[:, 10].abs()                          # ... beside a partner of the same sign in half the rows
    scale = int8_scales(w)
    plain = w.abs().amax(dim=1) / 127
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = torch.quantize_per_channel(w, scale, torch.zeros(256, dtype=torch.long), 0, torch.qint8)
    q = q.int_repr().int()
    if not int8_pairs_overflow():
        assert torch.allclose(scale, plain.double())
        return
    assert int((q[:, 0:576:2] + q[:, 1:576:2]).abs().max()) <= 128      # 255 x 128 fits 16 bits
    assert bool((scale >= plain.double()).all()) and float(scale.max() / plain.max()) <= 2 + 1e-6
