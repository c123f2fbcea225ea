"""Notebook 01's helpers: the timing-exercise checker, the plots, the reference figures and the
benchmark script's parts that run without a GPU."""

from __future__ import annotations

import importlib.util
import json
import re
import statistics
import sys
import time
from pathlib import Path

import matplotlib
import pytest
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from course_utils.hardware import rate_plots as plots, reference_figures as reference  # noqa: E402
from course_utils.exercises import cpu_vs_gpu  # noqa: E402
from course_utils.exercises.cpu_vs_gpu import SimulatedAsyncDevice, check_time_per_call  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


# --- the exercise checker -------------------------------------------------------------------------

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


def no_sync(fn, sync, warmup=3, repeat=10):
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
    verdict = check_time_per_call(no_sync)
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


# --- plots ------------------------------------------------------------------------------------------

def test_crossover():
    sizes = [32, 64, 128, 256]
    assert plots.crossover(sizes, [1, 2, 3, 4], [0.5, 3, 9, 20]) == 64
    assert plots.crossover(sizes, [1, 2, 3, 4], [2, 1, 9, 20]) == 128  # a lucky point does not count
    assert plots.crossover(sizes, [1, 2, 3, 4], [0, 0, 0, 0]) is None
    with pytest.raises(ValueError):
        plots.crossover(sizes, [1, 2], [1, 2])
    with pytest.raises(ValueError):
        plots.crossover([2, 1], [1, 2], [1, 2])


def test_plots_make_figures():
    fig = plots.plot_rates([32, 64, 128], {"cpu": [1.0, 2.0, 3.0], "cuda": [0.5, 3.0, float("nan")]},
                           mark=64, title="t")
    assert len(fig.axes) == 1 and len(fig.axes[0].lines) == 3  # two series and the crossover line
    fig2, (a1, a2) = plt.subplots(1, 2)
    assert plots.plot_rates([1, 2], {"x": [1, 2]}, ax=a1) is fig2
    assert plots.plot_bars(["fp32", "bf16"], [50.0, 780.0], annotations=["1e-6", "3e-3"], ax=a2, log=True) is fig2
    arch = plots.draw_architecture()
    assert len(arch.axes) == 2 and len(arch.axes[1].collections[0].get_paths()) > 16 * 32
    with pytest.raises(ValueError):
        plots.plot_rates([1, 2], {"x": [1]})
    with pytest.raises(ValueError):
        plots.plot_rates([1, 2], {})
    with pytest.raises(ValueError):
        plots.plot_bars(["a"], [1.0, 2.0])
    plt.close("all")


# --- reference figures and the benchmark script ------------------------------------------------------

def _load_script():
    path = ROOT / "benchmarks" / "timing_comparison.py"
    spec = importlib.util.spec_from_file_location("timing_comparison", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def script():
    return _load_script()


def test_script_cases_and_rows_on_cpu(script, tmp_path):
    cases = script.make_cases("cpu", sizes=[32], copy_bytes=4096)
    names = [c.name for c in cases]
    assert names == ["matmul fp32 32²", "matmul TF32 32²", "matmul bf16 32²", "device→device 0.00390625 MiB (read+write)"]
    assert cases[0].work == 2 * 32**3 and cases[-1].work == 2 * 4096
    rows = [script.measure(c, "cpu", quick=True) for c in cases]
    for row in rows:
        assert {"course", "torch_benchmark", "raw", "ratio", "course_s", "raw_s"} <= row.keys()
        assert row["ratio"] > 0 and row["course_s"] > 0
    meta = script.environment("cpu")
    assert {"device", "torch", "cuda", "date"} <= meta.keys()
    for row in rows:  # one round in quick mode: the paired ratio is that round's
        assert row["ratio_range"] == [row["ratio"], row["ratio"]]
        assert row["ratio"] == pytest.approx(row["raw_s"] / row["course_s"])
    path = script.write_json(tmp_path / "ref.json", rows, meta)
    data = reference.load_reference_figures(path)
    assert data["rows"][0]["case"] == "matmul fp32 32²"
    table = reference.format_reference_table(data["rows"], data["meta"])
    assert "course/raw" in table and "torch.utils.benchmark" in table and "matmul bf16 32²" in table


def test_script_pairs_rounds_and_filters_cases(script, monkeypatch):
    """The ratio is the median of course/raw within each round, so a drift of the machine between
    rounds (here raw and course both slow down by 2x in the later rounds) cancels out."""
    course = iter([1.0, 1.0, 2.0, 2.0, 2.0])
    raw = iter([1.0, 1.02, 2.0, 2.04, 1.98])
    monkeypatch.setattr(script, "time_raw", lambda fn, dev, **kw: next(raw))
    monkeypatch.setattr(script, "benchmark", lambda fn, device, **kw: type("T", (), {"median": next(course)}))
    monkeypatch.setattr(script, "time_torch_benchmark", lambda fn, **kw: 1.5)
    case = script.make_cases("cpu", sizes=[8], copy_bytes=64)[0]
    row = script.measure(case, "cpu", rounds=5)
    assert row["rounds"]["course"] == [1.0, 1.0, 2.0, 2.0, 2.0]
    assert row["ratio"] == pytest.approx(1.0)  # rounds: 1.0, 1.02, 1.0, 1.02, 0.99
    assert row["ratio_range"] == pytest.approx([0.99, 1.02])
    with pytest.raises(ValueError, match="rounds"):
        script.measure(case, "cpu", rounds=0)
    monkeypatch.undo()
    rows = script.run("cpu", [16], 256, quick=True, only=["bf16", "device→device"])
    assert [r["case"] for r in rows] == ["matmul bf16 16²", "device→device 0.000244141 MiB (read+write)"]


def test_script_fp32_precision_restores_without_the_legacy_flag(script):
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    with script.fp32_precision("tf32"):
        assert matmul.fp32_precision == "tf32"
    assert matmul.fp32_precision == before
    matmul.allow_tf32  # noqa: B018 - reading it raises if the two APIs were mixed


def test_script_outliers(script):
    rows = [{"case": "a", "ratio": 1.01}, {"case": "b", "ratio": 0.9}, {"case": "c", "ratio": 1.06}]
    assert script.outliers(rows) == ["b", "c"]
    assert script.outliers(rows, tolerance=0.2) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_script_needs_cuda(script, tmp_path, capsys):
    assert script.main(["--output", str(tmp_path / "x.json")]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_reference_table_shows_round_range_and_clock():
    rows = [{"case": "matmul bf16 4096²", "unit": "TFLOP/s", "course": 665.0, "torch_benchmark": 662.0,
             "raw": 675.0, "ratio": 0.995, "ratio_range": [0.896, 1.021], "sm_clock_mhz": [1170.0, 1980.0],
             "power_w_max": 700.96},
            {"case": "device→device", "unit": "GB/s", "course": 4121.0, "torch_benchmark": 4123.0,
             "raw": 4119.0, "ratio": 1.001, "ratio_range": [0.999, 1.004]}]
    lines = reference.format_reference_table(rows, {"device": "NVIDIA H200", "torch": "2.11", "cuda": "13.0",
                                                    "date": "2026-12-02", "rounds": 11}).splitlines()
    assert lines[0].endswith("· 2026-12-02 · 11 rounds per case")
    assert re.split(r"\s{2,}", lines[1])[-3:] == ["range over rounds", "SM clock, MHz", "peak power, W"]
    assert re.split(r"\s{2,}", lines[3])[-4:] == ["0.995", "0.90–1.02", "1170–1980", "701"]
    assert re.split(r"\s{2,}", lines[4])[-4:] == ["1.001", "1.00–1.00", "–", "–"]
    assert len({len(line) for line in lines[1:4]}) == 1  # columns line up


def test_script_parses_nvidia_smi_samples(script):
    text = ("GPU-ab12, 1980, 705.10\nGPU-cd34, 345, 80.0\nGPU-ab12, 1170, 699.9\n"
            "GPU-ab12, [N/A], 700\nGPU-ab12, 19")
    assert script.parse_smi_samples(text, "ab12") == [(1980.0, 705.1), (1170.0, 699.9)]
    assert script.parse_smi_samples(text, None) == []  # two GPUs and no way to tell which is ours
    one_gpu = "GPU-ab12, 1980, 705.10\nGPU-ab12, 1170, 699.9\n"
    assert script.parse_smi_samples(one_gpu, "ffff") == [(1980.0, 705.1), (1170.0, 699.9)]
    monitor = script.ClockMonitor(torch.device("cpu"))
    with monitor:
        pass
    assert monitor.summary() == {}


def test_reference_table_format_and_missing_file(tmp_path, capsys):
    rows = [{"case": "matmul fp32 8192²", "unit": "TFLOP/s", "course": 50.6, "torch_benchmark": 50.1,
             "raw": 51.0, "ratio": 50.6 / 51.0},
            {"case": "device→device", "unit": "GB/s", "course": 4301.0, "torch_benchmark": None,
             "raw": 4310.0, "ratio": 0.998}]
    table = reference.format_reference_table(rows, {"device": "NVIDIA H200", "torch": "2.11.0", "cuda": "13.0",
                                                    "date": "2026-01-01"})
    lines = table.splitlines()
    assert lines[0] == "NVIDIA H200 · PyTorch 2.11.0 · CUDA 13.0 · 2026-01-01"
    assert "50.6" in lines[3] and "0.992" in lines[3]
    assert "4,301" in lines[4] and "–" in lines[4]
    reference.show_reference_figures(tmp_path / "missing.json")
    assert "not measured yet" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a reference-figures file"):
        reference.load_reference_figures(bad)
    reference.show_reference_figures(bad)
    assert "not a reference-figures file" in capsys.readouterr().out
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"meta": {"device": "X"}, "rows": rows}))
    reference.show_reference_figures(good)
    assert "matmul fp32 8192²" in capsys.readouterr().out


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
    for answer, expected in [(no_sync, "never calls sync()"), (total_not_per_call, "total over all the calls"),
                             (milliseconds, "milliseconds"), (no_warmup_mean, "first call costs"),
                             (sync_only_after_loop, "queued before the clock started")]:
        verdict = check_time_per_call(answer)
        assert not verdict and expected in str(verdict), (answer.__name__, str(verdict))
