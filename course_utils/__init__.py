"""Helpers for the course "GPU Usage in PyTorch".

They hide plumbing, never the lesson: device discovery (`get_device`), an environment report
(`environment_report`), timing done right (`benchmark`), recorded GPU outputs for machines without a
GPU (the ``%%gpu`` cell magic), and exercise checkers (`course_utils.exercises`).

In a notebook, ``%load_ext course_utils`` registers the ``%%gpu`` cell magic and ``%hint``.
"""

from __future__ import annotations

from typing import Any

from .devices import DeviceError, available_devices, cuda_device_count, get_device
from .environment import environment_report
from .formatting import format_seconds
from .timing import Timing, benchmark, synchronize

__version__ = "0.1.0"

__all__ = [
    "DeviceError",
    "Timing",
    "available_devices",
    "benchmark",
    "cuda_device_count",
    "environment_report",
    "format_seconds",
    "get_device",
    "load_ipython_extension",
    "synchronize",
]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext course_utils``: register the ``%%gpu NAME [--gpus N]`` cell magic and the ``%hint`` line
    magic (the closer hint of the latest failed exercise check)."""
    from .exercises import hint_magic
    from .recording import gpu_cell_magic

    ipython.register_magic_function(gpu_cell_magic, magic_kind="cell", magic_name="gpu")
    ipython.register_magic_function(hint_magic, magic_kind="line", magic_name="hint")
