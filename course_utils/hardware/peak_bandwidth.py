"""Notebook 10: the peak memory bandwidth of common NVIDIA GPUs, the denominator of MBU (memory-bandwidth
utilisation), from the vendors' datasheets, in GB/s (10⁹ bytes per second).

A table of its own beside `course_utils.hardware.peak_flops`: the bandwidth depends on the memory a board carries,
so GPUs of one FLOP/s entry differ here (an A100 with 40 GB of HBM2 reads 1555 GB/s, with 80 GB of HBM2e 1935 or
2039). `peak_bandwidth_gbps` raises `UnknownGpuError` for a GPU that is not in the table, saying how to pass the
figure from its datasheet instead.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from .peak_flops import UnknownGpuError

__all__ = ["GPU_BANDWIDTH", "GpuBandwidth", "peak_bandwidth_gbps"]


class GpuBandwidth(NamedTuple):
    """One GPU: the pattern its ``torch.cuda.get_device_name()`` matches, its name, GB/s, the datasheet."""

    pattern: str
    name: str
    gbps: float
    source: str


_A100 = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
_V100 = "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"
GPU_BANDWIDTH: tuple[GpuBandwidth, ...] = (
    # More specific patterns first, as in peak_flops.
    GpuBandwidth(r"\bh200\b", "NVIDIA H200 (SXM and NVL)", 4800.0, "https://www.nvidia.com/en-us/data-center/h200/"),
    GpuBandwidth(r"h100.*pcie", "NVIDIA H100 PCIe", 2000.0, "https://www.nvidia.com/en-us/data-center/h100/"),
    GpuBandwidth(r"h100.*nvl", "NVIDIA H100 NVL", 3900.0, "https://www.nvidia.com/en-us/data-center/h100/"),
    GpuBandwidth(r"h100", "NVIDIA H100 (SXM)", 3350.0, "https://www.nvidia.com/en-us/data-center/h100/"),
    GpuBandwidth(r"a100.*80gb.*pcie|a100.*pcie.*80gb", "NVIDIA A100 80GB PCIe", 1935.0, _A100),
    GpuBandwidth(r"a100.*80gb", "NVIDIA A100 80GB SXM", 2039.0, _A100),
    GpuBandwidth(r"a100", "NVIDIA A100 40GB", 1555.0, _A100),
    GpuBandwidth(r"l40s", "NVIDIA L40S", 864.0, "https://www.nvidia.com/en-us/data-center/l40s/"),
    GpuBandwidth(r"\bl4\b", "NVIDIA L4", 300.0, "https://www.nvidia.com/en-us/data-center/l4/"),
    GpuBandwidth(r"\ba10\b", "NVIDIA A10", 600.0, "https://www.nvidia.com/en-us/data-center/products/a10-gpu/"),
    GpuBandwidth(r"\bt4\b", "NVIDIA T4", 320.0, "https://www.nvidia.com/en-us/data-center/tesla-t4/"),
    GpuBandwidth(r"v100", "NVIDIA V100", 900.0, _V100),
    GpuBandwidth(r"rtx 4090", "NVIDIA GeForce RTX 4090", 1008.0,
                 "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"),
)


def peak_bandwidth_gbps(device_name: str) -> float:
    """The datasheet's memory bandwidth, in GB/s, of the GPU ``device_name`` names (as
    ``torch.cuda.get_device_name()`` prints it). `UnknownGpuError` for a GPU the table does not have."""
    low = device_name.lower()
    for entry in GPU_BANDWIDTH:
        if re.search(entry.pattern, low):
            return entry.gbps
    raise UnknownGpuError(
        f"no memory bandwidth on record for {device_name!r}: look up 'memory bandwidth' in its datasheet and use "
        "that figure (GB/s) instead of peak_bandwidth_gbps(); the table has: "
        + ", ".join(e.name for e in GPU_BANDWIDTH))
