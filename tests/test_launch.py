"""course_utils.distributed.launch: what comes back from the workers, and how a failure to send it is reported."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from course_utils.distributed import ddp_demos as W
from course_utils.distributed import launch as L


def returns_a_generator(rank: int, world_size: int) -> Iterator[int]:
    """A worker whose result cannot be pickled, so cannot be sent back to the launcher."""
    return (i for i in range(rank, world_size))


def test_an_unpicklable_result_is_reported_as_such_not_as_a_timeout() -> None:
    """The queue pickles what a worker puts in a thread of its own, which drops what it cannot pickle: the
    launcher used to wait for the result until its timeout and report that. It is this rank's error."""
    start = time.monotonic()
    with pytest.raises(L.WorkerError) as info:
        L.launch(returns_a_generator, 1, quiet=True, timeout=30)
    text = str(info.value)
    assert "returns_a_generator failed on rank 0" in text
    assert "returns_a_generator returned generator <generator object" in text
    assert "cannot be pickled to send it back to the launching process" in text
    assert "finished within" not in text and "died with exit code" not in text
    assert time.monotonic() - start < 25


def test_a_result_that_cannot_be_unpickled_here_names_its_rank() -> None:
    with pytest.raises(L.WorkerError, match=r"returns_a_generator: the result of rank 1 cannot be unpickled in "
                                            r"this process \(UnpicklingError: "):
        L._unpacked(returns_a_generator, 1, b"not a pickle")


def test_free_port_is_bindable() -> None:
    port = L.free_port()
    assert 1024 <= port < 65536


def test_launch_reports_worker_error() -> None:
    with pytest.raises(L.WorkerError, match="rank 0"):
        L.launch(W.local_slice, 2)  # called as local_slice(rank, world_size): an argument is missing


def test_launch_refuses_main_function() -> None:
    def local(rank: int, world_size: int) -> None:  # pragma: no cover - never runs
        pass

    local.__module__ = "__main__"
    with pytest.raises(L.WorkerError, match="cannot import it"):
        L.launch(local, 2)


def crashes_in_a_collective(rank: int, world_size: int) -> None:
    """Rank 1 ends by a segmentation fault, as a crash in a library's native thread would; rank 0 waits for it
    in an all-reduce and fails with gloo's "Connection closed by peer"."""
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSEGV)
    dist.all_reduce(torch.ones(1))


def test_a_crashed_rank_is_named_before_the_errors_that_follow_from_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The crashed rank sends nothing back; the report names it, how it ended and its Python stacks
    (faulthandler's, from its log), not only its peer's "Connection closed by peer"."""
    L.start_worker_pool()
    monkeypatch.setenv("COURSE_SUBPROCESS_LOGS", str(tmp_path))
    with pytest.raises(L.WorkerError) as info:
        L.launch(crashes_in_a_collective, 2, quiet=True, timeout=60)
    text = str(info.value)
    assert text.startswith("crashes_in_a_collective: rank 1 died from signal SIGSEGV (exit code -11)")
    assert "Fatal Python error: Segmentation fault" in text and "crashes_in_a_collective" in text


def test_how_a_process_ended() -> None:
    assert L._died(7) == "died with exit code 7"
    assert L._died(-signal.SIGABRT) == "died from signal SIGABRT (exit code -6)"
    assert L._died(-99) == "died from signal 99 (exit code -99)"
