"""Notebook 10: generating tokens with the course's GPT — prefill, decode and a static KV cache.

A GPT predicts the next token from every token before it. Generated naively, token n+1 runs the whole model
over all n tokens again (`generate_by_recomputing`): the work of one token grows with the prefix, and all of it
but the last position was done before. A KV cache keeps what each block computed for earlier positions, the
keys and values of its attention, so that a new token needs one pass over *one* position:

- **prefill**: the prompt's t positions in one pass (matrix-matrix products), filling the cache;
- **decode**: then one token per step (matrix-vector products at batch 1): each step reads every weight and
  the cache once, and does two FLOPs per weight — memory-bound (`course_utils.inference.roofline`).

The cache here is **static**: allocated once for ``max_len`` positions, written in place at the positions
given as a *tensor*, and read whole under a mask that hides the slots not written yet. Every decode step has
the same shapes and the same Python control flow, so ``torch.compile`` compiles it once and CUDA graphs can
replay it (the design of PyTorch's gpt-fast). A cache that grows (``torch.cat`` per step) changes shape every
step: a new compilation per length, and a new allocation per step.

Its memory: keys and values, per block, per sequence, per position, ``d_model`` numbers each —
``2 · n_layers · batch · max_len · d_model · bytes per element`` (`kv_cache_bytes`).
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from ..models import GPT, Block, GPTConfig

__all__ = ["StaticKVCache", "forward_with_cache", "generate", "generate_by_recomputing", "kv_cache_bytes"]


def kv_cache_bytes(cfg: GPTConfig, batch: int, max_len: int, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of a KV cache for ``batch`` sequences of up to ``max_len`` positions: keys and values (2), per block,
    per sequence, per position, ``d_model`` elements (all heads together)."""
    if batch < 1 or max_len < 1:
        raise ValueError(f"kv_cache_bytes: batch and max_len must be at least 1, got {batch} and {max_len}")
    return 2 * cfg.n_layers * batch * max_len * cfg.d_model * torch.empty((), dtype=dtype).element_size()


class StaticKVCache(nn.Module):
    """Keys and values of every block for ``batch`` sequences of up to ``max_len`` positions, preallocated.

    ``k`` and ``v`` have the shape ``(n_layers, batch, n_heads, max_len, head_dim)``: the layout attention reads
    (heads before positions). Buffers, not parameters: they move with ``.to()`` and are not trained. They start
    as zeros, not ``torch.empty``'s leftovers: the mask gives an empty slot zero weight, but zero times a NaN or
    an infinity left in memory is NaN, and it would reach every logit."""

    k: torch.Tensor
    v: torch.Tensor

    def __init__(self, cfg: GPTConfig, batch: int, max_len: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> None:
        super().__init__()
        if not 1 <= max_len <= cfg.seq_len:
            raise ValueError(f"StaticKVCache: max_len must be between 1 and the model's seq_len ({cfg.seq_len}): "
                             f"its position embedding has no row beyond that; got {max_len}")
        shape = (cfg.n_layers, batch, cfg.n_heads, max_len, cfg.d_model // cfg.n_heads)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.max_len = max_len

    def update(self, layer: int, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new keys and values (``(batch, heads, t, head_dim)``) of block ``layer`` at positions ``pos``
        (a tensor of t indices), in place; return the block's whole cache, written slots and empty ones."""
        self.k[layer].index_copy_(2, pos, k)
        self.v[layer].index_copy_(2, pos, v)
        return self.k[layer], self.v[layer]


def _block_with_cache(block: Block, x: torch.Tensor, layer: int, pos: torch.Tensor, mask: torch.Tensor,
                      cache: StaticKVCache) -> torch.Tensor:
    """`Block.forward` for the new positions only: their queries attend to the cached keys and values."""
    b, t, d = x.shape
    q, k, v = block.qkv(block.norm1(x)).view(b, t, 3, block.n_heads, d // block.n_heads).unbind(2)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    k_all, v_all = cache.update(layer, pos, k, v)
    attn = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask)
    x = x + block.proj(attn.transpose(1, 2).reshape(b, t, d))
    return x + block.mlp(block.norm2(x))


def forward_with_cache(model: GPT, tokens: torch.Tensor, pos: torch.Tensor, cache: StaticKVCache,
                       last_only: bool = False) -> torch.Tensor:
    """Logits ``(batch, t, vocab)`` of ``tokens`` ``(batch, t)`` standing at positions ``pos`` (t indices, a
    tensor), every earlier position read from ``cache``, which this call fills at ``pos``; ``last_only``: the
    last position's logits only, ``(batch, 1, vocab)`` — all that generating needs, and a prefill then skips
    the head's product over every prompt position.

    Prefill is ``pos = arange(t)``; a decode step is one position, ``pos = tensor([n])``. Position p may
    attend to cache slots 0…p (the causal mask, over the whole cache: a static shape). Every sequence of the
    batch stands at the same positions: prompts of one length."""
    if pos.dim() != 1 or pos.numel() != tokens.shape[1]:
        raise ValueError(f"forward_with_cache: pos must hold one position per token ({tokens.shape[1]}), "
                         f"got a tensor of shape {tuple(pos.shape)}")
    if pos.dtype != torch.long:
        raise ValueError(f"forward_with_cache: pos must be int64 (torch.long), got {pos.dtype}: the cache is "
                         "written with index_copy_, which takes long indices (torch.arange(n) makes them)")
    if cache.k.dtype != model.tok.weight.dtype:
        raise ValueError(f"forward_with_cache: a {cache.k.dtype} cache for a {model.tok.weight.dtype} model: give "
                         "the cache the model's dtype (a cast would copy the whole cache at every step)")
    slots = torch.arange(cache.max_len, device=pos.device)
    mask = slots[None, :] <= pos[:, None]  # (t, max_len): True where a query may look
    x = model.tok(tokens) + model.pos(pos)
    for layer, block in enumerate(model.blocks):
        x = _block_with_cache(cast(Block, block), x, layer, pos, mask, cache)
    return model.head(model.norm(x[:, -1:] if last_only else x))


@torch.inference_mode()
def generate(model: GPT, prompt: torch.Tensor, new_tokens: int, cache: StaticKVCache | None = None,
             step: object = None) -> torch.Tensor:
    """Greedy generation with a static KV cache: prefill ``prompt`` ``(batch, t)``, then ``new_tokens`` decode
    steps of one token each; returns ``(batch, t + new_tokens)``. ``cache`` defaults to one just large enough
    (the model's dtype, on the prompt's device). ``step`` replaces `forward_with_cache` for the decode steps (a compiled
    version of it, for instance), called with the same arguments."""
    batch, t = prompt.shape
    if cache is None:
        cache = StaticKVCache(model.cfg, batch, t + new_tokens, dtype=model.tok.weight.dtype, device=prompt.device)
    if t + new_tokens > cache.max_len:
        raise ValueError(f"generate: {t} prompt tokens + {new_tokens} new ones do not fit a cache of "
                         f"{cache.max_len} positions")
    decode = step or forward_with_cache
    logits = forward_with_cache(model, prompt, torch.arange(t, device=prompt.device), cache, last_only=True)
    out = [prompt, logits[:, -1:].argmax(-1)]
    pos = torch.tensor([t], device=prompt.device)  # a tensor: the same graph for every position
    for _ in range(new_tokens - 1):
        logits = decode(model, out[-1], pos, cache)  # type: ignore[operator]
        out.append(logits[:, -1:].argmax(-1))
        pos += 1  # on the device: no copy from the host, which would wait for the GPU every step
    return torch.cat(out, dim=1)[:, :t + new_tokens]


@torch.inference_mode()
def generate_by_recomputing(model: GPT, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy generation without a cache: every step runs the model over the whole sequence so far and keeps
    only the last position's prediction. The reference `generate` must equal."""
    tokens = prompt
    for _ in range(new_tokens):
        next_token = model(tokens)[:, -1:].argmax(-1)
        tokens = torch.cat([tokens, next_token], dim=1)
    return tokens
