"""Notebook 01 (CPU vs GPU): rate-against-size sweeps (log-log), bar charts of rates, and the CPU/GPU
picture.

Every function returns a matplotlib `Figure` made with pyplot, so in a notebook it appears under the
cell like any other plot (do not also end the cell with the figure, or it shows twice). Pass ``ax=`` to
draw into an existing axes instead (then the figure of that axes is returned).

`crossover` is the number behind a sweep's headline: the smallest size from which one device stays
ahead of another.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["crossover", "draw_architecture", "plot_bars", "plot_rates"]

def crossover(sizes: Sequence[float], slow: Sequence[float], fast: Sequence[float]) -> float | None:
    """Smallest size from which ``fast`` beats ``slow`` at that size and every larger one; None if never.

    ``slow`` and ``fast`` are rates (higher is better) measured at ``sizes`` (ascending). "Stays ahead"
    matters: a single lucky point below the real crossover does not count.
    """
    if not (len(sizes) == len(slow) == len(fast)):
        raise ValueError(f"crossover(): sizes, slow and fast must have the same length, got "
                         f"{len(sizes)}, {len(slow)} and {len(fast)}")
    if any(b <= a for a, b in zip(sizes, sizes[1:], strict=False)):
        raise ValueError("crossover(): sizes must be strictly ascending")
    found: float | None = None
    for size, s, f in zip(sizes, slow, fast, strict=True):
        if f > s:
            if found is None:
                found = size
        else:
            found = None
    return found


def _axes(ax: Axes | None, figsize: tuple[float, float]) -> tuple[Figure, Axes]:
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=figsize, layout="constrained")
        return fig, ax
    return cast("Figure", ax.figure), ax


def plot_rates(
    sizes: Sequence[float],
    series: Mapping[str, Sequence[float]],
    *,
    ylabel: str = "GFLOP/s",
    xlabel: str = "matrix size n (n × n)",
    title: str = "",
    mark: float | None = None,
    mark_label: str = "crossover",
    ax: Axes | None = None,
    figsize: tuple[float, float] = (6.0, 4.0),
) -> Figure:
    """Log-log plot of a rate (GFLOP/s, GB/s...) against size, one line per entry of ``series``.

    ``series`` maps a label (e.g. ``'cpu'``, ``'cuda fp32'``) to rates at ``sizes``; a rate may be
    ``nan`` where it was not measured. ``mark`` draws a dashed vertical line at that size (e.g. the
    crossover). Returns the figure.
    """
    if not series:
        raise ValueError("plot_rates(): series is empty; pass e.g. {'cpu': [...], 'cuda': [...]}")
    for label, values in series.items():
        if len(values) != len(sizes):
            raise ValueError(f"plot_rates(): series {label!r} has {len(values)} values for {len(sizes)} sizes")
    fig, ax = _axes(ax, figsize)
    for label, values in series.items():
        ax.plot(list(sizes), list(values), marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    if mark is not None:
        ax.axvline(mark, color="grey", linestyle="--", linewidth=1)
        ax.annotate(f"{mark_label}: {mark:g}", xy=(mark, 0.02), xycoords=("data", "axes fraction"),
                    xytext=(4, 0), textcoords="offset points", color="grey", fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return fig


def plot_bars(
    labels: Sequence[str],
    values: Sequence[float],
    *,
    ylabel: str = "TFLOP/s",
    title: str = "",
    annotations: Sequence[str] | None = None,
    log: bool = False,
    ax: Axes | None = None,
    figsize: tuple[float, float] = (6.0, 3.5),
) -> Figure:
    """Bar chart of one rate per label, with an optional text above each bar. Returns the figure."""
    if len(labels) != len(values):
        raise ValueError(f"plot_bars(): {len(labels)} labels for {len(values)} values")
    if annotations is not None and len(annotations) != len(values):
        raise ValueError(f"plot_bars(): {len(annotations)} annotations for {len(values)} values")
    fig, ax = _axes(ax, figsize)
    colours = [f"C{i}" for i in range(len(values))]
    bars = ax.bar(list(labels), list(values), color=colours)
    if annotations is not None:
        for bar, text in zip(bars, annotations, strict=True):
            ax.annotate(text, xy=(bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        xytext=(0, 3), textcoords="offset points", ha="center", fontsize=9)
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(True, axis="y", alpha=0.3)
    ax.margins(y=0.15)
    return fig


class _Blocks:
    """Rectangles collected per axes and drawn as one PatchCollection (hundreds of patches stay fast)."""

    def __init__(self, ax: Axes) -> None:
        self.ax = ax
        self.rects: list[Any] = []
        self.colours: list[str] = []

    def add(self, x: float, y: float, w: float, h: float, colour: str, text: str = "",
            fontsize: float = 9) -> None:
        from matplotlib.patches import Rectangle

        self.rects.append(Rectangle((x, y), w, h))
        self.colours.append(colour)
        if text:
            self.ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, zorder=3)

    def draw(self) -> None:
        from matplotlib.collections import PatchCollection

        self.ax.add_collection(PatchCollection(self.rects, facecolors=self.colours, edgecolors="black",
                                               linewidths=0.6))


_CONTROL, _ALU, _CACHE, _DRAM = "#f5b041", "#58d68d", "#5dade2", "#d7dbdd"


def draw_architecture(figsize: tuple[float, float] = (10.0, 4.2)) -> Figure:
    """The classic picture: a CPU spends its chip on control logic and cache for a few fast cores;
    a GPU spends it on many simple ALUs grouped in streaming multiprocessors (SMs). Returns the figure.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, (cpu, gpu) = plt.subplots(1, 2, figsize=figsize, layout="constrained")
    cpu_blocks, gpu_blocks = _Blocks(cpu), _Blocks(gpu)
    for ax in (cpu, gpu):
        ax.set_xlim(0, 10)
        ax.set_ylim(0, 10)
        ax.set_aspect("equal")
        ax.axis("off")

    # CPU: 4 big cores, each a large control unit and a few wide ALUs; a large shared cache; DRAM.
    cpu.set_title("CPU: few cores, big caches, much control logic\n→ low latency for one thread")
    for i, (x, y) in enumerate([(0.3, 5.6), (5.1, 5.6), (0.3, 2.9), (5.1, 2.9)]):
        cpu_blocks.add(x, y, 4.6, 2.5, "white")
        cpu_blocks.add(x + 0.15, y + 0.15, 2.1, 2.2, _CONTROL, f"control\n(core {i})", 8)
        for j in range(2):
            for k in range(2):
                cpu_blocks.add(x + 2.4 + 1.05 * j, y + 0.15 + 1.1 * k, 0.95, 1.0, _ALU, "ALU", 7)
    cpu_blocks.add(0.3, 1.5, 9.4, 1.2, _CACHE, "large cache (L2/L3, tens of MB)")
    cpu_blocks.add(0.3, 0.1, 9.4, 1.2, _DRAM, "DRAM (~100 GB/s)")

    # GPU: many SMs, each a small control unit, a small cache and a grid of ALUs; a shared L2; HBM.
    gpu.set_title("GPU: many small cores in SMs, small caches\n→ high throughput for uniform work")
    for r in range(4):
        for c in range(4):
            x, y = 0.3 + c * 2.37, 2.85 + r * 1.7
            gpu_blocks.add(x, y, 2.2, 1.6, "white")
            gpu_blocks.add(x + 0.08, y + 1.15, 1.0, 0.35, _CONTROL)
            gpu_blocks.add(x + 1.12, y + 1.15, 1.0, 0.35, _CACHE)
            for j in range(8):
                for k in range(4):
                    gpu_blocks.add(x + 0.08 + j * 0.255, y + 0.08 + k * 0.26, 0.22, 0.22, _ALU)
    gpu.text(5.0, 9.97, "one streaming multiprocessor (SM) = one box; an H200 has 132",
             ha="center", va="top", fontsize=8)
    gpu_blocks.add(0.3, 1.5, 9.4, 1.2, _CACHE, "shared L2 cache (~50 MB)")
    gpu_blocks.add(0.3, 0.1, 9.4, 1.2, _DRAM, "HBM (~4.8 TB/s on an H200)")

    cpu_blocks.draw()
    gpu_blocks.draw()
    fig.legend(handles=[Patch(facecolor=_CONTROL, edgecolor="black", label="control"),
                        Patch(facecolor=_ALU, edgecolor="black", label="ALU (arithmetic)"),
                        Patch(facecolor=_CACHE, edgecolor="black", label="cache"),
                        Patch(facecolor=_DRAM, edgecolor="black", label="memory")],
               loc="outside lower center", ncol=4, frameon=False)
    return fig
