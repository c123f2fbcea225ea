"""Notebooks 00, 01, 02, 06, 07 and 09 (and every helper that needs a device): which devices this machine has,
and a checked way to ask for one.

`get_device()` is what every notebook calls. It picks the best device present (CUDA, then Apple's
MPS, then any other `torch.accelerator` backend, then the CPU), lets the environment variable
``COURSE_DEVICE`` override that choice, and turns a request for a device that is not there into a
`DeviceError` that says what was asked for and what this machine has.

The other helpers resolve devices here too, so that the rules live in one place: `find_device(name)` is
the check of `get_device(name)` for helpers that word their own message (`load_checkpoint`'s
``map_location``), and `device_in_use()` is where this process's work is when nobody said (what
`course_utils.timing` waits for and times by default).
"""

from __future__ import annotations

import os

import torch

__all__ = [
    "DeviceError",
    "accelerator_type",
    "available_devices",
    "cuda_device_count",
    "device_in_use",
    "find_device",
    "get_device",
]

ENV_VAR = "COURSE_DEVICE"


class DeviceError(ValueError):
    """A device was asked for that this machine does not have (or that is not a device at all)."""


def cuda_device_count() -> int:
    """Number of CUDA GPUs visible to this process (0 without CUDA). Does not raise."""
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken driver install reports no GPU rather than crashing a notebook
        return 0


def accelerator_type() -> str | None:
    """This machine's accelerator as `torch.accelerator` sees it: ``'cuda'``, ``'mps'``, ``'xpu'``..., or None.

    The one place the course asks which accelerator is present. Does not initialise CUDA.
    """
    if not torch.accelerator.is_available():
        return None
    current = torch.accelerator.current_accelerator()
    return None if current is None else current.type


def _mps_available() -> bool:
    return bool(torch.backends.mps.is_available())


def _other_accelerator() -> tuple[str, int] | None:
    """(type, count) of an accelerator other than CUDA and MPS (Intel's XPU, ...), if one is present."""
    kind = accelerator_type()
    if kind is None or kind in ("cuda", "mps", "cpu"):
        return None
    return kind, int(torch.accelerator.device_count())


def available_devices() -> list[str]:
    """Every device this process can use, best first, e.g. ``['cuda:0', 'cuda:1', 'cpu']``."""
    names = [f"cuda:{i}" for i in range(cuda_device_count())]
    if _mps_available():
        names.append("mps:0")
    other = _other_accelerator()
    if other is not None:
        names += [f"{other[0]}:{i}" for i in range(other[1])]
    names.append("cpu")
    return names


def _current_cuda_index() -> int:
    """The current CUDA device, without initialising CUDA (it is 0 until something changes it)."""
    return torch.cuda.current_device() if torch.cuda.is_initialized() else 0


def _default_device(cuda: bool = True) -> torch.device:
    """The best device present; with ``cuda=False``, the best one other than CUDA."""
    if cuda and cuda_device_count() > 0:
        return torch.device("cuda", _current_cuda_index())
    if _mps_available():
        return torch.device("mps")
    other = _other_accelerator()
    if other is not None and other[1] > 0:
        return torch.device(other[0], 0)
    return torch.device("cpu")


def _have() -> str:
    """What this machine has, for a message: ``'cuda:0, cpu'``."""
    return ", ".join(available_devices())


def _parse(name: str | torch.device, origin: str) -> torch.device:
    if not isinstance(name, str | torch.device):
        raise DeviceError(f"{origin}: expected a device name such as 'cuda', 'cuda:1', 'mps' or 'cpu', "
                          f"got {type(name).__name__} {name!r}.")
    if isinstance(name, torch.device):
        return name
    text = name.strip()
    if not text:
        raise DeviceError(f"{origin}: the device name is empty. Use 'cuda', 'cuda:1', 'mps' or 'cpu'; "
                          f"this machine has {_have()}.")
    try:
        return torch.device(text)
    except (RuntimeError, ValueError):
        hint = " (PyTorch calls NVIDIA GPUs 'cuda')" if text.lower().startswith("gpu") else ""
        raise DeviceError(f"{origin}: {name!r} is not a device name{hint}. Use 'cuda', 'cuda:1', 'mps' or "
                          f"'cpu'; this machine has {_have()}.") from None


def _locate(dev: torch.device) -> torch.device | str:
    """``dev`` as it exists on this machine (CUDA's index filled in), or, when it does not exist here,
    the sentence that says why (what `DeviceError` says after the name of the request)."""
    if dev.type == "cpu":
        if dev.index not in (None, 0):
            return f"there is only one CPU device ('cpu'), not {str(dev)!r}. This machine has {_have()}."
        return torch.device("cpu")
    if dev.type == "cuda":
        count = cuda_device_count()
        if count == 0:
            why = ("this PyTorch was built without CUDA" if torch.version.cuda is None
                   else "no CUDA GPU is visible (no GPU, no driver, or CUDA_VISIBLE_DEVICES hides them)")
            return (f"asked for {str(dev)!r}, but {why}. This machine has {_have()}. "
                    "Call get_device() with no argument to take the best device present.")
        index = _current_cuda_index() if dev.index is None else dev.index
        if index >= count:
            return (f"asked for {str(dev)!r}, but only {count} CUDA GPU(s) are visible "
                    f"(cuda:0 to cuda:{count - 1}). This machine has {_have()}.")
        return torch.device("cuda", index)
    if dev.type == "mps":
        if not _mps_available():
            return (f"asked for {str(dev)!r}, but MPS (Apple-silicon GPUs) is not available here. "
                    f"This machine has {_have()}.")
        if dev.index not in (None, 0):
            return f"there is one MPS device ('mps'), not {str(dev)!r}. This machine has {_have()}."
        return torch.device("mps")
    other = _other_accelerator()
    if other is None or other[0] != dev.type:
        return f"asked for {str(dev)!r}, but no {dev.type!r} device is available. This machine has {_have()}."
    index = 0 if dev.index is None else dev.index
    if index >= other[1]:
        return (f"asked for {str(dev)!r}, but only {other[1]} {dev.type} device(s) are visible. "
                f"This machine has {_have()}.")
    return torch.device(dev.type, index)


def _check_present(dev: torch.device, origin: str) -> torch.device:
    found = _locate(dev)
    if isinstance(found, str):
        raise DeviceError(f"{origin}: {found}")
    return found


def get_device(name: str | torch.device | None = None) -> torch.device:
    """Return a `torch.device` that exists on this machine.

    With no argument: ``COURSE_DEVICE`` from the environment if it is set, otherwise the best device
    present (cuda, then mps, then another `torch.accelerator` backend, then cpu). With a name
    (``"cuda"``, ``"cuda:1"``, ``"mps"``, ``"cpu"`` or a `torch.device`): that device, checked.
    A device index is always filled in for CUDA (``"cuda"`` becomes ``cuda:<current>``).

    Raises `DeviceError` (a `ValueError`) naming what was asked for and what this machine has,
    when the device does not exist here or the name is not a device.
    """
    if name is None:
        env = os.environ.get(ENV_VAR, "")
        if env.strip():
            return _check_present(_parse(env, f"{ENV_VAR}={env!r} in the environment"),
                                  f"{ENV_VAR}={env!r} in the environment")
        return _default_device()
    origin = f"get_device({name!r})" if isinstance(name, str) else f"get_device({name})"
    return _check_present(_parse(name, origin), origin)


def find_device(name: str | torch.device) -> torch.device | None:
    """The device ``name`` names, as `get_device(name)` returns it (``"cuda"`` becomes ``cuda:<current>``),
    or None when this machine does not have it.

    For helpers that say in their own words that a device is missing (`load_checkpoint` names its
    ``map_location``); `get_device(name)` makes the same check and says why the device is missing.
    Raises `DeviceError` when ``name`` is not a device name at all (``"gpu"``, ``""``, a number).
    """
    origin = f"find_device({name!r})" if isinstance(name, str) else f"find_device({name})"
    found = _locate(_parse(name, origin))
    return None if isinstance(found, str) else found


def device_in_use() -> torch.device:
    """Where this process's work is, when nobody said: the device to wait for or to time by default.

    The best device present, in `get_device`'s order (cuda, mps, another `torch.accelerator` backend,
    cpu), except that CUDA counts only once this process has initialised it: nothing can be queued on a
    GPU that was never used, and asking must not start CUDA (seconds, and memory on the GPU). Unlike
    `get_device()`, ``COURSE_DEVICE`` is not read: it says where new work should go, not where work is.
    Does not raise.
    """
    return _default_device(cuda=torch.cuda.is_initialized())
