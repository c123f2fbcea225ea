"""Notebook 07: reading a profiler trace and drawing it. ``torch.profiler`` writes a Chrome trace (JSON, the
format Perfetto and ``chrome://tracing`` open; ``tensorboard_trace_handler(..., use_gzip=True)`` writes it
gzipped); `read_trace` turns it into a short list of `Span` rows, `idle_gaps` finds where a row did
nothing, and `plot_timeline` draws CPU ops, GPU work and the gaps between them with matplotlib, so the
picture is in the notebook and not only in a browser tab.

- `read_trace(path)`: a `Trace` (a list of `Span`) with the outermost CPU ops of the thread that ran the
  user's Python (`CPU_ROW`; ``trace.cpu_thread`` says which thread and why), every GPU kernel, copy and
  memset (`GPU_ROW`; ``span.kind`` tells them apart) and the annotations (`STEP_ROW`).
- `host_waits(path)`: every place where the host waited for the GPU (``.item()``, ``.cpu()``, a blocking copy
  to the GPU, ``torch.cuda.synchronize()``...), each counted once, whatever called it.
- `kernel_launches(path)`: each kernel or graph launch of the trace, with the kernel it started and the
  outermost CPU op or annotation that launched it.

The trace's categories changed over PyTorch releases; all of these are read: ``cpu_op`` (``Operator`` in
1.8-1.9), ``user_annotation``, ``kernel`` (``Kernel``), ``gpu_memcpy`` (``Memcpy``), ``gpu_memset``
(``Memset``), ``cuda_runtime`` (``Runtime``) and ``cuda_driver``.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from matplotlib.axes import Axes
from matplotlib.figure import Figure

__all__ = ["CPU_ROW", "GPU_ROW", "STEP_ROW", "Launch", "Span", "Trace", "busy_fraction", "host_waits",
           "idle_gaps", "kernel_launches", "plot_timeline", "read_trace", "short_kernel_name",
           "sync_calls"]

CPU_ROW = "CPU ops"
GPU_ROW = "GPU"
STEP_ROW = "steps"

# Event categories, by what they are, in every spelling PyTorch's traces have used.
_CPU_OP = {"cpu_op", "Operator"}
_ANNOTATION = {"user_annotation"}
_GPU_KIND = {"kernel": "kernel", "Kernel": "kernel", "gpu_memcpy": "memcpy", "Memcpy": "memcpy",
             "gpu_memset": "memset", "Memset": "memset"}
_RUNTIME = {"cuda_runtime", "Runtime", "cuda_driver"}
_PYTHON = {"python_function"}
# The host waits for the device in these runtime calls, and in these ops (which call one of them on a GPU,
# and read a value on any device).
_WAIT_CALLS = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
               "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize"}
_WAIT_OPS = {"aten::item", "aten::_local_scalar_dense"}
_STEP_PREFIX = "ProfilerStep#"


class Span(NamedTuple):
    """One interval of a trace: its row (`CPU_ROW`, `GPU_ROW` or `STEP_ROW`), name, start and duration in
    microseconds from the start of the trace, and on the GPU row its kind (``"kernel"``, ``"memcpy"``,
    ``"memset"``)."""

    row: str
    name: str
    start_us: float
    dur_us: float
    kind: str = ""

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


class Trace(list[Span]):
    """The spans of a trace (a list), and ``cpu_thread``: which thread the CPU row shows, and why."""

    cpu_thread: str = ""


class Launch(NamedTuple):
    """One launch on the host: the runtime call (``cudaLaunchKernel``, ``cuLaunchKernel``,
    ``cudaGraphLaunch``...), the kernel it started (``""`` for a graph, or when the trace has no GPU
    side), and the outermost CPU op or annotation on the launching thread (``""`` if none)."""

    api: str
    kernel: str
    caller: str


def _load(path: str | Path) -> list[dict[str, Any]]:
    """The complete events (``"ph": "X"``) of a Chrome trace, plain or gzipped JSON."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no trace file at {p}: write one with prof.export_chrome_trace(path)")
    raw = p.read_bytes()
    try:
        if raw[:2] == b"\x1f\x8b":  # gzip's magic number: tensorboard_trace_handler(use_gzip=True)
            raw = gzip.decompress(raw)
        data = json.loads(raw.decode("utf-8"))
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{p} is not a Chrome trace (JSON, or gzipped JSON): {e}") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ValueError(f"{p} has no 'traceEvents' list: is it a torch.profiler trace?")
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e and "ts" in e]


def _start(e: dict[str, Any]) -> float:
    return float(e["ts"])


def _end(e: dict[str, Any]) -> float:
    return float(e["ts"]) + float(e["dur"])


def _thread(e: dict[str, Any]) -> tuple[str, str]:
    return str(e.get("pid")), str(e.get("tid"))


def _is_step(e: dict[str, Any]) -> bool:
    return str(e.get("name", "")).startswith(_STEP_PREFIX)


def _top_level(spans: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The outermost events of one thread: an op nested inside another (aten::linear → aten::addmm) is dropped."""
    out: list[dict[str, Any]] = []
    end = float("-inf")
    for e in sorted(spans, key=lambda e: (_start(e), -float(e["dur"]))):
        if _start(e) >= end:
            out.append(e)
            end = _end(e)
    return out


def _by_thread(events: Iterable[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    threads: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for e in events:
        threads.setdefault(_thread(e), []).append(e)
    return threads


def _python_thread(events: list[dict[str, Any]]) -> tuple[tuple[str, str] | None, str]:
    """The thread that ran the user's Python, and why it was chosen. In GPU training the autograd engine runs
    backward on a thread of its own, often with more op time: the thread with the most op time is not it."""
    cpu = [e for e in events if e.get("cat") in _CPU_OP | _ANNOTATION | _PYTHON]
    threads = _by_thread(cpu)
    if not threads:
        return None, "no CPU events"
    rules = [
        ("it holds the profiler's step annotations (ProfilerStep#)", lambda es: sum(_is_step(e) for e in es)),
        ("it runs the Python functions (python_function events)",
         lambda es: sum(e.get("cat") in _PYTHON for e in es)),
        ("it holds the record_function annotations", lambda es: sum(e.get("cat") in _ANNOTATION for e in es)),
        ("it started the first operator (backward threads start later)",
         lambda es: -min(_start(e) for e in es)),
    ]
    for reason, score in rules:
        scores = {key: score(es) for key, es in threads.items()}
        best = max(scores.values())
        winners = [key for key, s in scores.items() if s == best]
        if (best > 0 and len(winners) == 1) or reason.startswith("it started"):
            key = winners[0]
            others = len(threads) - 1
            return key, (f"thread {key[1]}: {reason}" +
                         (f"; {others} other thread(s) left out" if others else ""))
    return None, "no CPU events"  # pragma: no cover  (the last rule always picks a thread)


def read_trace(path: str | Path) -> Trace:
    """The spans of a ``torch.profiler`` Chrome trace (``.json`` or ``.json.gz``), sorted by start time:

    - `CPU_ROW`: the outermost CPU ops of the thread that ran the user's Python (the one with the
      ``ProfilerStep#`` annotations, else the ``python_function`` events, else the ``record_function``
      annotations, else the one that started first); ``trace.cpu_thread`` says which and why;
    - `GPU_ROW`: every GPU kernel, copy and memset (``span.kind``);
    - `STEP_ROW`: the ``record_function`` annotations and profiler steps.

    Times are in µs from the first span."""
    events = _load(path)
    key, why = _python_thread(events)
    picked: list[tuple[str, str, dict[str, Any]]] = []
    main_ops = [e for e in events if e.get("cat") in _CPU_OP and _thread(e) == key and not _is_step(e)]
    picked += [(CPU_ROW, "", e) for e in _top_level(main_ops)]
    picked += [(GPU_ROW, _GPU_KIND[str(e["cat"])], e) for e in events if e.get("cat") in _GPU_KIND]
    picked += [(STEP_ROW, "", e) for e in events
               if e.get("cat") in _ANNOTATION or (e.get("cat") in _CPU_OP and _is_step(e))]
    if not picked:
        cats = sorted({str(e.get("cat")) for e in events})
        raise ValueError(f"{path}: the trace holds no CPU ops, GPU work or annotations (its event categories: "
                         f"{', '.join(cats) or 'none'}); is it a torch.profiler trace?")
    t0 = min(_start(e) for _, _, e in picked)
    trace = Trace(sorted((Span(row, str(e.get("name", "?")), _start(e) - t0, float(e["dur"]), kind)
                          for row, kind, e in picked), key=lambda s: s.start_us))
    trace.cpu_thread = why
    return trace


def _outermost(events: Iterable[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Per thread, the outermost of ``events`` (see `_top_level`)."""
    return {key: _top_level(es) for key, es in _by_thread(events).items()}


def _enclosing(e: dict[str, Any], tops: dict[tuple[str, str], list[dict[str, Any]]]) -> str:
    """The name of the event of ``tops`` (outermost events per thread) that encloses ``e``, or ``""``."""
    return next((str(c["name"]) for c in tops.get(_thread(e), []) if _start(c) <= _start(e) and _end(e) <= _end(c)),
                "")


def host_waits(path: str | Path) -> list[str]:
    """Where the traced code made the host wait for the GPU, in time order, one entry per wait: the outermost
    CPU op that waited (``aten::item`` for ``.item()``, ``aten::to`` for ``.cpu()``...), or the runtime call
    itself where no op encloses it (``cudaDeviceSynchronize`` for ``torch.cuda.synchronize()``).

    Each wait is counted once: one ``.item()`` on a GPU tensor is ``aten::item`` →
    ``aten::_local_scalar_dense`` → ``cudaStreamSynchronize``, one wait, found by its runtime call. A read of a
    CPU tensor (``.item()`` of a data set's own numbers, an optimizer's step counter) waits for nothing and is
    not counted; a trace without GPU runtime calls (a CPU-only run) has no waits. Each wait is a point where
    the CPU stops queueing work, which leaves the GPU idle afterwards.

    In a trace with profiler steps (``ProfilerStep#N``, from ``prof.step()``), only the waits inside the steps
    count: the profiler synchronises once more when it stops, and that wait is its own, not the code's."""
    events = _load(path)
    ops = _outermost(e for e in events if e.get("cat") in _CPU_OP and not _is_step(e))
    waits = [e for e in events if e.get("cat") in _RUNTIME and e.get("name") in _WAIT_CALLS]
    steps = [e for e in events if _is_step(e)]
    if steps:
        waits = [e for e in waits if any(_start(s) <= _start(e) <= _end(s) for s in steps)]
    return [_enclosing(e, ops) or str(e["name"]) for e in sorted(waits, key=_start)]


def sync_calls(spans_or_path: Sequence[Span] | str | Path) -> int:
    """How many times the traced code made the host wait for a GPU: ``len(host_waits(path))`` for a trace file;
    for spans (which hold only the outermost CPU ops, and no runtime calls), how many of them read a value
    (``.item()``), each of which waits when the value is on a GPU."""
    if isinstance(spans_or_path, (str, Path)):
        return len(host_waits(spans_or_path))
    return sum(1 for s in spans_or_path if s.row == CPU_ROW and s.name in _WAIT_OPS)


def kernel_launches(path: str | Path) -> list[Launch]:
    """Every launch the host made (runtime or driver calls whose name holds ``Launch``), in time order, with
    the kernel it started (matched by the trace's correlation id) and its caller: the outermost CPU op or
    annotation that encloses the launch on its thread (``ProfilerStep#`` markers left out)."""
    events = _load(path)
    kernels = {(e.get("args") or {}).get("correlation"): str(e.get("name", ""))
               for e in events if _GPU_KIND.get(str(e.get("cat"))) == "kernel"}
    tops = _outermost(e for e in events if e.get("cat") in _CPU_OP | _ANNOTATION and not _is_step(e))
    launches = sorted((e for e in events if e.get("cat") in _RUNTIME and "Launch" in str(e.get("name", ""))),
                      key=_start)
    return [Launch(str(e["name"]), kernels.get((e.get("args") or {}).get("correlation"), ""), _enclosing(e, tops))
            for e in launches]


def short_kernel_name(name: str) -> str:
    """A kernel's name without its return type, anonymous namespaces, template arguments and parameters:
    ``void at::native::(anonymous namespace)::multi_tensor_apply_kernel<...>(...)`` becomes
    ``at::native::multi_tensor_apply_kernel``. Names without these (Triton's, cuBLAS's) come back as they are."""
    name = name.replace("(anonymous namespace)::", "").strip()
    name = name.removeprefix("void ")
    return re.split(r"[<(]", name, maxsplit=1)[0].strip()


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


def plot_timeline(spans: Sequence[Span], title: str = "", min_gap_us: float = 20.0,
                  ax: Axes | None = None) -> Figure:
    """A timeline of ``spans``: one row per kind (steps, CPU ops, GPU work), each span a bar, and the idle
    gaps of the CPU and GPU rows longer than ``min_gap_us`` shaded red. Times in milliseconds."""
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
