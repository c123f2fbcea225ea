"""Notebook 10: why decoding is memory-bound — arithmetic intensity, the roofline, MBU and the batch where it ends.

A kernel that does ``flops`` arithmetic on ``bytes`` of memory traffic takes at least
``max(flops / peak FLOP/s, bytes / peak bytes/s)``: the roofline (Williams, Waterman and Patterson, 2009). Its
*arithmetic intensity*, ``flops / bytes``, says which term wins: below the GPU's *ridge point*, ``peak FLOP/s /
peak bytes/s``, memory is the limit; above it, arithmetic.

A linear layer ``(d_in → d_out)`` applied to ``m`` tokens does ``2·m·d_in·d_out`` FLOPs and moves its weight
(``d_in·d_out`` elements) plus its input and output (``m·(d_in + d_out)``). Prefill has ``m`` = batch × prompt
length, in the hundreds or thousands: far right of the ridge. A decode step has ``m`` = batch, 1 at batch 1: about
one FLOP per byte of a bf16 weight, hundreds of times below an H100's or H200's ridge. So a decode step's time
is the bytes it reads — every weight once, and the KV cache — divided by the bandwidth; *MBU*
(memory-bandwidth utilisation) is how close a step comes to that: ``bytes read / step time / peak bytes/s``.
It is to decoding what MFU (notebook 07) is to training.

As the batch grows, one read of the weights serves more tokens: decoding stays memory-bound, and tokens/s grows
about linearly with the batch, until the intensity reaches the ridge — the *knee*, at a batch of about
``ridge × bytes per weight / 2`` (the KV cache, which every sequence reads for itself, moves it later).
"""

from __future__ import annotations

import torch
from torch import nn

from ..memory.planner import parameter_count
from ..models import GPT, GPTConfig

__all__ = ["decode_step_bytes", "knee_batch", "linear_intensity", "mbu", "model_step_bytes", "ridge_point",
           "roofline_seconds", "weight_bytes"]


def linear_intensity(tokens: int, d_in: int, d_out: int, bytes_per_element: int) -> float:
    """FLOPs per byte of a linear layer ``d_in → d_out`` over ``tokens`` rows: weight, input and output moved once."""
    flops = 2 * tokens * d_in * d_out
    moved = (d_in * d_out + tokens * (d_in + d_out)) * bytes_per_element
    return flops / moved


def ridge_point(peak_flops: float, peak_bytes_per_s: float) -> float:
    """The intensity (FLOPs per byte) where the roofline bends: below it memory limits, above it arithmetic."""
    return peak_flops / peak_bytes_per_s


def roofline_seconds(flops: float, moved: float, peak_flops: float, peak_bytes_per_s: float) -> float:
    """The least time of work of ``flops`` FLOPs and ``moved`` bytes on a machine of these peaks."""
    return max(flops / peak_flops, moved / peak_bytes_per_s)


def decode_step_bytes(cfg: GPTConfig, batch: int, cache_len: int, bytes_per_weight: float = 2.0,
                      cache_bytes_per_element: int = 2) -> float:
    """Bytes one decode step of the course's GPT reads, every weight stored in ``bytes_per_weight`` bytes: each
    weight once, less the two embedding tables, of which a step reads one row per sequence, plus the keys and
    values of ``cache_len`` positions of every block for each of the ``batch`` sequences (``cache_len`` is what
    the attention reads: the whole static cache when a mask, not a slice, hides the empty slots)."""
    embeddings = (cfg.vocab + cfg.seq_len) * cfg.d_model  # tables read one row per token: left out
    rows = batch * 2 * cfg.d_model
    cache = 2 * cfg.n_layers * batch * cache_len * cfg.d_model * cache_bytes_per_element
    return bytes_per_weight * (parameter_count(cfg) - embeddings + rows) + cache


def _stored_bytes(t: torch.Tensor) -> int:
    """Bytes a tensor really holds. A tensor subclass (torchao's quantized weights) reports the dtype it stands
    for (bf16), not what it stores: its inner tensors are counted instead."""
    if type(t) not in (torch.Tensor, nn.Parameter) and hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        return sum(_stored_bytes(getattr(t, name)) for name in names)
    return t.numel() * t.element_size()


def weight_bytes(model: nn.Module) -> int:
    """Bytes of everything the model stores, as stored: parameters and buffers (int8 weights and their scales,
    torchao's packed ones)."""
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    return sum(_stored_bytes(t) for t in tensors.values())


def model_step_bytes(model: GPT, batch: int, cache_len: int) -> float:
    """`decode_step_bytes` of a built model, whatever each weight's storage: `weight_bytes` less the embedding
    tables plus the rows a step reads, and the cache, in the model's dtype as `kv_cache`'s caches are."""
    cfg = model.cfg
    tables = _stored_bytes(model.tok.weight) + _stored_bytes(model.pos.weight)
    row = model.tok.weight.element_size() * cfg.d_model
    cache = 2 * cfg.n_layers * batch * cache_len * cfg.d_model * row // cfg.d_model
    return weight_bytes(model) - tables + batch * 2 * row + cache


def mbu(moved: float, seconds: float, peak_bytes_per_s: float) -> float:
    """Memory-bandwidth utilisation of a step that reads ``moved`` bytes in ``seconds``: a fraction of the peak."""
    if seconds <= 0 or peak_bytes_per_s <= 0:
        raise ValueError(f"mbu: seconds and peak bytes/s must be positive, got {seconds} and {peak_bytes_per_s}")
    return moved / seconds / peak_bytes_per_s


def knee_batch(peak_flops: float, peak_bytes_per_s: float, bytes_per_weight: float) -> float:
    """The batch at which a decode step's weight reads stop limiting it: 2·batch FLOPs per weight against
    ``bytes_per_weight`` bytes reach the ridge (the KV cache left out: it moves the knee to larger batches)."""
    return ridge_point(peak_flops, peak_bytes_per_s) * bytes_per_weight / 2
