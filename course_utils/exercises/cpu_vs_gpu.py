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
from . import Verdict, exercise, fail, ok

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
        self.events: list[str] = []  # "launch" and "sync", in the order the student's function made them

    def __call__(self) -> None:
        cost = self.seconds + (self.warmup if self.calls == 0 else 0.0)
        self.calls += 1
        self.events.append("launch")
        if self.device is None:
            start = time.perf_counter()
            time.sleep(cost)  # synchronous: the work is done when the call returns, as on a CPU
            self.durations.append(time.perf_counter() - start)
        else:
            self.device.launch(cost)

    def waited_between_calls(self) -> bool:
        """Whether sync() ran after the first call and before the last: without it, on an asynchronous device, a
        clock started after the first call began with that call's work (and any warm-up) still queued."""
        launches = [i for i, e in enumerate(self.events) if e == "launch"]
        return len(launches) < 2 or "sync" in self.events[launches[0]:launches[-1]]

    def took(self) -> float:
        """Seconds one call after the first really took while it was timed (at least ``seconds``): on a busy
        machine a sleeping thread wakes late, so the work takes longer than asked, whoever times it."""
        if self.device is not None:
            late = statistics.median(self.device.late) if self.device.late else 0.0
            return self.seconds + late
        return max(self.seconds, statistics.median(self.durations[1:])) if len(self.durations) > 1 else self.seconds

    def sync(self) -> None:
        self.sync_calls += 1
        self.events.append("sync")
        if self.device is not None:
            self.device.synchronize()


_SIGNATURE = "The checker calls time_per_call(fn, sync); fn() and sync() take no arguments."


def _raised(exc: Exception) -> Verdict:
    text = str(exc)
    message = f"your function raised {type(exc).__name__}: {text}"
    if "CUDA" in text or "cuda" in text:
        return fail(message + " (a CUDA call needs a CUDA GPU).",
                    "The sync argument is there so that one function times work on any device, with or "
                    "without a CUDA GPU: what waits for the device the work runs on?",
                    "Call sync() where you called a torch.cuda function.")
    if isinstance(exc, TypeError) and "positional argument" in text:
        return fail(message + ".", "How does the checker call your function, and what do fn and sync take?",
                    _SIGNATURE)
    return fail(message + ".", "The error's last line names what went wrong, and the traceback the line of "
                "your function that raised it.", _SIGNATURE)


def _run(time_per_call: Callable[..., Any], work: _Workload) -> tuple[float | None, Verdict | None]:
    """Call the student's function; return (seconds, None) or (None, a failing verdict)."""
    try:
        result = time_per_call(work, work.sync)
    except Exception as exc:
        return None, _raised(exc)
    if isinstance(result, torch.Tensor) and result.numel() == 1:
        result = result.item()
    if isinstance(result, bool) or not isinstance(result, numbers.Real):
        many = f"{len(result)} values" if isinstance(result, list | tuple) else repr(result)
        return None, fail(f"your function returned {many} ({type(result).__name__}), not a number of seconds.",
                          "The exercise asks for one number: the median time of one call, in seconds.",
                          "Collect one duration per timed call in a list, and return its median (the "
                          "statistics module has one).")
    value = float(result)
    if value < 0:
        return None, fail(f"your function returned {format_seconds(value)}, a negative duration.",
                          "A duration is the later clock reading minus the earlier one.",
                          "Subtract the clock reading taken before fn() from the one taken after it.")
    if not math.isfinite(value):
        return None, fail(f"your function returned {value}, which is not a duration.",
                          "A duration is the later clock reading minus the earlier one, in seconds.",
                          "Use differences of time.perf_counter() readings.")
    return value, None


def _too_large(value: float, work: _Workload, asynchronous: bool) -> Verdict:
    d = work.took()  # what a call really took, on a busy machine more than asked
    if 0.5e3 * d <= value <= 3e3 * d:
        return fail(f"your function returned {value:.4g} for work that takes {format_seconds(d)} per call: "
                    "that looks like milliseconds.",
                    "Which unit does time.perf_counter() count in, and which does the exercise ask for?",
                    "Return the seconds as time.perf_counter() differences give them: no factor of 1000.")
    per = value / d
    first_call_counted = fail(
        f"your function returned {format_seconds(value)} per call for work that takes {format_seconds(d)} per call, "
        f"but whose first call costs {format_seconds(work.warmup + d)} (initialisation).",
        "Section 3.1: the first call pays for initialisation. Does your figure include it? (A mean lets one "
        "slow sample pull it up; a median does not.)",
        "Call fn() a few times before the timed calls, and return the median of the timed calls (not their "
        "mean, not the first).")
    if not asynchronous and work.durations and math.isclose(value, statistics.mean(work.durations), rel_tol=0.2):
        return first_call_counted  # the mean of every call, the slow first one included
    if work.calls >= 4 and per >= 0.8 * (work.calls - 3):
        return fail(f"your function returned {format_seconds(value)}, about {round(per)} times the "
                    f"{format_seconds(d)} one call takes: that looks like the total over all the calls.",
                    "The exercise asks for the time of ONE call: how many calls does your measured time cover?",
                    "Divide by the number of calls between the two clock readings (or time each call on its "
                    "own and take the median).")
    if asynchronous:
        return fail(f"your function returned {format_seconds(value)} per call for work that keeps the device "
                    f"busy {format_seconds(d)} per call: it counts work queued before the clock started "
                    f"(the warm-up call costs {format_seconds(work.warmup + d)}).",
                    "Section 3: a GPU call returns as soon as its work is queued. When your clock starts, is "
                    "the device still busy with the warm-up calls?",
                    "Call sync() after the warm-up and before the clock reading that starts the timing.")
    return first_call_counted


def _check_sync_free(time_per_call: Callable[..., Any], seconds: float) -> Verdict | None:
    """Semantics on a synchronous (CPU-like) workload: seconds per call, warm-up, median."""
    work = _Workload(seconds)
    value, bad = _run(time_per_call, work)
    if bad is not None:
        return bad
    assert value is not None
    if work.calls == 0:
        return fail("your function called fn() 0 time(s) (it returned a number without timing anything).",
                    "The checker's work takes a time your function can only know by measuring it: what must it "
                    "call between two clock readings?",
                    "Call fn() between two time.perf_counter() readings, several times, after a warm-up.")
    if work.calls < 3:
        return fail(f"your function called fn() {work.calls} time(s).",
                    "Section 3.1: the first call pays for initialisation, and one sample can be an outlier. "
                    "How many calls does a median need?",
                    "A few warm-up calls, then several timed calls (e.g. 10), and the median of those.")
    if value > 2 * work.took():  # the student timed these very calls: a right answer is close to what they took
        return _too_large(value, work, asynchronous=False)
    if value < 0.5 * seconds:
        fraction = round(work.took() / value) if value > 0 else 0
        part = f": about 1/{fraction} of one call" if fraction >= 2 else ""
        return fail(f"your function returned {format_seconds(value)} per call for work that takes "
                    f"{format_seconds(seconds)} per call even on a CPU{part}.",
                    "What do your two clock readings enclose: one call of fn()? And what do you divide by?",
                    "Read time.perf_counter() just before fn() and again after it (after sync()), and divide "
                    "only by the number of calls between the two readings.")
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
                    "Section 3: a GPU call returns when its work is queued, not when it is done. What makes "
                    "the host wait for the device?",
                    "The sync argument: call it before each of the two clock readings.")
    if value < 0.5 * seconds:
        return fail(f"on an asynchronous device your function measured {format_seconds(value)} per call for "
                    f"work that takes {format_seconds(seconds)}: the clock stops before the work is done.",
                    "When your clock stops, has the device finished the work fn() queued?",
                    "Call sync() after fn() and before the clock reading that stops the timing.")
    if value > 2 * work.took() or not work.waited_between_calls():
        # The order of the calls tells it even when a loaded machine wakes every sleep late and blurs the sizes.
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
        return fail(f"on {device} your function raised {type(exc).__name__}: {exc}",
                    "It passed on the simulated devices: what differs on a real GPU?", _SIGNATURE)
    reference = benchmark(fn, device=device, repeat=5).median
    if not 0.67 <= value / reference <= 1.5:
        return fail(f"on {device} your function measured {format_seconds(value)} for a {n}×{n} matmul; "
                    f"synchronised timing gives {format_seconds(reference)}.",
                    "Section 3's recipe holds on a real GPU too: warm-up, the device idle when the clock "
                    "starts and done when it stops, several samples, their median.",
                    "Compare your function with the 'host clock + synchronize' timing of section 3.")
    return None


@exercise
def check_time_per_call(time_per_call: Any, device: str | torch.device | None = None) -> Verdict:
    """Exercise: ``time_per_call(fn, sync)`` returns the median seconds per call of ``fn()``.

    Checked on a synchronous workload (units, warm-up, per call), on a simulated asynchronous device
    (the work only finishes through ``sync()``), and, when ``device`` is a CUDA device, against
    `course_utils.benchmark` on a real matmul.

    Limits: the figure must lie between half the asked duration (3 ms synchronous, 6 ms asynchronous) and
    twice what a call really took while it was timed (on a busy machine more than asked). Both limits are
    inclusive: a figure exactly on one passes. A figure 500 to 3000 times what a call took reads as
    milliseconds; a figure near the mean of all calls, the slow first one included, as a missing warm-up.
    """
    if not callable(time_per_call):
        return fail(f"expected a function, got {type(time_per_call).__name__}.",
                    "Pass the function itself (its name, without parentheses), not what calling it returns.")
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
