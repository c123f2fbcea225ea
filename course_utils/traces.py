"""Notebook 07: reading a profiler trace and drawing it. ``torch.profiler`` writes a Chrome trace (JSON, the
format Perfetto and ``chrome://tracing`` open); `read_trace` turns it into a short list of `Span` rows,
`idle_gaps` finds where a row did nothing, and `plot_timeline` draws CPU ops, GPU kernels and the gaps
between them with matplotlib, so the picture is in the notebook and not only in a browser tab.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from matplotlib.axes import Axes
from matplotlib.figure import Figure

__all__ = ["CPU_ROW", "GPU_ROW", "STEP_ROW", "Span", "busy_fraction", "idle_gaps", "plot_timeline",
           "read_trace", "sync_calls"]

CPU_ROW = "CPU ops"
GPU_ROW = "GPU kernels"
STEP_ROW = "steps"

_GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
_SYNC_OPS = {"aten::item", "aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize",
             "cudaEventSynchronize"}


class Span(NamedTuple):
    """One interval of a trace: its row (`CPU_ROW`, `GPU_ROW` or `STEP_ROW`), name, start and duration in
    microseconds from the start of the trace."""

    row: str
    name: str
    start_us: float
    dur_us: float

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


def _load(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no trace file at {p}: write one with prof.export_chrome_trace(path)")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{p} is not a Chrome trace (JSON): {e}") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ValueError(f"{p} has no 'traceEvents' list: is it a torch.profiler trace?")
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e and "ts" in e]


def _top_level(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The outermost ops of one thread: an op nested inside another (aten::linear → aten::addmm) is dropped."""
    out: list[dict[str, Any]] = []
    end = float("-inf")
    for e in sorted(spans, key=lambda e: (float(e["ts"]), -float(e["dur"]))):
        if float(e["ts"]) >= end:
            out.append(e)
            end = float(e["ts"]) + float(e["dur"])
    return out


def read_trace(path: str | Path) -> list[Span]:
    """The spans of a ``torch.profiler`` Chrome trace, sorted by start time: the outermost CPU ops of the
    thread that ran the most op time (`CPU_ROW`), every GPU kernel, copy and memset (`GPU_ROW`), and the
    ``record_function`` annotations (`STEP_ROW`). Times are in µs from the first span."""
    events = _load(path)
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    by_thread: dict[Any, list[dict[str, Any]]] = {}
    for e in ops:
        by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    main = max(by_thread.values(), key=lambda es: sum(float(e["dur"]) for e in es), default=[])
    picked = [(CPU_ROW, e) for e in _top_level(main)]
    picked += [(GPU_ROW, e) for e in events if e.get("cat") in _GPU_CATEGORIES]
    picked += [(STEP_ROW, e) for e in events if e.get("cat") == "user_annotation"]
    if not picked:
        raise ValueError(f"{path}: the trace holds no CPU ops, GPU kernels or annotations")
    t0 = min(float(e["ts"]) for _, e in picked)
    spans = [Span(row, str(e.get("name", "?")), float(e["ts"]) - t0, float(e["dur"])) for row, e in picked]
    return sorted(spans, key=lambda s: s.start_us)


def idle_gaps(spans: Sequence[Span], row: str = GPU_ROW, min_gap_us: float = 0.0) -> list[tuple[float, float]]:
    """The ``(start_us, length_us)`` intervals, longer than ``min_gap_us``, in which nothing ran on ``row``
    between its first span's start and its last span's end (overlapping spans count once)."""
    on_row = sorted((s for s in spans if s.row == row), key=lambda s: s.start_us)
    gaps: list[tuple[float, float]] = []
    if not on_row:
        return gaps
    busy_until = on_row[0].end_us
    for s in on_row[1:]:
        if s.start_us - busy_until > min_gap_us:
            gaps.append((busy_until, s.start_us - busy_until))
        busy_until = max(busy_until, s.end_us)
    return gaps


def busy_fraction(spans: Sequence[Span], row: str = GPU_ROW) -> float:
    """The share of ``row``'s time span (first start to last end) in which something ran on it."""
    on_row = [s for s in spans if s.row == row]
    if not on_row:
        raise ValueError(f"no spans on row {row!r}; rows present: {sorted({s.row for s in spans})}")
    total = max(s.end_us for s in on_row) - min(s.start_us for s in on_row)
    idle = sum(length for _, length in idle_gaps(spans, row))
    return 1.0 if total <= 0 else 1.0 - idle / total


def sync_calls(spans_or_path: Sequence[Span] | str | Path) -> int:
    """How many times the traced code made the host wait for a device (``.item()``, ``synchronize``...):
    each is a point where the CPU stops queueing work, which leaves the GPU idle afterwards."""
    if isinstance(spans_or_path, (str, Path)):
        return sum(1 for e in _load(spans_or_path) if e.get("name") in _SYNC_OPS)
    return sum(1 for s in spans_or_path if s.name in _SYNC_OPS)


def plot_timeline(spans: Sequence[Span], title: str = "", min_gap_us: float = 20.0,
                  ax: Axes | None = None) -> Figure:
    """A timeline of ``spans``: one row per kind (steps, CPU ops, GPU kernels), each span a bar, and the
    idle gaps of the busiest device row longer than ``min_gap_us`` shaded red. Times in milliseconds."""
    import matplotlib.pyplot as plt

    rows = [r for r in (STEP_ROW, CPU_ROW, GPU_ROW) if any(s.row == r for s in spans)]
    if not rows:
        raise ValueError("plot_timeline: no spans to draw")
    if ax is None:
        fig, ax = plt.subplots(figsize=(11, 0.8 + 0.7 * len(rows)))
    else:
        fig = ax.figure  # type: ignore[assignment]
    colours = {STEP_ROW: "#7f8c8d", CPU_ROW: "#2e86c1", GPU_ROW: "#28b463"}
    for y, row in enumerate(reversed(rows)):
        bars = [(s.start_us / 1e3, max(s.dur_us / 1e3, 1e-4)) for s in spans if s.row == row]
        ax.broken_barh(bars, (y - 0.35, 0.7), facecolors=colours[row], edgecolor="none")
        if row != STEP_ROW:
            for start, length in idle_gaps(spans, row, min_gap_us):
                ax.broken_barh([(start / 1e3, length / 1e3)], (y - 0.45, 0.9), facecolors="#e74c3c",
                               alpha=0.25, edgecolor="none")
    ax.set_yticks(range(len(rows)), list(reversed(rows)))
    ax.set_xlabel("time (ms)")
    ax.set_title(title or "profiler trace (red: idle gaps)")
    fig.tight_layout()
    return fig
