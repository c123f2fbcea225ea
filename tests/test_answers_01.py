"""A catalogue of answers for notebook 01's exercise checker (course_utils.exercises.cpu_vs_gpu:
check_time_per_call, a timing function for an asynchronous device).

The wrong answers a class writes, each rejected with a message that names its mistake and a first hint that
names the concept, not the line (no line of the notebook's solution in it; the closer hint waits for a second
failure or %hint); and right answers written differently from the notebook's solution, each accepted. At the
end, the checker's first tests (from tests/test_cpu_vs_gpu.py): the typical mistakes, the simulated asynchronous
device, and verdicts that hold on a loaded machine. Every test leaves the global settings as it found them.

Most of the time is the checker's workloads, which sleep (several seconds on a 2-core machine).
"""

from __future__ import annotations

import statistics
import time

import pytest
import torch
from answers_helpers import accepted
from answers_helpers import rejected_without_solution_lines as rejected
from conftest import notebook_solution

from course_utils import exercises
from course_utils.exercises import cpu_vs_gpu
from course_utils.exercises.cpu_vs_gpu import SimulatedAsyncDevice, check_time_per_call

pytestmark = pytest.mark.usefixtures("global_settings_kept")  # tests/conftest.py


# ================================================================ 01: time_per_call

def _timed_calls(fn, sync, warmup=3, repeat=10, divide=1):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) / divide)
    return times


def no_sync(fn, sync):
    for _ in range(3):
        fn()
    times = []
    for _ in range(10):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def sync_before_only(fn, sync):
    for _ in range(3):
        fn()
    times = []
    for _ in range(10):
        sync()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def loop_synced_at_the_end_only(fn, sync):
    for _ in range(3):
        fn()
    start = time.perf_counter()
    for _ in range(10):
        fn()
    sync()
    return (time.perf_counter() - start) / 10


def mean_without_warmup(fn, sync):
    return statistics.mean(_timed_calls(fn, sync, warmup=0))


def end_minus_start_swapped(fn, sync):
    fn()
    fn()
    sync()
    start = time.perf_counter()
    fn()
    sync()
    end = time.perf_counter()
    return start - end


def each_call_divided_by_the_count(fn, sync):
    return statistics.median(_timed_calls(fn, sync, divide=10))


def uses_cuda_synchronize(fn, sync):
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def only_fn(fn):
    return 0.0


WRONG_TIMERS = [
    (no_sync, "never calls sync()", "What makes the host wait"),
    (sync_before_only, "the clock stops before the work is done", "has the device finished"),
    (loop_synced_at_the_end_only, "queued before the clock started", "When your clock starts"),
    (lambda fn, sync: 1e3 * statistics.median(_timed_calls(fn, sync)), "looks like milliseconds", "Which unit"),
    (lambda fn, sync: sum(_timed_calls(fn, sync)), "the total over all the calls", "ONE call"),
    (mean_without_warmup, "whose first call costs", "Section 3.1"),
    (_timed_calls, "returned 10 values (list), not a number of seconds", "one number"),
    (end_minus_start_swapped, "a negative duration", "later clock reading minus the earlier"),
    (each_call_divided_by_the_count, "of one call", "what do you divide by"),
    # right only for the checker's workload: a figure it never measured
    (lambda fn, sync: 0.003, "called fn() 0 time(s) (it returned a number without timing", "only know by measuring"),
    (only_fn, "TypeError", "How does the checker call your function"),
]


if not torch.cuda.is_available():
    WRONG_TIMERS.append((uses_cuda_synchronize, "a CUDA call needs a CUDA GPU", "The sync argument"))


@pytest.mark.parametrize(("answer", "mistake", "concept"), WRONG_TIMERS,
                         ids=lambda v: getattr(v, "__name__", None) if callable(v) else None)
def test_timing_wrong_answers(answer, mistake, concept) -> None:
    rejected(check_time_per_call(answer), mistake, concept, "01")


def test_timing_passing_a_call_instead_of_the_function() -> None:
    verdict = check_time_per_call(0.003)
    rejected(verdict, "expected a function, got float", "not what calling it returns", "01")


def test_timing_limits_are_inclusive(monkeypatch: pytest.MonkeyPatch) -> None:
    """A figure exactly on a limit passes, one a hair beyond it fails (the limits of check_time_per_call's
    docstring: from half the asked duration to twice what a call took; here a call takes exactly what it was
    asked, so that the limits are known)."""
    monkeypatch.setattr(cpu_vs_gpu._Workload, "took", lambda self: self.seconds)

    def on(limit, factor=1.0):
        def answer(fn, sync):
            for _ in range(3):  # waits for each call, as a right answer's warm-up does
                fn()
                sync()
            return limit(fn.seconds) * factor
        return answer

    accepted(check_time_per_call(on(lambda s: 2 * s)))
    accepted(check_time_per_call(on(lambda s: 0.5 * s)))
    rejected(check_time_per_call(on(lambda s: 2 * s, 1 + 1e-9)), "but whose first call costs", "Section 3.1", "01")
    exercises._failures.clear()  # a first try again
    rejected(check_time_per_call(on(lambda s: 0.5 * s, 1 - 1e-9)), "about 1/2 of one call", "what do you divide",
             "01")


def loop_of_calls(fn, sync):
    """One sample of a synchronised loop, divided by its count (the loop's mean is fine once warmed up)."""
    for _ in range(2):
        fn()
    sync()
    start = time.perf_counter_ns()
    for _ in range(8):
        fn()
    sync()
    return (time.perf_counter_ns() - start) / 8 / 1e9


def sorted_middle(fn, sync):
    """Median by hand, nanosecond clock, fewer samples."""
    fn()
    samples = []
    for _ in range(7):
        sync()
        t0 = time.perf_counter_ns()
        fn()
        sync()
        samples.append(time.perf_counter_ns() - t0)
    return sorted(samples)[len(samples) // 2] * 1e-9


@pytest.mark.parametrize("answer", [loop_of_calls, sorted_middle, "notebook"])
def test_timing_right_answers(answer) -> None:
    if answer == "notebook":
        answer = notebook_solution("01_cpu_vs_gpu", "time_per_call", {"time": time, "statistics": statistics})
    accepted(check_time_per_call(answer))


# --- the checker's first tests (from tests/test_cpu_vs_gpu.py) -----------------------------------------------

def right(fn, sync, warmup=3, repeat=10):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def right_loop(fn, sync, warmup=3, number=10):
    """Also right: one sample of a loop of calls, synchronised at both ends, divided by the count."""
    for _ in range(warmup):
        fn()
    sync()
    start = time.perf_counter()
    for _ in range(number):
        fn()
    sync()
    return (time.perf_counter() - start) / number


def never_syncs(fn, sync, warmup=3, repeat=10):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def sync_only_before(fn, sync, warmup=3, repeat=10):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        sync()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def sync_only_after_loop(fn, sync, warmup=3, number=10):
    """Forgets to wait for the warm-up work before starting the clock."""
    for _ in range(warmup):
        fn()
    start = time.perf_counter()
    for _ in range(number):
        fn()
    sync()
    return (time.perf_counter() - start) / number


def total_not_per_call(fn, sync, warmup=3, number=10):
    return right_loop(fn, sync, warmup, number) * number


def milliseconds(fn, sync):
    return right(fn, sync) * 1e3


def no_warmup_mean(fn, sync, repeat=10):
    times = []
    for _ in range(repeat):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.mean(times)


def test_right_answers_pass():
    for fn in (right, right_loop):
        verdict = check_time_per_call(fn)
        assert verdict, str(verdict)
        assert "✔ Correct" in str(verdict)


def test_missing_synchronize_is_caught():
    verdict = check_time_per_call(never_syncs)
    assert not verdict
    assert "never calls sync()" in verdict.message
    assert "queue" in verdict.message


def test_synchronize_only_before_the_call_is_caught():
    verdict = check_time_per_call(sync_only_before)
    assert not verdict
    assert "clock stops before the work is done" in verdict.message
    assert "has the device finished" in verdict.hint and "sync() after fn()" in verdict.closer


def test_work_queued_before_the_clock_starts_is_caught():
    verdict = check_time_per_call(sync_only_after_loop)
    assert not verdict
    assert "queued before the clock started" in verdict.message


@pytest.mark.parametrize(("answer", "expected"), [
    (total_not_per_call, "total over all the calls"),
    (milliseconds, "milliseconds"),
    (no_warmup_mean, "first call costs"),
    (lambda fn, sync: None, "not a number of seconds"),
    (lambda fn, sync: 0.004, "called fn() 0 time(s)"),
    (lambda fn, sync: -1.0, "a negative duration"),
    ("not a function", "expected a function"),
])
def test_wrong_results_are_explained(answer, expected):
    verdict = check_time_per_call(answer)
    assert not verdict
    assert expected in str(verdict)
    assert verdict.hint


def test_uses_cuda_synchronize_on_a_machine_without_cuda():
    def cuda_sync(fn, sync):
        fn()
        torch.cuda.synchronize()
        return 0.003

    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    verdict = check_time_per_call(cuda_sync)
    assert not verdict and "raised" in verdict.message and "sync argument" in verdict.hint


def test_simulated_device_is_asynchronous():
    clock = [0.0]
    dev = SimulatedAsyncDevice(clock=lambda: clock[0], sleep=lambda s: clock.__setitem__(0, clock[0] + s))
    dev.launch(1.0)
    dev.launch(2.0)
    assert clock[0] == 0.0 and dev.pending() == pytest.approx(3.0)  # launching did not wait
    dev.synchronize()
    assert clock[0] == pytest.approx(3.0) and dev.pending() == 0.0
    assert (dev.launches, dev.syncs) == (2, 1)
    with pytest.raises(ValueError):
        dev.launch(-1)


def test_verdicts_hold_when_every_sleep_wakes_late(monkeypatch):
    """On a loaded CI runner a sleeping thread wakes milliseconds late (a right answer once measured 7.95 ms for
    3 ms of work): the limits follow what the work really took, so right answers pass and wrong ones still fail."""
    real_sleep = time.sleep

    def late_sleep(seconds):
        real_sleep(seconds + 0.005)

    monkeypatch.setattr(time, "sleep", late_sleep)
    monkeypatch.setattr(cpu_vs_gpu.SimulatedAsyncDevice.__init__, "__defaults__", (time.perf_counter, late_sleep))
    for fn in (right, right_loop):
        assert check_time_per_call(fn), fn.__name__
    for answer, expected in [(never_syncs, "never calls sync()"), (total_not_per_call, "total over all the calls"),
                             (milliseconds, "milliseconds"), (no_warmup_mean, "first call costs"),
                             (sync_only_after_loop, "queued before the clock started")]:
        verdict = check_time_per_call(answer)
        assert not verdict and expected in str(verdict), (answer.__name__, str(verdict))


def test_work_queued_before_the_clock_is_found_however_late_the_device_wakes(monkeypatch):
    """Under heavy load a synchronize() wakes tens of milliseconds late, which once made the warm-up work that
    sync_only_after_loop times look like one slow call: the order of its calls (no sync() between the warm-up
    and the timed calls) gives it away whatever the durations."""
    monkeypatch.setattr(cpu_vs_gpu._Workload, "took", lambda self: 1.0)  # every call "took" a second
    verdict = check_time_per_call(sync_only_after_loop)
    assert not verdict and "queued before the clock started" in verdict.message, str(verdict)
    for fn in (right, right_loop, loop_of_calls):
        assert check_time_per_call(fn), fn.__name__
