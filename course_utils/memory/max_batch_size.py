"""Notebook 03 (the torch.cuda API): the largest batch size that fits in GPU memory, found by halving
after out-of-memory errors.

Recovering from ``torch.OutOfMemoryError`` has one rule people miss: do not free or retry *inside* the
``except`` block. The exception holds its traceback, the traceback holds the frames of the failed call,
and the frames hold their tensors, so inside ``except`` the memory is still in use. Leave the block
(remember only *that* it failed), then collect garbage and return the cached blocks with
``torch.cuda.empty_cache()``, then retry smaller.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["find_max_batch_size", "release_memory"]


def release_memory(full_gc: bool = False) -> None:
    """Collect unreachable Python objects, then give CUDA's cached, unused blocks back to the driver
    (no-op without initialised CUDA). Call it *after* leaving an ``except torch.OutOfMemoryError``.

    By default only the young generations are collected (where the objects of a step that just failed
    are; microseconds); ``full_gc=True`` runs a full ``gc.collect()``, which takes a good fraction of
    a second in a process that has imported torch.
    """
    gc.collect() if full_gc else gc.collect(1)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def find_max_batch_size(step: Callable[[int], Any], start: int = 1024, *, min_size: int = 1,
                        refine: bool = False, verbose: bool = False) -> int:
    """The largest batch size for which ``step(batch_size)`` runs without ``torch.OutOfMemoryError``.

    Tries ``start``, then halves after each out-of-memory error until a size fits. With
    ``refine=True`` it then bisects between the size that fitted and the one that did not, so the
    answer need not be ``start`` divided by a power of two. ``step`` should do everything one training
    step does at that batch size (forward, backward, optimizer step), since the backward pass needs
    memory of its own. Other exceptions propagate. Raises ``ValueError`` when even ``min_size`` does
    not fit.
    """
    if start < 1 or min_size < 1 or min_size > start:
        raise ValueError(f"need 1 <= min_size <= start, got start={start}, min_size={min_size}")

    def fits(size: int) -> bool:
        failed = False
        try:
            step(size)
        except torch.OutOfMemoryError:
            failed = True  # only a flag: the exception's traceback still holds the step's tensors here
        if failed:
            release_memory()  # outside the except block, so those tensors are gone
        if verbose:
            print(f"batch size {size:>6}: {'out of memory' if failed else 'fits'}")
        return not failed

    size = start
    while not fits(size):
        if size // 2 < min_size:
            raise ValueError(f"even batch size {size} does not fit (min_size={min_size}); free memory, "
                             "use a smaller model or a lower-precision dtype, or another device")
        size //= 2
    if refine and size < start:
        good, bad = size, min(2 * size, start)
        while bad - good > 1:
            mid = (good + bad) // 2
            if fits(mid):
                good = mid
            else:
                bad = mid
        size = good
    return size
