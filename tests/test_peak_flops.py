"""course_utils.hardware.peak_flops: the datasheet peak TFLOP/s of a GPU, read from its device name and a
precision, and the errors for a GPU or a precision it does not know."""

from __future__ import annotations

import pytest

from course_utils.hardware import peak_flops as peaks


def test_peak_tflops_reads_device_names() -> None:
    assert peaks.peak_tflops("NVIDIA H200") == 989.4
    assert peaks.peak_tflops("NVIDIA H100 80GB HBM3", "tf32") == 494.7
    assert peaks.peak_tflops("NVIDIA H100 PCIe") == 756.5
    assert peaks.peak_tflops("NVIDIA A100-SXM4-80GB", "fp32") == 19.5
    assert peaks.peak_tflops("NVIDIA L4") == 121.0 and peaks.peak_tflops("NVIDIA L40S") == 362.05
    assert peaks.peak_tflops("Tesla T4", "fp16") == 65.0
    with pytest.raises(peaks.UnknownGpuError, match="no tensor cores for bf16"):
        peaks.peak_tflops("Tesla T4", "bf16")
    with pytest.raises(peaks.UnknownGpuError, match="datasheet"):
        peaks.peak_tflops("NVIDIA B300")
    with pytest.raises(peaks.UnknownGpuError, match="datasheet"):  # a Grace Hopper superchip is not an H200
        peaks.peak_tflops("NVIDIA GH200 480GB")
    assert peaks.peak_tflops("NVIDIA H200 NVL") == 835.5
    with pytest.raises(ValueError, match="precision"):
        peaks.peak_tflops("NVIDIA H200", "int8")
