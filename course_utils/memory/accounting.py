"""Notebook 07 (and 08): where a training step's memory goes.

- `saved_tensor_bytes`: the bytes autograd keeps for the backward pass (the activations), counted with
  ``torch.autograd.graph.saved_tensors_hooks`` while a function runs. Works on any device, CPU included:
  each saved storage is counted once, and parameters (which autograd also saves) are left out.
- `allocation_timeline`: from a CUDA memory snapshot (``torch.cuda.memory._snapshot()`` after
  ``torch.cuda.memory._record_memory_history()``), the allocated bytes after every recorded event.
- `plot_memory_timeline`: that timeline drawn with matplotlib, with named phases shaded.
- `CpuAllocations`: the bytes the CPU allocator holds at named moments of a ``with`` block, and the most it
  held before each, from the profiler's memory events (``profile_memory=True``): ``memory_allocated`` and
  ``max_memory_allocated`` for a machine without a GPU.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from matplotlib.figure import Figure
from torch import nn

__all__ = ["CpuAllocations", "allocation_timeline", "plot_memory_timeline", "saved_tensor_bytes"]


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


@contextmanager
def _no_native_stderr() -> Iterator[None]:
    """Silence what C++ code writes to file descriptor 2 meanwhile: the profiler's "profiler_start" and
    "profiler_stop" log lines, which say nothing about the measurement."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


class CpuAllocations:
    """What the CPU allocator holds during a ``with`` block, counted from its start::

        with CpuAllocations() as cpu:
            y = f(x)
            cpu.mark("after f")
        cpu.at["after f"], cpu.peak["after f"]  # bytes held then; the most held since the previous mark

    PyTorch's profiler, with ``profile_memory=True``, records every CPU allocation and free with the running
    total; `mark` allocates a marker tensor of an odd size (left out of the counts) to find the moment
    again. ``at["end"]`` and ``peak["end"]`` describe the end of the block. Profiling slows the block down:
    measure small models."""

    MARKER = 7_777_777  # bytes: the marker tensors are this size plus their number

    def __init__(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        self.names: list[str] = []
        self.at: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self._profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)

    def __enter__(self) -> CpuAllocations:
        with _no_native_stderr():
            self._profiler.__enter__()
        return self

    def mark(self, name: str) -> None:
        """Note this moment as ``name`` (each name once)."""
        if name in self.names or name == "end":
            raise ValueError(f"the mark {name!r} is taken: give each moment its own name")
        self.names.append(name)
        torch.empty(self.MARKER + len(self.names), dtype=torch.uint8)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        with _no_native_stderr():
            self._profiler.__exit__(kind, error, tb)
        if kind is not None:
            return
        with tempfile.TemporaryDirectory() as folder:
            trace = Path(folder) / "trace.json"
            self._profiler.export_chrome_trace(str(trace))
            events = json.loads(trace.read_text(encoding="utf-8"))["traceEvents"]
        # in time order, across threads (gloo's threads allocate too): the running total is process-wide
        memory = [e["args"] for e in sorted((e for e in events if e.get("name") == "[memory]"),
                                            key=lambda e: (e["ts"], e["args"].get("Ev Idx", 0)))]
        # the profiler's total runs on across profiling sessions: count from where it stood when this began
        before = memory[0]["Total Allocated"] - memory[0]["Bytes"] if memory else 0
        totals = [(a["Bytes"], a["Total Allocated"] - before) for a in memory]
        marks = [i for i, (nbytes, _) in enumerate(totals) if self.MARKER < nbytes <= self.MARKER + len(self.names)]
        if len(marks) != len(self.names):
            raise RuntimeError(f"the profiler recorded {len(marks)} of the {len(self.names)} marks")
        start, level = 0, 0
        for name, i in [*zip(self.names, marks, strict=True), ("end", len(totals))]:
            # from the level at the previous mark, through the events up to this mark's allocation
            window = [total for nbytes, total in totals[start:i] if not self._is_marker(nbytes)]
            self.at[name] = totals[i - 1][1] if i else 0
            self.peak[name] = max([level, *window])
            start, level = i + 1, self.at[name]

    def _is_marker(self, nbytes: int) -> bool:
        return self.MARKER < abs(nbytes) <= self.MARKER + len(self.names)
