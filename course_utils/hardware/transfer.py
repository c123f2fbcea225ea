"""Notebook 02 (moving data): host↔device transfer bandwidth, the sweep behind its pinned-memory plot;
appendix notebook 90 checks `measure_transfer` against a raw probe.

What is timed, and how
----------------------
Each measurement copies ``nbytes`` bytes into a destination tensor allocated **beforehand**, with
``dst.copy_(src, non_blocking=...)``, and times that call with `course_utils.benchmark` (CUDA events on
the current stream around a batch of back-to-back copies, after a warm-up; the median of the samples).
So the figure is the copy alone: no allocation of the destination, no page faults on first touch (the
host buffers are filled before timing), no Python-side ``.to()`` bookkeeping. That is the same thing a raw
probe measures when it records two CUDA events around ``dst.copy_(src)``, so on one host the two agree
within a few percent (notebook 02 prints both side by side).

- ``non_blocking`` defaults to ``True`` for pinned host memory (how it is used in practice: the call
  returns at once and the copy engine works on its own) and ``False`` for pageable memory (where
  PyTorch stages the data through a pinned buffer and waits for it anyway). The GPU time of the copy is
  the same either way; only when the host call returns differs.
- Bandwidth is in decimal units: ``GB/s`` means 10⁹ bytes per second. Sizes are powers of two and are
  labelled in KiB, MiB, GiB.

Notebook cells show the calls being taught (``pin_memory()``, ``.to(device, non_blocking=True)``);
this module only holds the loops, the table and the plot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

import torch

from ..devices import get_device
from ..formatting import format_bytes
from ..timing import Timing, benchmark

__all__ = [
    "DIRECTIONS",
    "MEMORIES",
    "TransferResult",
    "bandwidth_sweep",
    "host_buffer",
    "measure_transfer",
    "plot_bandwidth",
    "results_table",
    "transfer_buffers",
    "transfer_sizes",
]

DIRECTIONS = ("h2d", "d2h")
"""``'h2d'``: host (CPU) memory → device; ``'d2h'``: device → host."""
MEMORIES = ("pageable", "pinned")
"""Kinds of host memory: ordinary (pageable) or page-locked (pinned)."""
_LABELS = {"h2d": "host → device", "d2h": "device → host"}


def transfer_sizes(max_bytes: int = 1 << 30, min_bytes: int = 4 << 10, factor: int = 4) -> list[int]:
    """Sizes from ``min_bytes`` up to ``max_bytes`` (both included when on the grid), ×``factor`` each step.

    The default is 4 KiB, 16 KiB, … 256 MiB, 1 GiB: ten sizes.
    """
    if min_bytes < 1 or max_bytes < min_bytes or factor < 2:
        raise ValueError(f"transfer_sizes(): need 1 <= min_bytes <= max_bytes and factor >= 2, got "
                         f"min_bytes={min_bytes}, max_bytes={max_bytes}, factor={factor}")
    sizes = [min_bytes]
    while sizes[-1] * factor <= max_bytes:
        sizes.append(sizes[-1] * factor)
    return sizes


def _check(direction: str, memory: str) -> None:
    if direction not in DIRECTIONS:
        raise ValueError(f"direction {direction!r}: use 'h2d' (host → device) or 'd2h' (device → host)")
    if memory not in MEMORIES:
        raise ValueError(f"memory {memory!r}: use 'pageable' or 'pinned' (page-locked host memory)")


def host_buffer(nbytes: int, pinned: bool) -> torch.Tensor:
    """A host (CPU) byte tensor of ``nbytes`` bytes, filled so every page is really allocated.

    ``pinned=True`` needs CUDA or another accelerator: pinned memory is registered with the device driver.
    """
    try:
        buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
    except RuntimeError as exc:
        if pinned:
            raise RuntimeError("pinned (page-locked) host memory needs CUDA or another accelerator, and "
                               f"this PyTorch has none available ({exc}). Use memory='pageable', or run "
                               "on a GPU machine.") from None
        raise
    buf.fill_(1)  # touch every page: first-touch page faults are not part of a copy
    return buf


def transfer_buffers(direction: str, nbytes: int, memory: str,
                     device: str | torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(src, dst)`` for one transfer: a host buffer of the given ``memory`` kind and a device buffer."""
    _check(direction, memory)
    dev = get_device(device)
    host = host_buffer(nbytes, pinned=(memory == "pinned"))
    on_device = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    if direction == "h2d":
        return host, on_device
    on_device.fill_(1)
    return on_device, host


@dataclass(frozen=True)
class TransferResult:
    """One measured transfer: what was copied, and the `Timing` of one copy."""

    direction: str
    memory: str
    nbytes: int
    non_blocking: bool
    timing: Timing

    @property
    def seconds(self) -> float:
        """Median seconds per copy."""
        return self.timing.median

    @property
    def gbps(self) -> float:
        """Bandwidth in GB/s (10⁹ bytes per second), from the median time."""
        return self.nbytes / self.timing.median / 1e9

    def __str__(self) -> str:
        return (f"{_LABELS[self.direction]}, {self.memory}, {format_bytes(self.nbytes)}: "
                f"{self.gbps:.3g} GB/s")


def measure_transfer(direction: str, nbytes: int, memory: str, device: str | torch.device,
                     non_blocking: bool | None = None, **bench: Any) -> TransferResult:
    """Time ``dst.copy_(src, non_blocking=...)`` for one direction, size and kind of host memory.

    ``non_blocking=None`` means True for pinned memory and False for pageable. Other keyword arguments go
    to `course_utils.benchmark` (``repeat``, ``warmup``, ``min_sample_time``...).
    """
    _check(direction, memory)
    if non_blocking is None:
        non_blocking = memory == "pinned"
    dev = get_device(device)
    src, dst = transfer_buffers(direction, nbytes, memory, dev)
    timing = benchmark(dst.copy_, src, non_blocking=non_blocking, device=dev, **bench)
    return TransferResult(direction, memory, nbytes, non_blocking, timing)


def bandwidth_sweep(device: str | torch.device, sizes: Iterable[int] | None = None,
                    directions: Sequence[str] = DIRECTIONS, memories: Sequence[str] = MEMORIES,
                    progress: Callable[[TransferResult], None] | None = None,
                    **bench: Any) -> list[TransferResult]:
    """`measure_transfer` for every size × direction × memory kind; ``progress`` is called after each.

    Buffers are made for one measurement at a time and freed after it, so the peak is about two copies of
    the largest size (one on the host, one on the device).
    """
    sizes = list(transfer_sizes() if sizes is None else sizes)
    for d in directions:
        for m in memories:
            _check(d, m)
    results = []
    for nbytes in sizes:
        for direction in directions:
            for memory in memories:
                result = measure_transfer(direction, nbytes, memory, device, **bench)
                results.append(result)
                if progress is not None:
                    progress(result)
    return results


def results_table(results: Sequence[TransferResult]) -> str:
    """A text table: one row per size, one column of GB/s per (direction, memory) measured."""
    columns = sorted({(r.direction, r.memory) for r in results},
                     key=lambda c: (DIRECTIONS.index(c[0]), MEMORIES.index(c[1])))
    by_key = {(r.nbytes, r.direction, r.memory): r for r in results}
    heads = [f"{d.upper()} {m}" for d, m in columns]
    lines = [f"{'size':>9} " + " ".join(f"{h:>13}" for h in heads) + "   (GB/s)"]
    for nbytes in sorted({r.nbytes for r in results}):
        cells = []
        for d, m in columns:
            r = by_key.get((nbytes, d, m))
            cells.append(f"{r.gbps:13.3g}" if r is not None else f"{'-':>13}")
        lines.append(f"{format_bytes(nbytes):>9} " + " ".join(cells))
    return "\n".join(lines)


def plot_bandwidth(results: Sequence[TransferResult], title: str | None = None) -> Figure:
    """Bandwidth (GB/s) against transfer size (log scale), one line per direction and memory kind.

    Returns the matplotlib Figure (not shown by itself when the caller displays it).
    """
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    styles = {"pageable": "--", "pinned": "-"}
    colours = {"h2d": "tab:blue", "d2h": "tab:orange"}
    for direction in DIRECTIONS:
        for memory in MEMORIES:
            rows = sorted((r for r in results if r.direction == direction and r.memory == memory),
                          key=lambda r: r.nbytes)
            if rows:
                ax.plot([r.nbytes for r in rows], [r.gbps for r in rows], styles[memory], marker="o",
                        color=colours[direction], label=f"{_LABELS[direction]}, {memory}")
    sizes = sorted({r.nbytes for r in results})
    ax.set_xscale("log", base=2)
    if sizes:
        ax.set_xticks(sizes, [format_bytes(s) for s in sizes], rotation=45)
    ax.set_xlabel("transfer size")
    ax.set_ylabel("bandwidth (GB/s)")
    ax.set_title(title or "Host ↔ device copies: pageable vs pinned host memory")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig
