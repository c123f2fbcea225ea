"""benchmarks/timing_comparison.py, the script that measures notebook 01's reference figures (the course's
timing against torch.utils.benchmark and a raw loop), in its parts that run without a GPU: its cases and rows
on the CPU, the pairing of rounds, the precision setting, the outliers, the nvidia-smi samples and its refusal
to run without CUDA."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from course_utils.hardware import reference_figures as reference

ROOT = Path(__file__).resolve().parents[1]


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
