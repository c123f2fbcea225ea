"""Notebook 07: the peak arithmetic rate of common NVIDIA GPUs, the denominator of MFU (model FLOPs
utilisation). Figures are the vendors' datasheet figures for **dense** math (the datasheets also print
figures "with sparsity", twice as large, that ordinary training never reaches), in TFLOP/s:

- ``fp32``: plain float32 on the ordinary (FMA) units;
- ``tf32``: float32 matrix products on tensor cores at TF32 precision;
- ``bf16`` / ``fp16``: 16-bit matrix products on tensor cores with float32 accumulation.

A precision a GPU has no tensor cores for (bf16 and tf32 on a T4 or V100) has no entry: it runs, but at
another rate. `peak_tflops` raises `UnknownGpuError` for a GPU that is not in the table, saying how to
pass the peak from its datasheet instead.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["GPU_PEAKS", "GpuPeaks", "UnknownGpuError", "peak_tflops"]

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


class GpuPeaks(NamedTuple):
    """One GPU of the table: the pattern its ``torch.cuda.get_device_name()`` matches, its name, the dense
    peak TFLOP/s per precision, and the datasheet they come from."""

    pattern: str
    name: str
    tflops: dict[str, float]
    source: str


_HOPPER = "https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper"
GPU_PEAKS: tuple[GpuPeaks, ...] = (
    # More specific patterns first: "H200 NVL" before "H200", "H100 PCIe" before "H100".
    GpuPeaks(r"\bh200 nvl", "NVIDIA H200 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
             "https://www.nvidia.com/en-us/data-center/h200/ (sparse figures halved)"),
    GpuPeaks(r"\bh200\b", "NVIDIA H200 (SXM)", {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
             "https://www.nvidia.com/en-us/data-center/h200/ (H100 SXM's rates; " + _HOPPER + ")"),
    GpuPeaks(r"h100.*pcie", "NVIDIA H100 PCIe", {"fp32": 51.2, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5},
             _HOPPER),
    GpuPeaks(r"h100(?!.*nvl)", "NVIDIA H100 (SXM)", {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4,
                                                     "fp16": 989.4}, _HOPPER),
    GpuPeaks(r"a100", "NVIDIA A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
             "https://www.nvidia.com/en-us/data-center/a100/"),
    GpuPeaks(r"l40s", "NVIDIA L40S", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05},
             "https://www.nvidia.com/en-us/data-center/l40s/"),
    GpuPeaks(r"\bl4\b", "NVIDIA L4", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0},
             "https://www.nvidia.com/en-us/data-center/l4/"),
    GpuPeaks(r"\ba10\b", "NVIDIA A10", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0},
             "https://www.nvidia.com/en-us/data-center/products/a10-gpu/"),
    GpuPeaks(r"\bt4\b", "NVIDIA T4", {"fp32": 8.1, "fp16": 65.0},
             "https://www.nvidia.com/en-us/data-center/tesla-t4/"),
    GpuPeaks(r"v100.*pcie", "NVIDIA V100 PCIe", {"fp32": 14.0, "fp16": 112.0},
             "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"),
    GpuPeaks(r"v100", "NVIDIA V100 (SXM2)", {"fp32": 15.7, "fp16": 125.0},
             "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"),
    GpuPeaks(r"rtx 4090", "NVIDIA GeForce RTX 4090", {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2},
             "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"),
    GpuPeaks(r"rtx 3090", "NVIDIA GeForce RTX 3090", {"fp32": 35.6, "tf32": 35.6, "bf16": 71.0, "fp16": 71.0},
             "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf"),
)


class UnknownGpuError(LookupError):
    """The GPU, or the precision on that GPU, is not in `GPU_PEAKS`."""


def peak_tflops(device_name: str, precision: str = "bf16") -> float:
    """The dense peak TFLOP/s of the GPU named ``device_name`` (as ``torch.cuda.get_device_name()`` gives it)
    at ``precision`` (``"fp32"``, ``"tf32"``, ``"bf16"`` or ``"fp16"``)."""
    if precision not in PRECISIONS:
        raise ValueError(f"peak_tflops: precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    name = " ".join(str(device_name).lower().replace("-", " ").split())
    for gpu in GPU_PEAKS:
        if re.search(gpu.pattern, name):
            if precision not in gpu.tflops:
                raise UnknownGpuError(
                    f"the {gpu.name} has no tensor cores for {precision} (its datasheet gives "
                    f"{', '.join(f'{k} {v:g}' for k, v in gpu.tflops.items())} TFLOP/s): {precision} runs, "
                    "but at another rate; measure it, or compare against a precision it has")
            return gpu.tflops[precision]
    known = ", ".join(g.name for g in GPU_PEAKS)
    raise UnknownGpuError(
        f"no peak known for {device_name!r} (the table has: {known}). Take the dense (not 'with sparsity') "
        f"{precision} figure from its datasheet and use that number as the peak.")
