"""Checker for notebook 01 (CPU vs GPU): the student's timing function.

The exercise: write ``time_per_call(fn, sync)`` that returns the median time, in seconds, of one call
of ``fn()``, where ``sync()`` waits until the device has finished all the work queued so far. Done
right it warms up, synchronises before starting and before stopping the clock, times several calls
and returns the median.

A GPU is not needed to check it. `SimulatedAsyncDevice` behaves like one: ``launch(seconds)`` queues
work and returns at once, and the work is only seen to finish through ``synchronize()``. A timing
function that forgets ``sync()`` measures how long it took to *queue* the work, exactly as it would
on a real GPU, and the checker says so. With ``device='cuda'`` the checker also compares the
student's timing of a real matmul with `course_utils.benchmark` (CUDA events).

The workloads sleep rather than compute, and a busy machine wakes a sleeping thread late (milliseconds late
when other programs keep every core busy). So the upper limits are set against what the work really took
while the student's function timed it (each call's own duration, and how late each ``synchronize()`` woke),
not against what it was asked to take: a right answer stays right on a loaded CI runner.
"""

from __future__ import annotations

import math
import numbers
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from ..formatting import format_seconds
from ..timing import benchmark, synchronize
from . import Verdict, fail, ok

__all__ = ["SimulatedAsyncDevice", "check_time_per_call"]

WARMUP_COST = 0.200
"""Extra seconds the first call of a workload costs (library initialisation, as on a real GPU): large against
the 3 ms calls, so that a mean that includes it stands out even when a busy machine makes every call late."""
ASYNC_WARMUP_COST = 0.300
"""The same on the simulated asynchronous device: large, so that timing it by mistake shows."""


class SimulatedAsyncDevice:
    """A pretend accelerator with one queue, to test timing code on any machine.

    ``launch(seconds)`` returns at once and keeps the device busy for ``seconds`` after the work
    already queued; ``synchronize()`` blocks until the queue is empty. The counters say how the
    device was used.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._clock = clock
        self._sleep = sleep
        self.busy_until = clock()
        self.launches = 0
        self.syncs = 0
        self.late: list[float] = []  # for each synchronize() that waited: how much later than asked it woke

    def launch(self, seconds: float) -> None:
        """Queue ``seconds`` of work; returns immediately, like a CUDA kernel launch."""
        if seconds < 0:
            raise ValueError(f"launch(): seconds must be >= 0, got {seconds}")
        self.busy_until = max(self._clock(), self.busy_until) + seconds
        self.launches += 1

    def pending(self) -> float:
        """Seconds of queued work not yet done."""
        return max(0.0, self.busy_until - self._clock())

    def synchronize(self) -> None:
        """Wait until all queued work is done, like ``torch.cuda.synchronize()``."""
        self.syncs += 1
        remaining = self.pending()
        if remaining > 0:
            start = self._clock()
            self._sleep(remaining)
            self.late.append(max(0.0, self._clock() - start - remaining))


class _Workload:
    """``fn`` for the checks: each call costs ``seconds``, the first one ``warmup`` more."""

    def __init__(self, seconds: float, device: SimulatedAsyncDevice | None = None,
                 warmup: float = WARMUP_COST) -> None:
        self.seconds = seconds
        self.warmup = warmup
        self.device = device
        self.calls = 0
        self.sync_calls = 0
        self.durations: list[float] = []  # how long each synchronous call really took

    def __call__(self) -> None:
        cost = self.seconds + (self.warmup if self.calls == 0 else 0.0)
        self.calls += 1
        if self.device is None:
            start = time.perf_counter()
            time.sleep(cost)  # synchronous: the work is done when the call returns, as on a CPU
            self.durations.append(time.perf_counter() - start)
        else:
            self.device.launch(cost)

    def took(self) -> float:
        """Seconds one call after the first really took while it was timed (at least ``seconds``): on a busy
        machine a sleeping thread wakes late, so the work takes longer than asked, whoever times it."""
        if self.device is not None:
            late = statistics.median(self.device.late) if self.device.late else 0.0
            return self.seconds + late
        return max(self.seconds, statistics.median(self.durations[1:])) if len(self.durations) > 1 else self.seconds

    def sync(self) -> None:
        self.sync_calls += 1
        if self.device is not None:
            self.device.synchronize()


def _run(time_per_call: Callable[..., Any], work: _Workload) -> tuple[float | None, Verdict | None]:
    """Call the student's function; return (seconds, None) or (None, a failing verdict)."""
    try:
        result = time_per_call(work, work.sync)
    except Exception as exc:
        hint = ("use the sync argument to wait for the device (not torch.cuda.synchronize(), which needs a "
                "CUDA GPU), and time.perf_counter() for the clock")
        return None, fail(f"your function raised {type(exc).__name__}: {exc}", hint)
    if isinstance(result, torch.Tensor) and result.numel() == 1:
        result = result.item()
    if isinstance(result, bool) or not isinstance(result, numbers.Real):
        return None, fail(f"your function returned {result!r} ({type(result).__name__}), not a number of "
                          "seconds.", "return the median of the per-call times, e.g. "
                          "statistics.median(times)")
    value = float(result)
    if not math.isfinite(value) or value < 0:
        return None, fail(f"your function returned {value}, which is not a duration.",
                          "return time.perf_counter() differences: end - start, in seconds")
    return value, None


def _too_large(value: float, work: _Workload, asynchronous: bool) -> Verdict:
    d = work.took()  # what a call really took, on a busy machine more than asked
    if 0.5e3 * d <= value <= 3e3 * d:
        return fail(f"your function returned {value:.4g} for work that takes {format_seconds(d)} per call: "
                    "that looks like milliseconds.", "return seconds: do not multiply by 1000")
    per = value / d
    first_call_counted = fail(
        f"your function returned {format_seconds(value)} per call for work that takes {format_seconds(d)} per call, "
        f"but whose first call costs {format_seconds(work.warmup + d)} (initialisation).",
        "warm up: call fn() a few times before timing, and return the median of several samples (not the mean, "
        "not the first)")
    if not asynchronous and work.durations and math.isclose(value, statistics.mean(work.durations), rel_tol=0.2):
        return first_call_counted  # the mean of every call, the slow first one included
    if work.calls >= 4 and per >= 0.8 * (work.calls - 3):
        return fail(f"your function returned {format_seconds(value)}, about {round(per)} times the "
                    f"{format_seconds(d)} one call takes: that looks like the total over all the calls.",
                    "divide each measured time by the number of calls it covers, or time calls one by one")
    if asynchronous:
        return fail(f"your function returned {format_seconds(value)} per call for work that keeps the device "
                    f"busy {format_seconds(d)} per call: it counts work queued before the clock started "
                    f"(the warm-up call costs {format_seconds(work.warmup + d)}).",
                    "call sync() after the warm-up calls and before reading the clock at the start")
    return first_call_counted


def _check_sync_free(time_per_call: Callable[..., Any], seconds: float) -> Verdict | None:
    """Semantics on a synchronous (CPU-like) workload: seconds per call, warm-up, median."""
    work = _Workload(seconds)
    value, bad = _run(time_per_call, work)
    if bad is not None:
        return bad
    assert value is not None
    if work.calls < 3:
        return fail(f"your function called fn() {work.calls} time(s).",
                    "warm up with a few calls first, then time several calls (e.g. 10) and take the median")
    if value > 2 * work.took():  # the student timed these very calls: a right answer is close to what they took
        return _too_large(value, work, asynchronous=False)
    if value < 0.5 * seconds:
        return fail(f"your function returned {format_seconds(value)} per call for work that takes "
                    f"{format_seconds(seconds)} per call even on a CPU.",
                    "start the clock just before fn() and stop it just after (after sync()), "
                    "and subtract start from end")
    return None


def _check_async(time_per_call: Callable[..., Any], seconds: float) -> Verdict | None:
    """On a simulated asynchronous device: the work only finishes through sync()."""
    device = SimulatedAsyncDevice()
    work = _Workload(seconds, device, warmup=ASYNC_WARMUP_COST)
    value, bad = _run(time_per_call, work)
    if bad is not None:
        return bad
    assert value is not None
    if work.sync_calls == 0:
        return fail(f"your function never calls sync(), so on a GPU it measures how long it takes to queue "
                    f"the work ({format_seconds(value)} per call here), not to do it "
                    f"({format_seconds(seconds)} per call).",
                    "call sync() before starting the clock and again before stopping it")
    if value < 0.5 * seconds:
        return fail(f"on an asynchronous device your function measured {format_seconds(value)} per call for "
                    f"work that takes {format_seconds(seconds)}: the clock stops before the work is done.",
                    "call sync() after fn() and before reading the clock at the end")
    if value > 2 * work.took():
        return _too_large(value, work, asynchronous=True)
    return None


def _check_real(time_per_call: Callable[..., Any], device: torch.device) -> Verdict | None:
    """On a real accelerator: the student's timing of a matmul against CUDA-event timing."""
    n = 2048
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device)

    def fn() -> Any:
        return a @ a

    def sync() -> None:
        synchronize(device)

    try:
        value = float(time_per_call(fn, sync))
    except Exception as exc:
        return fail(f"on {device} your function raised {type(exc).__name__}: {exc}")
    reference = benchmark(fn, device=device, repeat=5).median
    if not 0.67 <= value / reference <= 1.5:
        return fail(f"on {device} your function measured {format_seconds(value)} for a {n}×{n} matmul; "
                    f"synchronised timing gives {format_seconds(reference)}.",
                    "warm up, call sync() before starting and before stopping the clock, take the median")
    return None


def check_time_per_call(time_per_call: Any, device: str | torch.device | None = None) -> Verdict:
    """Exercise: ``time_per_call(fn, sync)`` returns the median seconds per call of ``fn()``.

    Checked on a synchronous workload (units, warm-up, per call), on a simulated asynchronous device
    (the work only finishes through ``sync()``), and, when ``device`` is a CUDA device, against
    `course_utils.benchmark` on a real matmul.
    """
    if not callable(time_per_call):
        return fail(f"expected a function, got {type(time_per_call).__name__}.",
                    "def time_per_call(fn, sync): ... and pass the function itself, without calling it")
    for check in (lambda: _check_sync_free(time_per_call, 0.003),
                  lambda: _check_async(time_per_call, 0.006)):
        verdict = check()
        if verdict is not None:
            return verdict
    where = "on a synchronous workload and on a simulated asynchronous device"
    if device is not None and torch.device(device).type == "cuda":
        verdict = _check_real(time_per_call, torch.device(device))
        if verdict is not None:
            return verdict
        where += f", and it agrees with CUDA-event timing on {torch.device(device).type}"
    return ok(f"time_per_call measures the time per call right {where}.")
