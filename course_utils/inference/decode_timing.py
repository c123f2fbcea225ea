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

import re
import time
import warnings
from collections.abc import Callable

import torch

from ..models import GPT
from .kv_cache import StaticKVCache, forward_with_cache, generate

__all__ = ["KERNEL_KINDS", "kernel_kind", "seconds_per_step", "step_profile"]

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
def step_profile(model: GPT, step: Step = forward_with_cache, steps: int = 8, prompt_len: int = 8,
                 max_len: int | None = None) -> dict[str, float]:
    """From a profile of ``steps`` decode steps at batch 1 after a ``prompt_len``-token prefill: GPU kernels per
    step, the GPU's busy time per step and the wall time per step, and the busy time and kernels of each of
    `KERNEL_KINDS` (keys ``products_s``, ``products_kernels``, ...). Busy time far below wall time: the GPU waits
    for the host (launch-bound); the profiler slows the host too, so time an eager step without it.
    ``max_len``: the cache's length (default just enough); give a compiled ``step`` the length it was compiled
    for, or it compiles again for the new shape."""
    from torch.profiler import ProfilerActivity, profile

    device = model.tok.weight.device
    max_len = max_len or prompt_len + steps + 1
    if prompt_len + steps > max_len:
        raise ValueError(f"step_profile: a {prompt_len}-token prompt and {steps} steps do not fit a cache of "
                         f"{max_len} positions")
    cache = StaticKVCache(model.cfg, 1, max_len, dtype=model.tok.weight.dtype, device=device)
    prompt = torch.zeros(1, prompt_len, dtype=torch.long, device=device)
    _decode(model, cache, *_prefill(model, cache, prompt), steps, step)  # warm-up
    token, pos = _prefill(model, cache, prompt)  # outside the profile: decode steps only
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    _sync(device)
    with warnings.catch_warnings(), profile(activities=activities) as prof:
        warnings.filterwarnings("ignore", message=r".*Profiler clears events")  # torch 2.11 warns about cycles
        start = time.perf_counter()
        _decode(model, cache, token, pos, steps, step)
        _sync(device)
        wall = (time.perf_counter() - start) / steps
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    out = {"kernels_per_step": len(kernels) / steps, "gpu_busy_s": sum(e.device_time for e in kernels) / 1e6 / steps,
           "wall_s": wall}
    for kind in KERNEL_KINDS:
        mine = [e for e in kernels if kernel_kind(e.name) == kind]
        out[f"{kind}_s"] = sum(e.device_time for e in mine) / 1e6 / steps
        out[f"{kind}_kernels"] = len(mine) / steps
    return out


KERNEL_KINDS = ("products", "attention", "norms", "other")
"""How `step_profile` groups a step's GPU kernels: matrix products (cuBLAS's, CUTLASS's, or Inductor's
reductions that compute one), attention (the fused kernel and what Inductor fuses into it: the cache writes),
layer norms, and everything else (residual adds, GELU, copies)."""
_PRODUCT = re.compile(r"gemm|gemv|nvjet|xmma|cutlass|splitk|int4pack|(^|_)mm(_|$)|_mm_|addmm", re.IGNORECASE)


def kernel_kind(name: str) -> str:
    """The `KERNEL_KINDS` group of a GPU kernel, from its name."""
    low = name.lower()
    if _PRODUCT.search(low):
        return "products"
    if any(word in low for word in ("attention", "sdpa", "flash", "fmha")):
        return "attention"
    if "norm" in low:
        return "norms"
    return "other"
