"""Notebook 09 (when it breaks): memory that grows every step, measured on any device, the CPU included.

A training loop leaks when something keeps an autograd graph alive after its step: a running sum of
``loss`` tensors, a list of outputs, an evaluation run without ``torch.no_grad()``. What such a graph holds
is the tensors autograd saved for its backward pass. `graph_memory` counts those while they live:

    with graph_memory(exclude=model) as meter:
        for x, y in batches:
            ...                        # forward, backward, step
            print(meter.alive_bytes())  # saved tensors of graphs still alive, in bytes

On a GPU, ``torch.cuda.memory_allocated()`` after each step shows the same growth (and everything else the
step allocates); this meter needs no GPU and counts only what graphs hold.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = ["GraphMeter", "graph_memory", "graph_nodes"]


class _Saved:
    """What autograd stores for one saved tensor while the meter is on: the tensor's memory, in a Python
    object that lives exactly as long as the graph node that saved it."""

    __slots__ = ("__weakref__", "tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


@dataclass
class GraphMeter:
    """The tensors saved for backward by graphs made while the meter was on, and which of them live on."""

    skip: set[int] = field(default_factory=set)
    saved: weakref.WeakSet[_Saved] = field(default_factory=weakref.WeakSet)
    packed: int = 0
    """How many tensors were saved for backward while the meter was on, alive or not."""

    def pack(self, tensor: torch.Tensor) -> _Saved:
        self.packed += 1
        # detached: the same memory without the graph. The tensor itself would point back, through its
        # grad_fn, at the node that holds this object: a cycle that would keep the graph alive.
        holder = _Saved(tensor.detach())
        self.saved.add(holder)
        return holder

    @staticmethod
    def unpack(holder: _Saved) -> torch.Tensor:
        return holder.tensor

    def alive_bytes(self) -> int:
        """Bytes of the saved tensors that graphs still hold (each storage once; parameters left out)."""
        storages: dict[tuple[str, int], int] = {}
        for holder in list(self.saved):
            storage = holder.tensor.untyped_storage()
            if storage.data_ptr() not in self.skip:
                storages[(str(holder.tensor.device), storage.data_ptr())] = storage.nbytes()
        return sum(storages.values())


@contextmanager
def graph_memory(exclude: nn.Module | None = None) -> Iterator[GraphMeter]:
    """Count, while the block runs, the tensors autograd saves for backward, and let
    `GraphMeter.alive_bytes` say how many bytes of them are still held. ``exclude``'s parameters and
    buffers (which ``linear`` saves for its backward) are left out: the model holds them anyway."""
    meter = GraphMeter()
    if exclude is not None:
        meter.skip = {t.untyped_storage().data_ptr() for t in [*exclude.parameters(), *exclude.buffers()]}
    with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
        yield meter


def graph_nodes(*tensors: torch.Tensor) -> int:
    """How many autograd nodes the graphs behind ``tensors`` hold (each node once). A node outlives the
    backward pass that freed its saved tensors for as long as a tensor made from it is kept."""
    seen: set[object] = set()
    stack: list[Any] = [t.grad_fn for t in tensors if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return len(seen)
