"""Notebook 10: an eager decode step captured in a CUDA graph and replayed — launches removed, nothing compiled.

At batch 1 a decode step of a large model launches hundreds of small kernels; eagerly, Python launches each
one, and the GPU waits whenever the host falls behind (notebook 07, section 4, shows CUDA graphs on a training
step). A decode step has the same shapes every time (the static KV cache of `course_utils.inference.kv_cache`,
the position a tensor), so it can be recorded once with ``torch.cuda.graph`` and replayed with one launch:
the same kernels as eager, without the host between them. The graph reads and writes fixed addresses, so each
call copies its token and position into the graph's own input tensors first; the logits it returns are the
graph's output tensor, overwritten by the next replay.

`GraphedStep` is a drop-in ``step`` for `course_utils.inference.kv_cache.generate` and
`course_utils.inference.decode_timing.seconds_per_step`: one graph per model, cache and batch size. It keeps
each model and cache it captured alive (a graph replays on their memory): make a new one for new models.
"""

from __future__ import annotations

import torch

from ..models import GPT
from .kv_cache import StaticKVCache, forward_with_cache

__all__ = ["GraphedStep"]


class GraphedStep:
    """``step(model, token, pos, cache)``: `forward_with_cache` for one decode position, captured in a CUDA graph
    at its first call for this model, cache and batch, replayed at every call after."""

    def __init__(self) -> None:
        self._graphs: dict[tuple[int, int, tuple[int, ...]],
                           tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._kept: list[tuple[GPT, StaticKVCache]] = []  # their ids are the keys: never freed and reused

    def __call__(self, model: GPT, token: torch.Tensor, pos: torch.Tensor, cache: StaticKVCache) -> torch.Tensor:
        if token.device.type != "cuda":
            raise ValueError(f"GraphedStep: CUDA graphs need the model and its inputs on a CUDA GPU, got "
                             f"{token.device}; step with forward_with_cache instead")
        key = (id(model), id(cache), tuple(token.shape))
        if key not in self._graphs:
            self._graphs[key] = self._capture(model, token.clone(), pos.clone(), cache)
            self._kept.append((model, cache))
        graph, static_token, static_pos, logits = self._graphs[key]
        static_token.copy_(token)
        static_pos.copy_(pos)
        graph.replay()
        return logits

    @staticmethod
    def _capture(model: GPT, token: torch.Tensor, pos: torch.Tensor, cache: StaticKVCache
                 ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor, torch.Tensor]:
        side = torch.cuda.Stream()  # warm up on a side stream, as torch.cuda.graph's documentation asks
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                forward_with_cache(model, token, pos, cache)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = forward_with_cache(model, token, pos, cache)
        return graph, token, pos, logits
