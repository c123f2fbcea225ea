"""course_utils.memory.max_batch_size: find_max_batch_size halves (or refines) the batch size until a step
fits, frees the tensors of the steps that ran out of memory, and lets other errors through (CPU only: the
steps are fakes that raise torch.OutOfMemoryError above a limit)."""

from __future__ import annotations

import weakref

import pytest
import torch

from course_utils.memory import max_batch_size as memory


def _fake_step(limit: int, log: list | None = None):
    def step(batch_size: int) -> None:
        activations = torch.empty(batch_size)  # stands for the step's tensors
        if log is not None:
            log.append(weakref.ref(activations))
        if batch_size > limit:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {batch_size} units.")
    return step


def test_find_max_batch_size_halves(capsys):
    assert memory.find_max_batch_size(_fake_step(300), start=1024, verbose=True) == 256
    assert capsys.readouterr().out.splitlines() == [
        "batch size   1024: out of memory", "batch size    512: out of memory", "batch size    256: fits"]
    assert memory.find_max_batch_size(_fake_step(5000), start=1024) == 1024


def test_find_max_batch_size_refine():
    assert memory.find_max_batch_size(_fake_step(300), start=1024, refine=True) == 300
    assert memory.find_max_batch_size(_fake_step(1), start=64, refine=True) == 1


def test_find_max_batch_size_frees_tensors_of_failed_steps():
    log: list = []
    memory.find_max_batch_size(_fake_step(100, log), start=800)
    assert len(log) == 4 and all(ref() is None for ref in log)


def test_find_max_batch_size_errors():
    with pytest.raises(ValueError, match="even batch size 4 does not fit"):
        memory.find_max_batch_size(_fake_step(0), start=16, min_size=4)
    with pytest.raises(ValueError):
        memory.find_max_batch_size(_fake_step(10), start=0)

    def broken(batch_size: int) -> None:
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):  # only OOM means "smaller"
        memory.find_max_batch_size(broken)
