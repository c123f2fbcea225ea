"""Notebooks 00 and 01: the environment report, what hardware and software a notebook is running on."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from typing import Any

import torch

from .devices import DeviceError, accelerator_type, available_devices, cuda_device_count, get_device

__all__ = ["COLAB_GPU_HINT", "cpu_model", "driver_version", "environment_report", "format_report", "in_colab"]

COLAB_GPU_HINT = ("You are on Colab without a GPU runtime. To get one: Runtime → Change runtime type → "
                  "Hardware accelerator: T4 GPU → Save, then run the notebook again from the top.")


def in_colab() -> bool:
    """True inside Google Colab."""
    return "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ


def cpu_model() -> str:
    """The CPU's model name, as the operating system reports it ('unknown' if it does not)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if sys.platform == "darwin" and shutil.which("sysctl"):
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                                 text=True, timeout=5)
            if out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown"


def driver_version() -> str | None:
    """The NVIDIA driver's version as nvidia-smi reports it (``'580.159.04'``), or None without one."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def _gpus() -> list[dict[str, Any]]:
    gpus = []
    for i in range(cuda_device_count()):
        p = torch.cuda.get_device_properties(i)
        gpus.append({
            "index": i,
            "name": p.name,
            "capability": f"{p.major}.{p.minor}",
            "memory_gib": round(p.total_memory / 2**30, 1),
            "multiprocessors": p.multi_processor_count,
        })
    return gpus


def environment_report(show: bool = True) -> dict[str, Any]:
    """Collect Python, PyTorch, CUDA/cuDNN builds, GPUs, CPU and MPS facts; display them as a table.

    Returns the facts as a dict. On Colab without a GPU runtime the report says how to select one.
    """
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    try:
        chosen = str(get_device())
    except DeviceError as exc:
        chosen = f"error: {exc}"
    gpus = _gpus()
    report: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "torch": torch.__version__,
        "cuda_build": torch.version.cuda,
        "cudnn": cudnn,
        "hip_build": torch.version.hip,
        "driver": driver_version() if gpus else None,
        "gpus": gpus,
        "mps_built": bool(torch.backends.mps.is_built()),
        "mps_available": bool(torch.backends.mps.is_available()),
        "accelerator": accelerator_type(),
        "cpu": cpu_model(),
        "cpu_logical_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "devices": available_devices(),
        "course_device": chosen,
        "colab": in_colab(),
        "hint": COLAB_GPU_HINT if in_colab() and not gpus else None,
    }
    if show:
        print(format_report(report))
    return report


def format_report(report: dict[str, Any]) -> str:
    """The report as an aligned, readable text table."""
    rows: list[tuple[str, str]] = [
        ("Python", f"{report['python']} on {report['platform']}"),
        ("PyTorch", report["torch"]),
        ("CUDA build", report["cuda_build"] or "none (a CPU-only or non-CUDA build of PyTorch)"),
        ("cuDNN", str(report["cudnn"]) if report["cudnn"] else "none"),
    ]
    if report.get("hip_build"):
        rows.append(("ROCm (HIP) build", report["hip_build"]))
    if report.get("driver"):
        rows.append(("NVIDIA driver", report["driver"]))
    if report["gpus"]:
        for g in report["gpus"]:
            rows.append((f"GPU {g['index']}", f"{g['name']}, compute capability {g['capability']}, "
                                              f"{g['memory_gib']} GiB, {g['multiprocessors']} SMs"))
    else:
        rows.append(("CUDA GPUs", "none visible"))
    rows.append(("MPS (Apple GPU)", "available" if report["mps_available"]
                 else ("built, not available" if report["mps_built"] else "not available")))
    rows.append(("torch.accelerator", report["accelerator"] or "none (CPU only)"))
    rows.append(("CPU", f"{report['cpu']}, {report['cpu_logical_cores']} logical cores, "
                        f"PyTorch uses {report['torch_threads']} threads"))
    rows.append(("Devices", ", ".join(report["devices"])))
    rows.append(("get_device()", report["course_device"]))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    if report.get("hint"):
        lines.append("")
        lines.append(report["hint"])
    return "\n".join(lines)
