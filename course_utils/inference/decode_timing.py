"""Notebook 10: timing decode steps — warmed up, synchronised, in rounds — and telling from a profile whether
a step is paced by the GPU or by the host that launches its kernels.

A decode step is short (milliseconds on a large model, tens of microseconds of work on a small one), so how it
is timed matters more than for training steps:
- the first steps compile, capture CUDA graphs and allocate the cache: they are generated once before timing;
- the position advances *on the device* (``pos += 1``): building it from a Python int each step
  (``torch.tensor([n], device="cuda")``) copies from pageable host memory, and that copy waits until the GPU
  has finished everything queued, so the host could never run ahead;
- the clock stops after ``torch.cuda.synchronize()`` (notebook 01), and each round times many steps as one span.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from ..models import GPT
from .kv_cache import StaticKVCache, forward_with_cache, generate

__all__ = ["seconds_per_step", "step_profile"]

Step = Callable[..., torch.Tensor]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _decode_steps(model: GPT, cache: StaticKVCache, prompt: torch.Tensor, steps: int, step: Step) -> torch.Tensor:
    """Prefill ``prompt`` into ``cache``, then ``steps`` greedy decode steps; the last tokens."""
    t = prompt.shape[1]
    token = forward_with_cache(model, prompt, torch.arange(t, device=prompt.device), cache)[:, -1:].argmax(-1)
    pos = torch.tensor([t], device=prompt.device)
    for _ in range(steps):
        token = step(model, token, pos, cache)[:, -1:].argmax(-1)
        pos += 1
    return token


@torch.inference_mode()
def seconds_per_step(model: GPT, batch: int, prompt_len: int, steps: int, rounds: int, step: Step = forward_with_cache,
                     cache_dtype: torch.dtype = torch.bfloat16) -> list[float]:
    """Seconds per decode step of ``model`` (on its device) at ``batch``, after a ``prompt_len``-token prefill:
    one value per round of ``steps`` steps (the prefill is outside the timed span)."""
    device = next(model.parameters()).device
    cache = StaticKVCache(model.cfg, batch, prompt_len + steps + 1, dtype=cache_dtype, device=device)
    prompt = torch.randint(model.cfg.vocab, (batch, prompt_len), generator=torch.Generator().manual_seed(1))
    prompt = prompt.to(device)
    generate(model, prompt, steps, cache=cache, step=step)  # warm-up: compiles, captures graphs, allocates
    out = []
    for _ in range(rounds):
        t = prompt.shape[1]
        token = forward_with_cache(model, prompt, torch.arange(t, device=device), cache)[:, -1:].argmax(-1)
        pos = torch.tensor([t], device=device)
        _sync(device)
        start = time.perf_counter()
        for _ in range(steps):
            token = step(model, token, pos, cache)[:, -1:].argmax(-1)
            pos += 1
        _sync(device)
        out.append((time.perf_counter() - start) / steps)
    return out


@torch.inference_mode()
def step_profile(model: GPT, step: Step = forward_with_cache, cache_dtype: torch.dtype = torch.bfloat16,
                 steps: int = 8) -> dict[str, float]:
    """From a profile of ``steps`` decode steps at batch 1: GPU kernels per step, the GPU's busy time per step
    and the wall time per step. Busy time far below wall time: the GPU waits for the host (launch-bound)."""
    from torch.profiler import ProfilerActivity, profile

    device = next(model.parameters()).device
    cache = StaticKVCache(model.cfg, 1, 2 * steps + 9, dtype=cache_dtype, device=device)
    prompt = torch.zeros(1, 8, dtype=torch.long, device=device)
    _decode_steps(model, cache, prompt, steps, step)  # warm-up
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        _sync(device)
        start = time.perf_counter()
        _decode_steps(model, cache, prompt, steps, step)
        _sync(device)
        wall = (time.perf_counter() - start) / steps
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return {"kernels_per_step": len(kernels) / steps, "gpu_busy_s": sum(e.device_time for e in kernels) / 1e6 / steps,
            "wall_s": wall}
