"""Checker for notebook 00 (setup).

The checker sees the tensor, not the code that made it: ``torch.ones(3, 3).to(device)`` (made on the CPU,
then copied) and ``device="cpu"`` written out (right on a CPU-only machine only) look the same to it as the
intended ``device=device``. The exercise's text says so.
"""

from __future__ import annotations

from typing import Any

import torch

from . import Verdict, exercise, fail, ok

__all__ = ["check_tensor_on_device"]

_FACTORY = "torch.ones takes the sizes first, then the keyword arguments dtype= and device=."


@exercise
def check_tensor_on_device(t: Any, device: torch.device | str) -> Verdict:
    """Exercise: a 3×3 tensor of ones, dtype float16, on ``device`` (the course device).

    A device given without an index (``"cuda"``) accepts a tensor on any GPU of that type; with an index
    (``"cuda:1"``) only that one."""
    want = torch.device(device)
    if not isinstance(t, torch.Tensor):
        return fail(f"expected a torch.Tensor, got {type(t).__name__}.",
                    "A factory function of torch makes a tensor from its sizes: which one fills it with ones?",
                    _FACTORY)
    if tuple(t.shape) != (3, 3):
        return fail(f"the shape is {tuple(t.shape)}, not (3, 3).",
                    "A 3 × 3 tensor has two dimensions of size 3 each: how many sizes did you give?",
                    _FACTORY)
    if t.dtype != torch.float16:
        if t.dtype == torch.bfloat16:
            return fail("the dtype is torch.bfloat16, not torch.float16: both are 16-bit floats, but "
                        "different formats (bfloat16 keeps float32's range with fewer mantissa bits).",
                        "Which of the two 16-bit float dtypes does the exercise ask for?",
                        "torch.float16 is also called torch.half.")
        default = " (what a factory function makes when no dtype is asked for)" if t.dtype == torch.float32 else ""
        return fail(f"the dtype is {t.dtype}{default}, not torch.float16.",
                    "A tensor's element type is chosen when it is made: which argument of the factory "
                    "function asks for it?", _FACTORY)
    if t.device.type != want.type or (want.index is not None and t.device.index != want.index):
        return fail(f"the tensor is on {t.device}, not on {want}.",
                    "Section 3: the notebook chose one device for all its cells. Where does your tensor live, "
                    "and can a factory function make it there directly?",
                    "Pass the variable device (not a device name) to torch.ones, as the keyword device=.")
    if t.device.type != "meta" and not bool((t == 1).all()):
        return fail("not every element is 1.",
                    "Some factory functions fill the tensor (zeros, ones), others leave whatever was in memory "
                    "(empty) or draw random numbers (rand): which one gives ones?", _FACTORY)
    return ok(f"a 3×3 float16 tensor of ones on {t.device}.")
