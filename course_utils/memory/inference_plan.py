"""Notebook 10: will an inference job fit? A memory plan for generating with a KV cache, phase by phase, built
like notebook 08's training plan (`course_utils.memory.planner`: the same `Term` and `MemoryPlan`, the same
CUDA context and allocator margin outside what the allocator counts).

`plan_inference(cfg, batch, max_len, prompt_len, ...)` predicts what PyTorch's caching allocator holds
(``torch.cuda.max_memory_allocated()``) while `course_utils.inference.kv_cache` generates with the course's
`GPT` of shape ``cfg``, eagerly, under ``torch.inference_mode``:

- **weights**, as stored: float32, bf16, or int8 by hand (`course_utils.inference.int8_weights`: the blocks'
  linear weights in one byte, a scale per output channel, the head and everything else in bf16);
- the **KV cache**: ``2 · n_layers · batch · max_len · d_model`` elements in the model's dtype, allocated
  once (`course_utils.inference.kv_cache.kv_cache_bytes`);
- one **cuBLAS workspace** (the thread that runs the products; no autograd thread in inference);
- **activations** of the largest moment of a block, for the ``t`` positions a pass computes (the prompt's in
  the prefill, one in a decode step). Nothing is saved for a backward, but the block's own Python variables
  keep its tensors alive until it returns. At its peak, inside the MLP's GELU, a block holds 15 tensors' worth
  of ``batch · t · d_model`` elements: its input (kept by the caller's loop, 1), the qkv layer's output (3,
  kept by the q, k, v views), the attention's output (1), the residual after attention (1), the second norm's
  output (1, the MLP's argument), the first MLP layer's output (4) and the GELU's (4);
- with int8 weights by hand, a **dequantized weight**: each layer converts its int8 weight to the activations'
  dtype before the product (``weight.to(x.dtype)``): the largest, ``4 · d_model²`` elements, at the moment the
  MLP's second layer runs (the GELU's input freed by then: 11 activation tensors' worth beside it).
  ``torch.compile`` fuses the conversion into the product (nothing materialised); the plan is for eager.

The prefill's activations scale with ``batch × prompt``; a decode step's with ``batch``: long prompts in large
batches peak in the prefill, otherwise the cache and weights decide (`MemoryPlan.peak_phase` says which).
`largest_batch` searches the largest batch whose plan fits a GPU. `measure_inference` measures the same job
on a CUDA GPU, phase by phase, with ``max_memory_allocated``: notebook 10's ``10-memory-plan`` recording and
benchmarks/inference_memory.py set the two side by side (on an H200, within 0.1% for every configuration
tried, 0.1 to 6.7 B parameters, float32, bf16 and int8).
"""

from __future__ import annotations

import gc

import torch

from ..models import GPT, GPTConfig
from .planner import CONTEXT_BYTES, MARGIN, WORKSPACE_BYTES, MemoryPlan, Term, parameter_count

__all__ = ["ACTIVATION_TENSORS", "WEIGHTS", "largest_batch", "measure_inference", "plan_inference",
           "stored_weight_bytes"]

WEIGHTS = {"fp32": 4, "bf16": 2, "int8": 1}
"""How the weights are stored, and the bytes of one element of the activations and the cache for each (int8
weights run with bf16 activations and a bf16 cache)."""
ACTIVATION_TENSORS = 15
"""Tensors of ``batch · t · d_model`` elements a block holds at its peak (the module's docstring counts them)."""


def stored_weight_bytes(cfg: GPTConfig, weights: str = "bf16") -> int:
    """Bytes of the weights of `GPT` of shape ``cfg`` stored as ``weights`` (a key of `WEIGHTS`): for ``"int8"``,
    the blocks' linear weights in int8 with a bf16 scale per output channel, everything else in bf16 (the head
    included, as `quantize_linears(model, skip=("head",))` leaves it)."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {tuple(WEIGHTS)}, got {weights!r}")
    n = parameter_count(cfg)
    if weights != "int8":
        return WEIGHTS[weights] * n
    d, L = cfg.d_model, cfg.n_layers
    linear = 12 * d * d  # qkv 3d², proj d², fc 4d², out 4d²: one byte each
    scales = 9 * d  # one per output channel: 3d + d + 4d + d
    return L * linear + 2 * (L * scales + (n - L * linear))


def _activation_bytes(cfg: GPTConfig, batch: int, t: int, weights: str) -> tuple[float, str]:
    """The largest moment of one block over ``t`` positions of ``batch`` sequences: bytes, and why."""
    a = 4 if weights == "fp32" else 2
    unit = batch * t * cfg.d_model * a
    peak, why = ACTIVATION_TENSORS * unit, f"{ACTIVATION_TENSORS} tensors of batch × {t} positions × d_model, in the MLP"
    if weights == "int8":
        dequantized = 4 * cfg.d_model * cfg.d_model * a + 11 * unit
        if dequantized > peak:
            peak, why = dequantized, "the MLP's second weight dequantized to bf16, beside 11 activation tensors"
    return peak, why


def plan_inference(cfg: GPTConfig, batch: int, max_len: int, prompt_len: int, weights: str = "bf16", *,
                   workspace: float = WORKSPACE_BYTES, context: float = CONTEXT_BYTES,
                   margin: float = MARGIN) -> MemoryPlan:
    """Predict the memory of generating with `GPT` of shape ``cfg``: ``batch`` sequences, a KV cache of
    ``max_len`` positions, a ``prompt_len``-token prefill, then decode steps; weights stored as ``weights``
    (``"fp32"``, ``"bf16"`` or ``"int8"``). Phases ``"prefill"`` and ``"decode"``; see the module's docstring."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {tuple(WEIGHTS)}, got {weights!r}")
    if batch < 1 or not 1 <= prompt_len <= max_len:
        raise ValueError(f"plan_inference: batch ≥ 1 and 1 ≤ prompt_len ≤ max_len, got batch {batch}, prompt_len "
                         f"{prompt_len}, max_len {max_len}")
    if max_len > cfg.seq_len:
        raise ValueError(f"plan_inference: max_len ({max_len}) beyond the model's seq_len ({cfg.seq_len}): its "
                         "position embedding has no row for those positions")
    a = 4 if weights == "fp32" else 2
    n_bytes = stored_weight_bytes(cfg, weights)
    kv = 2 * cfg.n_layers * batch * max_len * cfg.d_model * a
    base = [Term("weights", n_bytes, f"{parameter_count(cfg) / 1e9:.2f} B parameters, {weights}"
                 + (" (blocks' linear layers; the rest bf16)" if weights == "int8" else "")),
            Term("KV cache", kv, f"2 × {cfg.n_layers} blocks × batch {batch} × {max_len} positions × "
                 f"{cfg.d_model}, {'float32' if a == 4 else 'bf16'}"),
            Term("cuBLAS workspace", workspace, "one: the thread that runs the products")]
    phases = {}
    for phase, t in (("prefill", prompt_len), ("decode", 1)):
        acts, why = _activation_bytes(cfg, batch, t, weights)
        phases[phase] = (*base, Term("activations", acts, why))
    return MemoryPlan(f"{parameter_count(cfg) / 1e9:.2f} B parameters, {weights} weights, batch {batch}, "
                      f"{prompt_len}-token prompt, cache of {max_len}", phases, context, margin)


def largest_batch(cfg: GPTConfig, max_len: int, prompt_len: int, gpu_bytes: float, weights: str = "bf16",
                  limit: int = 1 << 16, **options: float) -> int:
    """The largest batch whose `plan_inference` fits ``gpu_bytes`` (`MemoryPlan.fits`: the peak, the allocator's
    margin and the CUDA context), up to ``limit``; 0 when not even one sequence fits."""
    def fits(batch: int) -> bool:
        return plan_inference(cfg, batch, max_len, prompt_len, weights, **options).fits(gpu_bytes)

    if not fits(1):
        return 0
    low, high = 1, limit
    while low < high:  # the plan grows with the batch: the largest batch that fits, by bisection
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low


@torch.inference_mode()
def measure_inference(cfg: GPTConfig, batch: int, max_len: int, prompt_len: int, weights: str = "bf16",
                      device: torch.device | str = "cuda", steps: int = 2) -> dict[str, int]:
    """Measure on a CUDA GPU what `plan_inference` predicts: build `GPT` of shape ``cfg`` on ``device`` (its
    weights stored as ``weights``), allocate its KV cache, prefill ``prompt_len`` random tokens for ``batch``
    sequences and run ``steps`` decode steps. Returns bytes above what the allocator held before: ``weights``,
    ``cache``, and the peaks ``prefill`` and ``decode`` (``max_memory_allocated``). A cuBLAS workspace is made
    first, so it is in none of them (`plan_inference` lists it as a term of its own)."""
    from ..inference.int8_weights import quantize_linears
    from ..inference.kv_cache import StaticKVCache, forward_with_cache

    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        raise ValueError(f"measure_inference measures CUDA's caching allocator: give it a CUDA device, got "
                         f"{device}{'' if torch.cuda.is_available() else ' (and this machine has no CUDA GPU)'}")
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {tuple(WEIGHTS)}, got {weights!r}")
    if prompt_len + steps > max_len:
        raise ValueError(f"measure_inference: {prompt_len} prompt tokens + {steps} steps do not fit {max_len}")
    dtype = torch.float32 if weights == "fp32" else torch.bfloat16
    torch.ones(2, 2, device=device, dtype=dtype) @ torch.ones(2, 2, device=device, dtype=dtype)  # the workspace
    gc.collect()
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = GPT(cfg).eval()
    finally:
        torch.set_default_dtype(previous)
    if weights == "int8":
        quantize_linears(model, skip=("head",))
    out = {"weights": torch.cuda.memory_allocated(device) - before}
    cache = StaticKVCache(cfg, batch, max_len, dtype=dtype, device=device)
    out["cache"] = torch.cuda.memory_allocated(device) - before - out["weights"]
    tokens = torch.randint(cfg.vocab, (batch, prompt_len), generator=torch.Generator().manual_seed(0)).to(device)
    torch.cuda.reset_peak_memory_stats(device)
    token = forward_with_cache(model, tokens, torch.arange(prompt_len, device=device), cache,
                               last_only=True).argmax(-1)
    torch.cuda.synchronize(device)
    out["prefill"] = torch.cuda.max_memory_allocated(device) - before
    pos = torch.tensor([prompt_len], device=device)
    torch.cuda.reset_peak_memory_stats(device)
    for _ in range(steps):
        token = forward_with_cache(model, token, pos, cache)[:, -1:].argmax(-1)
        pos += 1
    torch.cuda.synchronize(device)
    out["decode"] = torch.cuda.max_memory_allocated(device) - before
    del model, cache, tokens, token, pos
    gc.collect()
    torch.cuda.empty_cache()
    return out
