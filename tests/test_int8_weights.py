"""course_utils.inference.int8_weights: the by-hand int8 weight-only linear — its grid, its error, the model swap."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from course_utils.inference.int8_weights import (
    Int8WeightOnlyLinear,
    quantization_error,
    quantize_linears,
)
from course_utils.inference.kv_cache import generate
from course_utils.inference.roofline import weight_bytes
from course_utils.models import GPT, GPTConfig


def test_each_row_uses_the_full_int8_range_and_dequantises_within_half_a_step() -> None:
    torch.manual_seed(0)
    lin = nn.Linear(64, 32)
    q = Int8WeightOnlyLinear.from_linear(lin)
    assert q.weight.dtype == torch.int8 and q.scales.shape == (32,)
    assert torch.equal(q.weight.abs().amax(dim=1), torch.full((32,), 127, dtype=torch.int8))
    back = q.weight.float() * q.scales[:, None]
    assert ((back - lin.weight).abs() <= q.scales[:, None] / 2 + 1e-7).all()


def test_the_forward_is_the_float_product_with_the_dequantised_weight() -> None:
    torch.manual_seed(1)
    lin = nn.Linear(40, 24)
    q = Int8WeightOnlyLinear.from_linear(lin)
    x = torch.randn(5, 40)
    expected = x @ (q.weight.float() * q.scales[:, None]).T + lin.bias
    torch.testing.assert_close(q(x), expected, rtol=1e-5, atol=1e-5)
    assert quantization_error(lin, x) < 0.01  # a Gaussian-initialised layer: well under 1%


def test_an_outlier_coarsens_its_row() -> None:
    """One scale per row: a row with an outlier rounds all its other weights on a grid 2/127 apart."""
    torch.manual_seed(0)
    lin = nn.Linear(256, 2, bias=False)
    with torch.no_grad():
        lin.weight.normal_(0, 0.02)
        lin.weight[0, 0] = 2.0  # 100 standard deviations
    q = Int8WeightOnlyLinear.from_linear(lin)
    error = (q.weight.float() * q.scales[:, None] - lin.weight).abs()[:, 1:].mean(dim=1)
    assert error[0] > 10 * error[1]


def test_a_quantized_gpt_is_smaller_and_mostly_agrees() -> None:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab=128, seq_len=64, d_model=64, n_heads=4, n_layers=2)
    model = GPT(cfg).eval()
    small = copy.deepcopy(model)
    assert quantize_linears(small, skip=("head",)) == 2 * 4  # qkv, proj, two MLP layers per block
    assert isinstance(small.head, nn.Linear) and isinstance(small.blocks[0].qkv, Int8WeightOnlyLinear)
    assert weight_bytes(small) < weight_bytes(model) * 0.6
    prompt = torch.randint(cfg.vocab, (4, 8), generator=torch.Generator().manual_seed(2))
    agree = (generate(small, prompt, 24)[:, 8:] == generate(model, prompt, 24)[:, 8:]).float().mean()
    assert agree >= 0.8  # a random model's logits are close: some argmaxes flip


def test_bad_weights_are_refused() -> None:
    with pytest.raises(ValueError, match="an int8 \\(out, in\\) weight"):
        Int8WeightOnlyLinear(torch.zeros(3, 4), torch.ones(3), None)
    with pytest.raises(ValueError, match="one scale per output channel"):
        Int8WeightOnlyLinear(torch.zeros(3, 4, dtype=torch.int8), torch.ones(4), None)
