"""Notebook 07 (and 08): where a training step's memory goes.

- `saved_tensor_bytes`: the bytes autograd keeps for the backward pass (the activations), counted with
  ``torch.autograd.graph.saved_tensors_hooks`` while a function runs. Works on any device, CPU included:
  each saved storage is counted once, and parameters (which autograd also saves) are left out.
- `allocation_timeline`: from a CUDA memory snapshot (``torch.cuda.memory._snapshot()`` after
  ``torch.cuda.memory._record_memory_history()``), the allocated bytes after every recorded event.
- `plot_memory_timeline`: that timeline drawn with matplotlib, with named phases shaded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from matplotlib.figure import Figure
from torch import nn

__all__ = ["allocation_timeline", "plot_memory_timeline", "saved_tensor_bytes"]


def saved_tensor_bytes(fn: Callable[[], Any], exclude: nn.Module | None = None) -> tuple[Any, int]:
    """Run ``fn()`` and return ``(its result, bytes of the tensors autograd saved for backward)``.

    A storage saved by several operations (a view, the same input twice) counts once. Storages of
    ``exclude``'s parameters and buffers (weights saved by ``linear`` for its backward) do not count:
    they are memory the model has anyway, not activations."""
    if not callable(fn):
        raise TypeError(f"saved_tensor_bytes() needs a function of no arguments, got {type(fn).__name__}")
    skip = set()
    if exclude is not None:
        skip = {t.untyped_storage().data_ptr() for t in [*exclude.parameters(), *exclude.buffers()]}
    seen: dict[tuple[str, int], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        key = (str(t.device), storage.data_ptr())
        if storage.data_ptr() not in skip and storage.nbytes() > 0:
            seen[key] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = fn()
    return result, sum(seen.values())


def allocation_timeline(snapshot: dict[str, Any], device: int = 0, start_bytes: int = 0) -> list[int]:
    """Allocated bytes after each event of ``snapshot``'s trace for ``device``: ``alloc`` adds its size,
    ``free_completed`` subtracts it. ``start_bytes`` is what was allocated when recording began
    (``torch.cuda.memory_allocated()`` then), since the trace only sees what came after."""
    traces = snapshot.get("device_traces") if isinstance(snapshot, dict) else None
    if not isinstance(traces, list):
        raise ValueError("not a memory snapshot: expected a dict with 'device_traces', as returned by "
                         "torch.cuda.memory._snapshot() after torch.cuda.memory._record_memory_history()")
    if not 0 <= device < len(traces):
        raise ValueError(f"the snapshot has traces for {len(traces)} device(s); device {device} is not one")
    level, out = start_bytes, []
    for event in traces[device]:
        action, size = event.get("action"), int(event.get("size", 0))
        if action == "alloc":
            level += size
        elif action == "free_completed":
            level -= size
        out.append(level)
    return out


def plot_memory_timeline(timeline: Sequence[int], phases: Sequence[tuple[str, int, int]] = (),
                         title: str = "allocated memory") -> Figure:
    """Draw ``timeline`` (bytes after each event) in GiB; each ``(name, first_event, end_event)`` of
    ``phases`` is shaded and labelled."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 3.6))
    ax.plot(range(len(timeline)), [b / 2**30 for b in timeline], color="#2e86c1", lw=1.2)
    colours = ["#f9e79f", "#d5f5e3", "#fadbd8", "#d6eaf8", "#e8daef", "#fdebd0"]
    top = max(timeline, default=0) / 2**30
    for i, (name, start, end) in enumerate(phases):
        ax.axvspan(start, end, color=colours[i % len(colours)], alpha=0.8, lw=0)
        ax.text((start + end) / 2, top * 1.02, name, ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, top * 1.15 if top else 1)
    ax.set_xlabel("allocator event")
    ax.set_ylabel("allocated (GiB)")
    ax.set_title(title)
    fig.tight_layout()
    return fig
