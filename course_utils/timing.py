"""Notebooks 00, 01, 02, 04, 07, 08 and 09 (and every measuring helper): timing done right, synchronised, warmed up,
repeated, summarised by the median.

GPU work is asynchronous: a CUDA call returns as soon as the kernel is queued, so reading a host clock
around it measures how long it took to *issue* the work, not to do it. `benchmark` times CUDA work with
CUDA events recorded on the stream around the calls, and other devices by synchronising before
reading `time.perf_counter`. It warms up first (the first call pays for library initialisation and
kernel selection), runs enough calls per sample that a sample is long compared with the timer's
resolution, and reports the median of several samples with their spread.

Notebook 01 teaches these steps with explicit code; this module is the same recipe, packaged.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .devices import device_in_use, get_device
from .formatting import format_seconds

__all__ = ["Timing", "benchmark", "synchronize"]


@dataclass(frozen=True)
class Timing:
    """Result of `benchmark`: seconds per call."""

    median: float
    """Median over samples of the time per call, in seconds."""
    iqr: float
    """Interquartile range of the per-call times (a robust spread), in seconds."""
    min: float
    max: float
    times: tuple[float, ...]
    """Per-call time of each sample, in seconds."""
    number: int
    """Calls per sample."""
    device: str
    """Device the timing was synchronised with (``'cuda:0'``, ``'cpu'``, ...)."""
    method: str
    """``'cuda events'`` or ``'perf_counter'`` (after synchronising the device)."""

    def rate(self, work: float) -> float:
        """``work`` units per second (e.g. FLOPs per call → FLOP/s; bytes per call → B/s)."""
        return work / self.median

    def __str__(self) -> str:
        return (f"{format_seconds(self.median)} ± {format_seconds(self.iqr / 2)} per call "
                f"(median ± IQR/2 of {len(self.times)} samples × {self.number} calls, {self.device}, "
                f"{self.method})")


def _resolve_device(device: str | torch.device | None) -> torch.device:
    """The device to wait for: the one named, checked (`get_device`), else where this process's work is
    (`device_in_use`: CUDA once this process has used it, else mps, another accelerator, or the CPU)."""
    return device_in_use() if device is None else get_device(device)


def synchronize(device: str | torch.device | None = None) -> None:
    """Wait until all queued work on ``device`` is done (no-op on the CPU).

    ``None`` means where this process's work is (`course_utils.devices.device_in_use`: CUDA if this process
    has initialised it, else MPS or another accelerator if present, else the CPU). A named device must
    exist here: `DeviceError` otherwise.
    """
    _wait(_resolve_device(device))


def _wait(dev: torch.device) -> None:
    """`synchronize` for a device already resolved (cheap enough to sit inside a timed sample)."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "mps":
        torch.mps.synchronize()
    elif dev.type != "cpu":
        torch.accelerator.synchronize(dev)


def _time_samples(fn: Callable[[], Any], dev: torch.device, number: int, repeat: int) -> list[float]:
    """Per-call seconds for ``repeat`` samples of ``number`` back-to-back calls each."""
    times: list[float] = []
    if dev.type == "cuda":
        with torch.cuda.device(dev):
            for _ in range(repeat):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize(dev)
                start.record()
                for _ in range(number):
                    fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3 / number)
        return times
    for _ in range(repeat):
        _wait(dev)
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        _wait(dev)
        times.append((time.perf_counter() - t0) / number)
    return times


def benchmark(
    fn: Callable[..., Any],
    *args: Any,
    device: str | torch.device | None = None,
    warmup: int = 3,
    repeat: int = 10,
    number: int | None = None,
    min_sample_time: float = 0.02,
    max_number: int = 10_000,
    **kwargs: Any,
) -> Timing:
    """Time ``fn(*args, **kwargs)`` on ``device`` correctly and return a `Timing` (seconds per call).

    - ``device``: where ``fn`` does its work. CUDA is timed with CUDA events on the current stream,
      other devices with ``perf_counter`` after synchronising. ``None`` means CUDA if this process has
      already initialised it, else MPS or another accelerator (XPU...) if present, else the CPU
      (`course_utils.devices.device_in_use`). A named device must exist here: `DeviceError` otherwise.
    - ``warmup``: calls made and discarded first (library initialisation, kernel selection, caches).
    - ``repeat``: number of samples; the median and the interquartile range are over these.
    - ``number``: calls per sample; by default chosen so that one sample takes at least
      ``min_sample_time`` seconds (at most ``max_number`` calls).
    """
    if not callable(fn):
        raise TypeError(f"benchmark() needs a callable, got {type(fn).__name__}; wrap an expression in a "
                        "lambda: benchmark(lambda: a @ b, device=a.device)")
    if repeat < 1 or warmup < 0 or (number is not None and number < 1):
        raise ValueError(f"benchmark(): need repeat >= 1, warmup >= 0, number >= 1 "
                         f"(got repeat={repeat}, warmup={warmup}, number={number})")
    dev = _resolve_device(device)

    def call() -> Any:
        return fn(*args, **kwargs)

    for _ in range(warmup):
        call()
    _wait(dev)
    if number is None:
        # Calibrate: grow the number of calls until one sample is long enough to time reliably. A busy
        # machine can only make a sample slower (another process took the core for a while), never faster,
        # so the fastest of three says how long the calls take: one slowed sample must not end the search.
        number = 1
        while number < max_number:
            t = min(_time_samples(call, dev, number, 3))
            if t * number >= min_sample_time:
                break
            want = min_sample_time / max(t, 1e-9)
            number = min(max_number, max(number * 2, math.ceil(want * 1.1)))
    times = _time_samples(call, dev, number, repeat)
    ordered = sorted(times)
    if len(ordered) >= 2:
        q = statistics.quantiles(ordered, n=4, method="inclusive")
        iqr = q[2] - q[0]
    else:
        iqr = 0.0
    return Timing(median=statistics.median(ordered), iqr=iqr, min=ordered[0], max=ordered[-1],
                  times=tuple(times), number=number, device=str(dev),
                  method="cuda events" if dev.type == "cuda" else "perf_counter")
