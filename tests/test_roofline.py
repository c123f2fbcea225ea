"""course_utils.inference.roofline: intensities, the roofline, decode bytes, MBU and the knee, against hand sums."""

from __future__ import annotations

import pytest

from course_utils.inference.roofline import (
    decode_step_bytes,
    knee_batch,
    linear_intensity,
    mbu,
    ridge_point,
    roofline_seconds,
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
    by_hand = 4 * (params - embeddings + 3 * 2 * 64) + 2 * 2 * 3 * 32 * 64 * 2
    assert decode_step_bytes(cfg, 3, 32, weight_bytes=4 * params) == pytest.approx(by_hand)


def test_mbu_and_knee() -> None:
    assert mbu(2.4e12, 1.0, 4.8e12) == 0.5
    with pytest.raises(ValueError, match="must be positive"):
        mbu(1.0, 0.0, 1.0)
    assert knee_batch(989e12, 4.8e12, 2) == pytest.approx(206.0, rel=1e-3)
    assert knee_batch(989e12, 4.8e12, 1) == pytest.approx(103.0, rel=1e-3)

