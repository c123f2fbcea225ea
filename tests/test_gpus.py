"""course_utils.hardware.gpus: the parsers of nvidia-smi's output (the 2019 lecture's grep pipeline and the
proper ones), the reports captured on a GPU host, logical_to_physical and choose_gpus, and the queries on machines
without a GPU, without nvidia-smi or with a fake one (CPU only)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from course_utils.hardware import gpus
from course_utils.hardware.gpus import GpuMemory, NoGpuError

# Hand-written examples of the *layout* of `nvidia-smi -q -d Memory` (values made up, not a capture):
# current drivers print a Reserved line in the FB Memory Usage block; older ones did not.
CURRENT_LAYOUT = """
==============NVSMI LOG==============

Timestamp                                 : Tue Jan  1 00:00:00 2030
Driver Version                            : 999.99
CUDA Version                              : 99.9

Attached GPUs                             : 2
GPU 00000000:18:00.0
    FB Memory Usage
        Total                             : 1000 MiB
        Reserved                          : 10 MiB
        Used                              : 90 MiB
        Free                              : 900 MiB
    BAR1 Memory Usage
        Total                             : 4000 MiB
        Used                              : 1 MiB
        Free                              : 3999 MiB
    Conf Compute Protected Memory Usage
        Total                             : 0 MiB
        Used                              : 0 MiB
        Free                              : 0 MiB

GPU 00000000:2A:00.0
    FB Memory Usage
        Total                             : 1000 MiB
        Reserved                          : 10 MiB
        Used                              : 490 MiB
        Free                              : 500 MiB
    BAR1 Memory Usage
        Total                             : 4000 MiB
        Used                              : 1 MiB
        Free                              : 3999 MiB
"""


OLD_LAYOUT = "\n".join(line for line in CURRENT_LAYOUT.splitlines() if "Reserved" not in line)


# --- parsers ------------------------------------------------------------------------------------------

def test_lecture_parser_worked_on_old_layout_and_finds_nothing_now():
    assert gpus.lecture_free_memory(OLD_LAYOUT) == [900, 500]
    assert gpus.lecture_free_memory(CURRENT_LAYOUT) == []


def test_parse_memory_report_reads_fb_block_only():
    for text in (CURRENT_LAYOUT, OLD_LAYOUT):
        assert gpus.parse_memory_report(text) == [GpuMemory(0, 900, 1000), GpuMemory(1, 500, 1000)]
    assert gpus.parse_memory_report("") == []
    assert gpus.parse_memory_report("No devices were found\n") == []


@pytest.mark.skipif(shutil.which("grep") is None, reason="needs the grep program")
def test_grep_matches_real_grep():
    text = CURRENT_LAYOUT.strip("\n")
    for pattern, after in (("GPU", 4), ("Free", 0), ("Total", 2), ("Memory", 1)):
        args = ["grep", f"-A{after}", pattern] if after else ["grep", pattern]
        real = subprocess.run(args, input=text + "\n", capture_output=True,
                              text=True).stdout.splitlines()
        assert gpus.grep(text.splitlines(), pattern, after) == real, (pattern, after)


def test_parse_query_csv():
    text = "0, 142766, 143771\n1, 1024, 143771\n2, [N/A], [N/A]\nsome warning\n"
    assert gpus.parse_query_csv(text) == [GpuMemory(0, 142766, 143771), GpuMemory(1, 1024, 143771)]
    assert gpus.parse_query_csv("3, NVIDIA H200, 100, 143771\n") == [GpuMemory(3, 100, 143771)]
    assert gpus.parse_query_csv("") == []


def test_captured_query_from_gpu_host():
    text = gpus.captured_query()
    assert text is not None, "course_utils/data/nvidia_smi_query_h200.txt is committed: it must be there"
    found = gpus.parse_query_csv(text)
    assert found and all(100_000 < g.total_mib < 200_000 and g.free_mib <= g.total_mib for g in found)
    assert gpus.choose_gpus(found) == str(max(found, key=lambda g: (g.free_mib, -g.index)).index)
    report = gpus.captured_memory_report()
    assert report is not None
    assert [g.total_mib for g in found] == [g.total_mib for g in gpus.parse_memory_report(report)]


def test_captured_report_from_gpu_host():
    text = gpus.captured_memory_report()
    assert text is not None, "course_utils/data/nvidia_smi_q_memory_h200.txt is committed: it must be there"
    assert "FB Memory Usage" in text and "Reserved" in text
    assert gpus.lecture_free_memory(text) == []  # the 2019 pipeline finds nothing on this driver
    found = gpus.parse_memory_report(text)
    assert found, "the proper parser finds the GPU(s)"
    for g in found:
        assert 100_000 < g.total_mib < 200_000  # an H200 has ~141 GB
        assert 0 <= g.free_mib <= g.total_mib


def test_logical_to_physical():
    f = gpus.logical_to_physical
    assert f(None, 3) == [0, 1, 2]
    assert f("", 4) == []
    assert f("2,3", 4) == [2, 3]
    assert f("3,1", 4) == [3, 1]
    assert f(" 1, 0 ", 2) == [1, 0]
    assert f("1,7,2", 4) == [1]
    assert f("-1", 4) == []
    assert f("0,0", 4) == []
    with pytest.raises(ValueError, match="UUID"):
        f("GPU-1234", 4)


def test_choose_gpus():
    table = [GpuMemory(0, 2_100, 143_771), GpuMemory(1, 80_500, 143_771), GpuMemory(2, 139_000, 143_771),
             GpuMemory(3, 81_000, 143_771)]
    assert gpus.choose_gpus(table) == "2"
    assert gpus.choose_gpus(table, 2, 80_000) == "2,3"
    assert gpus.choose_gpus(table, 3, 80_000) == "2,3,1"
    assert gpus.choose_gpus(table, 2, allowed=[0, 1]) == "1,0"
    with pytest.raises(NoGpuError, match="only 1 qualify"):
        gpus.choose_gpus(table, 2, 100_000)
    with pytest.raises(ValueError):
        gpus.choose_gpus(table, 0)


# --- machines without a GPU, without nvidia-smi, with a fake nvidia-smi ---------------------------------

def _fake_nvidia_smi(tmp_path: Path, body: str) -> None:
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)


def test_no_nvidia_smi(monkeypatch):
    monkeypatch.setattr(gpus.shutil, "which", lambda name: None)
    with pytest.raises(NoGpuError, match="nvidia-smi is not on the PATH"):
        gpus.query_nvidia_smi()


@pytest.mark.skipif(sys.platform == "win32", reason="uses a shell script as a fake nvidia-smi")
def test_fake_nvidia_smi(monkeypatch, tmp_path):
    _fake_nvidia_smi(tmp_path, 'echo "0, 500, 1000"; echo "1, 900, 1000"')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert gpus.query_nvidia_smi() == [GpuMemory(0, 500, 1000), GpuMemory(1, 900, 1000)]
    assert [g.index for g in gpus.free_gpu_memory("nvidia-smi")] == [1, 0]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpus.pick_gpus(2) == "1,0"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert gpus.pick_gpus(1) == "0"  # a scheduler's choice is respected
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(NoGpuError, match="hides every GPU"):
        gpus.pick_gpus(1)


@pytest.mark.skipif(sys.platform == "win32", reason="uses a shell script as a fake nvidia-smi")
def test_failing_nvidia_smi(monkeypatch, tmp_path):
    _fake_nvidia_smi(tmp_path, "echo \"NVIDIA-SMI has failed because it couldn't communicate with the "
                               "NVIDIA driver.\"; exit 9")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(NoGpuError, match=r"failed \(exit 9\): NVIDIA-SMI has failed"):
        gpus.query_nvidia_smi()
    _fake_nvidia_smi(tmp_path, 'echo "No devices were found"')
    with pytest.raises(NoGpuError, match="lists no GPU"):
        gpus.query_nvidia_smi()


def test_no_gpu_at_all(monkeypatch):
    monkeypatch.setattr(gpus.shutil, "which", lambda name: None)
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(NoGpuError) as info:
        gpus.pick_gpus(1)
    msg = str(info.value)
    assert "nvidia-smi is not on the PATH" in msg and "built without CUDA" in msg and "CPU" in msg


def test_query_torch_in_subprocess(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    seen = {}

    def fake_run(code, env=None, timeout=0):
        seen.update(env)
        return json.dumps([[0, 3 * 2**30, 4 * 2**30], [1, 2**30, 4 * 2**30]]) + "\n"

    monkeypatch.setattr(gpus, "run_python", fake_run)
    assert gpus.query_torch() == [GpuMemory(0, 3072, 4096), GpuMemory(1, 1024, 4096)]
    assert seen == {"CUDA_VISIBLE_DEVICES": None, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    monkeypatch.setattr(gpus, "run_python", lambda code, env=None, timeout=0: "[]\n")
    with pytest.raises(NoGpuError, match="sees no CUDA GPU"):
        gpus.query_torch()
    monkeypatch.setattr(gpus, "run_python", lambda code, env=None, timeout=0: "Traceback ...\nboom\n")
    with pytest.raises(NoGpuError, match="probe failed"):
        gpus.query_torch()
    # with nvidia-smi missing, 'auto' falls back to the torch probe
    monkeypatch.setattr(gpus.shutil, "which", lambda name: None)
    monkeypatch.setattr(gpus, "run_python", fake_run)
    assert gpus.free_gpu_memory()[0] == GpuMemory(0, 3072, 4096)


def test_query_torch_cpu_build_does_not_start_a_process(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(gpus, "run_python", lambda *a, **k: pytest.fail("no subprocess expected"))
    with pytest.raises(NoGpuError, match="built without CUDA"):
        gpus.query_torch()
    with pytest.raises(ValueError):
        gpus.free_gpu_memory("nvml")
