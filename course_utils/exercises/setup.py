"""Checker for notebook 00 (setup)."""

from __future__ import annotations

from typing import Any

import torch

from . import Verdict, fail, ok

__all__ = ["check_tensor_on_device"]


def check_tensor_on_device(t: Any, device: torch.device | str) -> Verdict:
    """Exercise: a 3×3 tensor of ones, dtype float16, on ``device`` (the course device)."""
    want = torch.device(device)
    if not isinstance(t, torch.Tensor):
        return fail(f"expected a torch.Tensor, got {type(t).__name__}.",
                    "torch.ones(...) makes a tensor; pass shape, dtype= and device=.")
    if tuple(t.shape) != (3, 3):
        return fail(f"the shape is {tuple(t.shape)}, not (3, 3).", "torch.ones(3, 3, ...)")
    if t.dtype != torch.float16:
        return fail(f"the dtype is {t.dtype}, not torch.float16.", "pass dtype=torch.float16")
    if t.device.type != want.type or (want.index is not None and t.device.index != want.index):
        return fail(f"the tensor is on {t.device}, not on {want}.",
                    "pass device=device (the variable from the setup cell) to torch.ones")
    if not bool((t == 1).all()):
        return fail("not every element is 1.", "torch.ones, not torch.empty or torch.rand")
    return ok(f"a 3×3 float16 tensor of ones on {t.device}.")
