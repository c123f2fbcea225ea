"""course_utils.hardware.reference_figures: the table of notebook 01's reference figures (a GPU host's
measurements, written by benchmarks/timing_comparison.py): its columns, its ranges over rounds, and what it
shows for a missing or a malformed file."""

from __future__ import annotations

import json
import re

import pytest

from course_utils.hardware import reference_figures as reference


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
