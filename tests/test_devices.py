"""get_device: the default choice, COURSE_DEVICE, and clear errors for devices that are not there."""

from __future__ import annotations

import pytest
import torch

import course_utils.devices as devices
from course_utils import DeviceError, available_devices, get_device


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    monkeypatch.delenv("COURSE_DEVICE", raising=False)


@pytest.fixture
def cpu_only(monkeypatch):
    monkeypatch.setattr(devices, "cuda_device_count", lambda: 0)
    monkeypatch.setattr(devices, "_mps_available", lambda: False)
    monkeypatch.setattr(devices, "_other_accelerator", lambda: None)


@pytest.fixture
def one_gpu(monkeypatch):
    monkeypatch.setattr(devices, "cuda_device_count", lambda: 1)
    monkeypatch.setattr(devices, "_mps_available", lambda: False)
    monkeypatch.setattr(devices, "_other_accelerator", lambda: None)
    monkeypatch.setattr(devices, "_current_cuda_index", lambda: 0)


def test_default_is_cpu_without_accelerators(cpu_only):
    assert get_device() == torch.device("cpu")
    assert available_devices() == ["cpu"]


def test_default_prefers_cuda(one_gpu):
    assert get_device() == torch.device("cuda", 0)
    assert available_devices() == ["cuda:0", "cpu"]


def test_default_prefers_mps_over_cpu(monkeypatch, cpu_only):
    monkeypatch.setattr(devices, "_mps_available", lambda: True)
    assert get_device() == torch.device("mps")
    assert get_device("mps:0") == torch.device("mps")


def test_other_accelerator(monkeypatch, cpu_only):
    monkeypatch.setattr(devices, "_other_accelerator", lambda: ("xpu", 2))
    assert get_device() == torch.device("xpu", 0)
    assert get_device("xpu:1") == torch.device("xpu", 1)
    with pytest.raises(DeviceError, match="only 2 xpu"):
        get_device("xpu:2")


def test_named_devices(one_gpu):
    assert get_device("cpu") == torch.device("cpu")
    assert get_device("cuda") == torch.device("cuda", 0)
    assert get_device(" cuda:0 ") == torch.device("cuda", 0)
    assert get_device(torch.device("cuda", 0)) == torch.device("cuda", 0)


@pytest.mark.parametrize("name, fragment", [
    ("cuda:3", "only 1 CUDA GPU(s) are visible"),
    ("gpu", "PyTorch calls NVIDIA GPUs 'cuda'"),
    ("", "the device name is empty"),
    ("cpu:1", "only one CPU device"),
    ("mps", "MPS (Apple-silicon GPUs) is not available"),
    ("banana", "is not a device name"),
])
def test_bad_names_on_one_gpu(one_gpu, name, fragment):
    with pytest.raises(DeviceError, match=fragment.replace("(", r"\(").replace(")", r"\)")) as info:
        get_device(name)
    assert "This machine has" in str(info.value) or "this machine has" in str(info.value)
    assert "cuda:0, cpu" in str(info.value) or name == "cpu:1"


def test_cuda_without_cuda_names_what_exists(cpu_only):
    with pytest.raises(DeviceError) as info:
        get_device("cuda")
    msg = str(info.value)
    assert "'cuda'" in msg and "This machine has cpu" in msg
    assert not isinstance(info.value, AssertionError)


def test_not_a_string(cpu_only):
    with pytest.raises(DeviceError, match="expected a device name"):
        get_device(3)  # type: ignore[arg-type]


def test_env_override(monkeypatch, one_gpu):
    monkeypatch.setenv("COURSE_DEVICE", "cpu")
    assert get_device() == torch.device("cpu")
    monkeypatch.setenv("COURSE_DEVICE", "")
    assert get_device() == torch.device("cuda", 0)


def test_env_nonsense_fails_clearly_at_first_use(monkeypatch, cpu_only):
    import course_utils  # importing never fails because of the variable

    monkeypatch.setenv("COURSE_DEVICE", "nonsense")
    assert course_utils.get_device is get_device
    with pytest.raises(DeviceError, match=r"COURSE_DEVICE='nonsense' in the environment: 'nonsense' is not"):
        get_device()


def test_env_missing_device(monkeypatch, cpu_only):
    monkeypatch.setenv("COURSE_DEVICE", "cuda:1")
    with pytest.raises(DeviceError, match="COURSE_DEVICE='cuda:1'"):
        get_device()


def test_real_machine_is_consistent():
    dev = get_device()
    assert str(dev) in available_devices() or f"{dev.type}:0" in available_devices()
    torch.zeros(1, device=dev)  # the chosen device really works


def test_accelerator_type_is_the_one_probe(monkeypatch):
    """accelerator_type asks torch.accelerator; the other modules ask accelerator_type."""
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    assert devices.accelerator_type() is None
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a, **k: torch.device("xpu"))
    monkeypatch.setattr(torch.accelerator, "device_count", lambda: 3)
    assert devices.accelerator_type() == "xpu"
    assert devices._other_accelerator() == ("xpu", 3)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a, **k: torch.device("mps"))
    assert devices._other_accelerator() is None  # MPS has its own branch, CUDA too


# ------------------------------------------------------------- the helpers' entry points: find_device, device_in_use

def test_find_device_is_get_devices_check_without_the_message(one_gpu):
    assert devices.find_device("cuda") == torch.device("cuda", 0) == get_device("cuda")
    assert devices.find_device(" cpu ") == torch.device("cpu")
    assert devices.find_device(torch.device("cuda", 0)) == torch.device("cuda", 0)
    for absent in ("cuda:1", "mps", "cpu:1", "xpu"):
        assert devices.find_device(absent) is None
        with pytest.raises(DeviceError):
            get_device(absent)  # the same verdict, with its reason
    for not_a_device in ("gpu", "", "banana"):
        with pytest.raises(DeviceError, match="find_device"):
            devices.find_device(not_a_device)


def test_find_device_counts_other_accelerators(monkeypatch, cpu_only):
    monkeypatch.setattr(devices, "_other_accelerator", lambda: ("xpu", 2))
    assert devices.find_device("xpu") == torch.device("xpu", 0)
    assert devices.find_device("xpu:1") == torch.device("xpu", 1)
    assert devices.find_device("xpu:2") is None


def test_device_in_use_counts_cuda_once_it_is_initialised(monkeypatch, one_gpu):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert devices.device_in_use() == torch.device("cpu")  # nothing can be queued on an unused GPU
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert devices.device_in_use() == torch.device("cuda", 0)


def test_device_in_use_follows_get_devices_order_without_cuda(monkeypatch, cpu_only):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert devices.device_in_use() == torch.device("cpu")
    monkeypatch.setattr(devices, "_other_accelerator", lambda: ("xpu", 2))
    assert devices.device_in_use() == torch.device("xpu", 0)
    monkeypatch.setattr(devices, "_mps_available", lambda: True)
    assert devices.device_in_use() == torch.device("mps")


def test_device_in_use_ignores_course_device(monkeypatch, cpu_only):
    """COURSE_DEVICE says where new work goes; device_in_use says where work is (and never raises)."""
    monkeypatch.setenv("COURSE_DEVICE", "nonsense")
    assert devices.device_in_use() == torch.device("cpu")
