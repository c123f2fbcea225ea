"""Notebook 09 (when it breaks): a distributed job that hangs, and how to see where each rank waits.

The workers run in processes of their own, started by `course_utils.distributed.launch.launch` with the process group
already joined (they live in a module: a spawned process imports the function it runs by name).

- `uneven_epoch(rank, world_size, join, dump_after, slow_last_batch)`: DDP training where rank 0 has one
  batch more than the others, then an end-of-epoch `barrier`. Without `torch.distributed.algorithms.Join`
  rank 0 waits in its last backward for an all-reduce nobody else calls. ``dump_after`` seconds into the
  epoch, `faulthandler` writes every thread's Python stack; the worker returns the lines of this module in
  it (where it waits). ``slow_last_batch`` seconds of waiting for rank 0's extra batch (a slow data loader)
  make the other ranks reach their wait first, so that their timeout fires first: gloo then closes their
  connections, and rank 0, still waiting, gets "Connection closed by peer" instead of a timeout of its own.
- `where_it_waits(dump)`: those lines, as ``function: source line``, read from a `faulthandler` dump.
"""

from __future__ import annotations

import faulthandler
import linecache
import re
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..formatting import error_message

__all__ = ["BATCHES", "log_on_one_rank", "uneven_epoch", "where_it_waits"]

BATCHES = {0: 3, 1: 2}
"""How many batches each rank has in `uneven_epoch` (rank 0 one more, as a data set split unevenly)."""

_FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>\w+)')


def where_it_waits(dump: str, module_file: str = __file__) -> list[str]:
    """The frames of ``module_file`` in a `faulthandler` dump (innermost first, as faulthandler writes them),
    each as ``function(): its source line``: no folders and no line numbers, which belong to one machine."""
    found = []
    for m in _FRAME.finditer(dump):
        if m["path"] == module_file:
            found.append(f"{m['func']}(): {linecache.getline(m['path'], int(m['line'])).strip()}")
    return found


@contextmanager
def _watched(report: dict[str, Any], dump_after: float | None) -> Iterator[None]:
    """Runs the ``with`` body of a worker: a collective's timeout ends it and its message's first line goes
    into ``report["error"]``; with ``dump_after``, `faulthandler` writes every thread's stack that many
    seconds in (once, unless the body ends first), and ``report["waits_in"]`` gets this module's frames."""
    with tempfile.TemporaryFile("w+") as dump:
        if dump_after is not None:
            faulthandler.dump_traceback_later(dump_after, file=dump)
        try:
            yield
        except RuntimeError as exc:
            report["error"] = error_message(exc, first_line=True)
        finally:
            if dump_after is not None:
                faulthandler.cancel_dump_traceback_later()
        dump.seek(0)
        report["waits_in"] = where_it_waits(dump.read())


def uneven_epoch(rank: int, world_size: int, join: bool = False, dump_after: float | None = None,
                 slow_last_batch: float = 0.0) -> dict[str, Any]:
    """One epoch of DDP on this rank's `BATCHES` batches, then a barrier (as before saving a checkpoint).
    Rank 0's extra batch takes ``slow_last_batch`` seconds to arrive.

    Returns what happened: ``"steps"`` done, ``"error"`` (the message that ended a collective's wait, if one
    came) and ``"waits_in"`` (where the Python stack stood ``dump_after`` seconds into the epoch)."""
    from torch.distributed.algorithms import Join
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    batches = [torch.randn(4, 8, generator=gen) for _ in range(BATCHES.get(rank, 2))]
    report: dict[str, Any] = {"rank": rank, "batches": len(batches), "steps": 0, "error": None, "waits_in": []}
    with _watched(report, dump_after):
        with Join([model]) if join else nullcontext():
            for i, x in enumerate(batches):
                if i == BATCHES[1]:  # the batch only rank 0 has: its data loader is slow
                    time.sleep(slow_last_batch)
                loss = model(x).pow(2).mean()
                loss.backward()  # DDP all-reduces the gradients here: every rank must take part
                opt.step()
                opt.zero_grad()
                report["steps"] += 1
        dist.barrier()  # the end of the epoch: every rank meets here
    return report


def log_on_one_rank(rank: int, world_size: int, dump_after: float | None = None) -> dict[str, Any]:
    """Rank 0 averages the loss for its log with an ``all_reduce`` that the other ranks never call (the
    logging sits behind ``if rank == 0``); then every rank meets at a barrier. Returns the same report as
    `uneven_epoch`."""
    report: dict[str, Any] = {"rank": rank, "error": None, "waits_in": []}
    loss = torch.tensor([1.0 + rank])
    with _watched(report, dump_after):
        if rank == 0:
            dist.all_reduce(loss)  # the mean loss for the log, asked of every rank by rank 0 only
        dist.barrier()
    return report
