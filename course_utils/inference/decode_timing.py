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


def _prefill(model: GPT, cache: StaticKVCache, prompt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Fill ``cache`` with ``prompt``: its next tokens, and the position of the first decode step (a tensor)."""
    t = prompt.shape[1]
    logits = forward_with_cache(model, prompt, torch.arange(t, device=prompt.device), cache, last_only=True)
    return logits.argmax(-1), torch.tensor([t], device=prompt.device)


def _decode(model: GPT, cache: StaticKVCache, token: torch.Tensor, pos: torch.Tensor, steps: int,
            step: Step) -> torch.Tensor:
    """``steps`` greedy decode steps from ``token`` at ``pos`` (advanced in place, on the device)."""
    for _ in range(steps):
        token = step(model, token, pos, cache)[:, -1:].argmax(-1)
        pos += 1
    return token


@torch.inference_mode()
def seconds_per_step(model: GPT, batch: int, prompt_len: int, steps: int, rounds: int,
                     step: Step = forward_with_cache) -> list[float]:
    """Seconds per decode step of ``model`` (on its device, its cache in its dtype) at ``batch``, after a
    ``prompt_len``-token prefill: one value per round of ``steps`` steps (the prefill is outside the timed span)."""
    device = model.tok.weight.device
    cache = StaticKVCache(model.cfg, batch, prompt_len + steps + 1, dtype=model.tok.weight.dtype, device=device)
    prompt = torch.randint(model.cfg.vocab, (batch, prompt_len), generator=torch.Generator().manual_seed(1))
    prompt = prompt.to(device)
    generate(model, prompt, steps, cache=cache, step=step)  # warm-up: compiles, captures graphs, allocates
    out = []
    for _ in range(rounds):
        token, pos = _prefill(model, cache, prompt)
        _sync(device)
        start = time.perf_counter()
        _decode(model, cache, token, pos, steps, step)
        _sync(device)
        out.append((time.perf_counter() - start) / steps)
    return out


@torch.inference_mode()
def step_profile(model: GPT, step: Step = forward_with_cache, steps: int = 8) -> dict[str, float]:
    """From a profile of ``steps`` decode steps at batch 1: GPU kernels per step, the GPU's busy time per step
    and the wall time per step. Busy time far below wall time: the GPU waits for the host (launch-bound)."""
    from torch.profiler import ProfilerActivity, profile

    device = model.tok.weight.device
    cache = StaticKVCache(model.cfg, 1, steps + 9, dtype=model.tok.weight.dtype, device=device)
    prompt = torch.zeros(1, 8, dtype=torch.long, device=device)
    _decode(model, cache, *_prefill(model, cache, prompt), steps, step)  # warm-up
    token, pos = _prefill(model, cache, prompt)  # outside the profile: decode steps only
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    _sync(device)
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        _decode(model, cache, token, pos, steps, step)
        _sync(device)
        wall = (time.perf_counter() - start) / steps
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return {"kernels_per_step": len(kernels) / steps, "gpu_busy_s": sum(e.device_time for e in kernels) / 1e6 / steps,
            "wall_s": wall}
