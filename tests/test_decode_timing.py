"""course_utils.inference.decode_timing on the CPU: rounds of timed decode steps, and a profile's per-step figures."""

from __future__ import annotations

import torch

from course_utils.inference.decode_timing import seconds_per_step, step_profile
from course_utils.models import GPT, GPTConfig


def test_decode_timing_times_each_round_and_profiles_on_the_cpu() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab=97, seq_len=48, d_model=48, n_heads=3, n_layers=3)).eval()
    seconds = seconds_per_step(model, 2, 4, 6, rounds=3)
    assert len(seconds) == 3 and all(0 < s < 1 for s in seconds)
    profile = step_profile(model, steps=4)
    assert profile["wall_s"] > 0 and profile["kernels_per_step"] == 0  # no CUDA kernels on the CPU
