"""Notebook 04 (DataParallel): how DataParallel cuts a batch into chunks, and the pictures of its steps.

The four steps themselves (scatter, replicate, parallel apply, gather) are written out in the notebook's
own cells, as the lesson; this module only holds what the notebook would otherwise have to hide:

- `chunk_sizes`: the chunk sizes ``torch.chunk`` (and so DataParallel's scatter) makes of a batch, used
  by the batch-split picture and by the exercise checkers;
- `plot_batch_split`: which samples of a batch each GPU gets, idle GPUs greyed;
- `plot_mechanism`: the four steps of the forward pass and the summed gradients of the backward pass.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["chunk_sizes", "plot_batch_split", "plot_mechanism"]


def chunk_sizes(batch_size: int, n_devices: int) -> list[int]:
    """Sizes of the chunks DataParallel makes of a batch of ``batch_size`` on ``n_devices`` GPUs.

    Same rule as ``torch.chunk``: every chunk has ``ceil(batch / n)`` samples except perhaps the last, so
    there may be fewer chunks (and replicas) than devices: ``chunk_sizes(9, 4) == [3, 3, 3]``,
    ``chunk_sizes(10, 8) == [2, 2, 2, 2, 2]``.
    """
    if not isinstance(batch_size, int) or not isinstance(n_devices, int):
        raise TypeError(f"chunk_sizes(batch_size, n_devices) takes two ints, got {batch_size!r}, {n_devices!r}")
    if n_devices < 1:
        raise ValueError(f"chunk_sizes(): n_devices must be at least 1, got {n_devices}")
    if batch_size < 0:
        raise ValueError(f"chunk_sizes(): batch_size must be >= 0, got {batch_size}")
    if batch_size == 0:
        return [0] * n_devices  # torch.chunk of an empty dimension: n empty chunks
    size = math.ceil(batch_size / n_devices)
    return [min(size, batch_size - start) for start in range(0, batch_size, size)]


# ---------------------------------------------------------------------------------------- pictures
_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def plot_batch_split(batch_size: int = 16, n_gpus: int = 4) -> Figure:
    """A matplotlib Figure: which samples of a batch each GPU gets (``chunk_sizes``), idle GPUs greyed."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    sizes = chunk_sizes(batch_size, n_gpus)
    used = len(sizes) if batch_size else 0
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.42 * n_gpus))
    width = max(batch_size, 1)
    start = 0
    for g in range(n_gpus):
        y = n_gpus - 1 - g
        if g < used:
            colour = _COLOURS[g % len(_COLOURS)]
            for s in range(start, start + sizes[g]):
                ax.add_patch(Rectangle((s, y + 0.1), 0.92, 0.8, color=colour))
            ax.text(width + 0.3, y + 0.5, f"{sizes[g]} samples", va="center", fontsize=9)
            start += sizes[g]
        else:
            ax.add_patch(Rectangle((0, y + 0.1), width, 0.8, facecolor="#eeeeee", edgecolor="#bbbbbb",
                                   hatch="//"))
            ax.text(width / 2, y + 0.5, "idle: no chunk, no replica", ha="center", va="center",
                    fontsize=9, color="#777777")
    ax.set_xlim(0, width + 3.5)
    step = max(1, math.ceil(width / 8))
    ax.set_xticks(range(0, width + 1, step))
    ax.set_ylim(0, n_gpus)
    ax.set_yticks([n_gpus - 1 - g + 0.5 for g in range(n_gpus)], [f"GPU {g}" for g in range(n_gpus)])
    ax.set_xlabel("sample index in the batch")
    ax.set_title(f"batch of {batch_size} on {n_gpus} GPUs: chunks {sizes}, {used} replica(s) run")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


def plot_mechanism(n_gpus: int = 3) -> Figure:
    """A matplotlib Figure of DataParallel's forward (scatter, replicate, parallel apply, gather) and
    backward (gradients summed back onto GPU 0's parameters)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    fig, ax = plt.subplots(figsize=(10, 1.2 + 1.1 * n_gpus))
    ax.set_xlim(0, 10)
    ax.set_ylim(-0.9, n_gpus + 0.4)
    ax.axis("off")

    def box(x: float, y: float, text: str, colour: str, w: float = 1.6) -> None:
        ax.add_patch(FancyBboxPatch((x - w / 2, y - 0.3), w, 0.6, boxstyle="round,pad=0.05",
                                    facecolor=colour, edgecolor="#333333"))
        ax.text(x, y, text, ha="center", va="center", fontsize=8.5)

    def arrow(x0: float, y0: float, x1: float, y1: float, colour: str = "#333333", style: str = "-") -> None:
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                    arrowprops={"arrowstyle": "->", "color": colour, "linestyle": style, "lw": 1.3})

    mid = (n_gpus - 1) / 2
    ys = [n_gpus - 1 - g for g in range(n_gpus)]
    box(0.9, mid, "batch\n(on GPU 0\nor CPU)", "#dddddd", w=1.4)
    box(0.9, -0.55, "parameters\non GPU 0", "#f9e79f", w=1.4)
    for g, y in enumerate(ys):
        colour = _COLOURS[g % len(_COLOURS)]
        box(3.2, y, f"chunk {g}\n→ GPU {g}", colour + "55")
        box(5.5, y, f"replica {g}\nforward", colour + "99")
        box(7.5, y, f"output {g}", colour + "55", w=1.2)
        arrow(1.6, mid, 2.4, y)
        arrow(4.0, y, 4.7, y)
        arrow(6.3, y, 6.9, y)
        arrow(8.1, y, 8.75, mid)
        arrow(1.6, -0.55, 4.7, y - 0.25, colour="#b7950b", style=":")  # broadcast parameters
    box(9.3, mid, "gather\non output\ndevice", "#dddddd", w=1.1)
    for x, label in [(3.2, "1. scatter"), (5.5, "2. replicate +\n3. parallel apply"), (7.5, "4. gather")]:
        ax.text(x, n_gpus - 0.05, label, ha="center", va="bottom", fontsize=10, weight="bold")
    ax.text(1.8, -0.72, "backward: the replicas' parameter gradients flow back along the dotted lines\n"
            "and are summed into the .grad of GPU 0's parameters", ha="left", va="center", fontsize=9,
            color="#7d6608")
    fig.tight_layout()
    return fig
