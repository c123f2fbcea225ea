"""course_utils.inference.roofline: intensities, the roofline, decode bytes, MBU and the knee, against hand sums."""

from __future__ import annotations

import pytest
import torch

from course_utils.inference.int8_weights import Int8WeightOnlyLinear, quantize_linears
from course_utils.inference.roofline import (
    decode_step_bytes,
    knee_batch,
    linear_intensity,
    mbu,
    model_step_bytes,
    ridge_point,
    roofline_seconds,
    weight_bytes,
)
from course_utils.memory.planner import parameter_count
from course_utils.models import GPT, GPTConfig


def test_decode_is_about_one_flop_per_byte_and_prefill_far_more() -> None:
    assert linear_intensity(1, 4096, 4096, 2) == pytest.approx(1.0, rel=1e-3)
    assert linear_intensity(2048, 4096, 4096, 2) == pytest.approx(2 * 2048 * 4096 / (4096 + 2 * 2048) / 2)
    assert linear_intensity(2048, 4096, 4096, 2) > 500


def test_roofline_and_ridge() -> None:
    assert ridge_point(989e12, 4.8e12) == pytest.approx(206.0, rel=1e-3)
    assert roofline_seconds(2e9, 1e9, 1e12, 1e12) == 2e-3
    assert roofline_seconds(1e9, 2e9, 1e12, 1e12) == 2e-3


def test_decode_step_bytes_of_a_real_model() -> None:
    cfg = GPTConfig(vocab=100, seq_len=32, d_model=64, n_heads=4, n_layers=2)
    model = GPT(cfg)
    params = sum(p.numel() for p in model.parameters())
    assert params == parameter_count(cfg)
    embeddings = model.tok.weight.numel() + model.pos.weight.numel()
    by_hand = 4 * (params - embeddings + 3 * 2 * 64) + 2 * 2 * 3 * 32 * 64 * 4
    assert decode_step_bytes(cfg, 3, 32, bytes_per_weight=4, cache_bytes_per_element=4) == pytest.approx(by_hand)
    assert model_step_bytes(model, 3, 32) == by_hand  # float32 model, float32 cache


def test_a_quantized_models_bytes_count_its_int8_weights_and_full_precision_embeddings() -> None:
    cfg = GPTConfig(vocab=100, seq_len=32, d_model=64, n_heads=4, n_layers=2)
    model = GPT(cfg)
    quantize_linears(model, skip=("head",))
    stored = weight_bytes(model)
    linears = [m for m in model.modules() if isinstance(m, Int8WeightOnlyLinear)]
    by_hand = (sum(m.weight.numel() + 4 * m.scales.numel() + 4 * m.bias.numel() for m in linears)
               + 4 * sum(p.numel() for p in model.parameters()))  # what stayed float32: norms, head, embeddings
    assert stored == by_hand
    tables = 4 * (100 + 32) * 64
    assert model_step_bytes(model, 1, 8) == stored - tables + 2 * 4 * 64 + 2 * 2 * 8 * 64 * 4


def test_a_tensor_subclass_is_counted_by_what_it_stores() -> None:
    """torchao's quantized weights report the dtype they stand for; their inner tensors say what they store."""

    class Packed(torch.Tensor):
        @staticmethod
        def __new__(cls, data: torch.Tensor, scale: torch.Tensor):  # type: ignore[no-untyped-def]
            return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=torch.bfloat16)

        def __init__(self, data: torch.Tensor, scale: torch.Tensor) -> None:
            self.data_, self.scale = data, scale

        def __tensor_flatten__(self):  # type: ignore[no-untyped-def]
            return ["data_", "scale"], None

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            return NotImplemented

    layer = torch.nn.Module()
    layer.register_buffer("weight", Packed(torch.zeros(8, 16, dtype=torch.int8), torch.ones(8)))
    assert layer.weight.dtype == torch.bfloat16 and layer.weight.element_size() == 2
    assert weight_bytes(layer) == 8 * 16 + 4 * 8


def test_mbu_and_knee() -> None:
    assert mbu(2.4e12, 1.0, 4.8e12) == 0.5
    with pytest.raises(ValueError, match="must be positive"):
        mbu(1.0, 0.0, 1.0)
    assert knee_batch(989e12, 4.8e12, 2) == pytest.approx(206.0, rel=1e-3)
    assert knee_batch(989e12, 4.8e12, 1) == pytest.approx(103.0, rel=1e-3)



def test_torchaos_int8_weights_are_counted_as_int8() -> None:
    """The real thing: torchao's ``quantize_`` with ``Int8WeightOnlyConfig`` (notebook 10's rung) stores one byte
    per weight and a scale per row, whatever dtype its tensors report. (torchao 0.18, the pinned release, is built
    for torch 2.11 and later; `make compat` on an older torch skips this test.)"""
    if tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) < (2, 11):
        pytest.skip(f"torchao 0.18 is built for torch 2.11 and later, not {torch.__version__}")
    pytest.importorskip("torchao")
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    layer = torch.nn.Sequential(torch.nn.Linear(64, 32, bias=False)).to(torch.bfloat16)
    quantize_(layer, Int8WeightOnlyConfig(set_inductor_config=False))
    assert layer[0].weight.dtype == torch.bfloat16  # what it stands for
    stored = weight_bytes(layer)
    assert 64 * 32 <= stored <= 64 * 32 + 32 * 4 + 64  # int8 weights, one scale per output row (and small extras)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    assert layer(x).shape == (3, 32)
