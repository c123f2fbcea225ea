"""course_utils.hardware.peak_bandwidth: names as torch.cuda.get_device_name() prints them, variants, unknown GPUs."""

from __future__ import annotations

import pytest

from course_utils.hardware.peak_bandwidth import GPU_BANDWIDTH, peak_bandwidth_gbps
from course_utils.hardware.peak_flops import UnknownGpuError


@pytest.mark.parametrize("name,gbps", [
    ("NVIDIA H200", 4800), ("NVIDIA H200 NVL", 4800), ("NVIDIA H100 80GB HBM3", 3350), ("NVIDIA H100 PCIe", 2000),
    ("NVIDIA H100 NVL", 3900), ("NVIDIA A100-SXM4-40GB", 1555), ("NVIDIA A100-SXM4-80GB", 2039),
    ("NVIDIA A100 80GB PCIe", 1935), ("NVIDIA A100-PCIE-40GB", 1555), ("Tesla T4", 320), ("NVIDIA L4", 300),
    ("Tesla V100-SXM2-16GB", 900), ("NVIDIA GeForce RTX 4090", 1008), ("NVIDIA L40S", 864), ("NVIDIA A10", 600),
])
def test_device_names_find_their_datasheet_figure(name: str, gbps: float) -> None:
    assert peak_bandwidth_gbps(name) == gbps


def test_an_unknown_gpu_says_what_to_do() -> None:
    for name in ("NVIDIA GeForce GTX 1080", "NVIDIA GH200 480GB"):  # a Grace Hopper is no H200: its own memory
        with pytest.raises(UnknownGpuError, match="look up 'memory bandwidth' in its datasheet"):
            peak_bandwidth_gbps(name)


def test_every_entry_has_a_source() -> None:
    assert all(e.source.startswith("https://") and e.gbps > 0 for e in GPU_BANDWIDTH)
