"""Checkers for notebook 05 (DistributedDataParallel).

- `check_topology`: world size, global rank, local rank and local world size of one process in a job.
- `check_average_gradients`: a student's ``average_gradients(model)`` run for real on 2 processes.
- `check_epoch_orders`: a loop over epochs that must reshuffle (``set_epoch``).

How a function written in a notebook cell gets into other processes
-------------------------------------------------------------------
The checker must run ``average_gradients`` in 2 fresh processes. Pickling the function would send only
its *name* (``__main__.average_gradients``), and a spawned or forkserver process has no notebook cells to
find it in: it fails with ``AttributeError: Can't get attribute 'average_gradients' on <module
'__main__'...>``. The fork start method would copy the notebook's memory, but it does not exist on
Windows, is no longer the default on macOS (and, from Python 3.14, on Linux), and forking a process
that runs threads (a Jupyter kernel does) can deadlock. So the checker sends the function's **source
code** (`inspect.getsource`, which works for cells because IPython keeps their text), and each worker
executes it in a fresh namespace that has ``torch``, ``dist`` (torch.distributed) and ``nn``. The
function must therefore be self-contained: it may use those names and what it imports itself.
"""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from . import Verdict, fail, ok

__all__ = ["check_average_gradients", "check_epoch_orders", "check_topology"]


# --- 1. ranks and world size ------------------------------------------------------------------------

def check_topology(answer: dict[str, int]) -> Verdict:
    """2 nodes × 4 processes; the process with local rank 2 on node 1 (nodes count from 0)."""
    want = {"world_size": 8, "rank": 6, "local_rank": 2, "local_world_size": 4}
    if not isinstance(answer, dict):
        return fail(f"expected a dict with keys {sorted(want)}, got {type(answer).__name__}.")
    missing = sorted(set(want) - set(answer))
    if missing:
        return fail(f"the answer has no {', '.join(missing)}.", f"give all four keys: {sorted(want)}")
    if answer["world_size"] != 8:
        return fail(f"world_size {answer['world_size']} is not right.",
                    "the world is every process of the job, on all nodes: nnodes × nproc_per_node")
    if answer["local_world_size"] != 4:
        return fail(f"local_world_size {answer['local_world_size']} is not right.",
                    "it counts the processes on this node only")
    if answer["local_rank"] != 2:
        return fail(f"local_rank {answer['local_rank']} is not right.",
                    "the local rank is the index on this node (it picks the GPU: cuda:<local_rank>)")
    if answer["rank"] != 6:
        hint = ("node 1 is the second node: nodes count from 0"
                if answer["rank"] == 10 else "rank = node_rank × nproc_per_node + local_rank")
        return fail(f"rank {answer['rank']} is not right.", hint)
    return ok("world size 8, rank 1 × 4 + 2 = 6, local rank 2 of 4 on its node.")


# --- 2. average_gradients on 2 processes ------------------------------------------------------------

def _source_of(fn: Callable[..., Any]) -> str:
    try:
        return textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as exc:
        raise ValueError(f"cannot read the source of {fn!r} ({exc}); define it with `def` in a cell") from None


def _run_student(rank: int, world_size: int, source: str, name: str) -> dict[str, Any]:
    """Worker (runs in each process): compare the student's gradients with the whole-batch ones."""
    from ..ddp_workers import global_batch, grads, local_slice, tiny_model

    namespace: dict[str, Any] = {"torch": torch, "dist": dist, "nn": nn}
    exec(compile(source, f"<your {name}>", "exec"), namespace)
    fn = namespace[name]
    x, y = global_batch()
    model = tiny_model()
    nn.functional.mse_loss(model(local_slice(x, rank, world_size)), local_slice(y, rank, world_size)).backward()
    local = [g.clone() for g in grads(model)]
    fn(model)
    got = [p.grad for p in model.parameters()]
    ref = tiny_model()
    nn.functional.mse_loss(ref(x), y).backward()
    want = grads(ref)

    def close(a: list[torch.Tensor | None], b: list[torch.Tensor], scale: float = 1.0) -> bool:
        return all(u is not None and torch.allclose(u, v * scale, atol=1e-6) for u, v in zip(a, b, strict=True))

    return {"ok": close(got, want), "unchanged": close(got, local),
            "summed": close(got, want, float(world_size)), "none": any(g is None for g in got)}


def check_average_gradients(fn: Callable[..., Any], world_size: int = 2) -> Verdict:
    """Run ``fn(model)`` after a local backward on ``world_size`` processes (gloo, this machine).

    Correct when every rank then holds the gradient of the whole global batch (the mean over ranks).
    """
    from ..launch import WorkerError, launch

    if not callable(fn):
        return fail(f"expected your function average_gradients, got {type(fn).__name__}.")
    try:
        source = _source_of(fn)
        results = launch(_run_student, world_size, source, fn.__name__, timeout=60)
    except ValueError as exc:
        return fail(str(exc))
    except WorkerError as exc:
        last = str(exc).strip().splitlines()[-1]
        return fail(f"your function raised in a worker process: {last}",
                    "use only torch, dist and nn (or import inside the function); all_reduce works in place")
    if all(r["ok"] for r in results):
        return ok(f"on {world_size} processes every rank now has the gradient of the whole batch.")
    if any(r["none"] for r in results):
        return fail("some parameters have no gradient any more (p.grad is None).",
                    "change p.grad in place: dist.all_reduce(p.grad, ...), then p.grad /= world size")
    if all(r["summed"] for r in results):
        return fail(f"the gradients are {world_size}× too large: all_reduce with SUM adds them up.",
                    "divide by dist.get_world_size() after the all_reduce")
    if all(r["unchanged"] for r in results):
        return fail("each rank still has only its own gradient: nothing was exchanged.",
                    "dist.all_reduce(p.grad, op=dist.ReduceOp.SUM) changes p.grad in place; "
                    "a result assigned to a new variable is lost")
    return fail("the gradients differ from those of one process on the whole batch.",
                "for every parameter: all_reduce(p.grad, SUM), then divide by the world size")


# --- 3. every epoch the same order ------------------------------------------------------------------

def _orders(sampler: Any, epochs: int, use_set_epoch: bool) -> list[list[int]]:
    out = []
    for epoch in range(epochs):
        if use_set_epoch:
            sampler.set_epoch(epoch)
        out.append(list(sampler))
    return out


def check_epoch_orders(fn: Callable[..., Any]) -> Verdict:
    """``fn(sampler, epochs)`` must return the list of indices the sampler yields in each epoch."""
    from torch.utils.data import DistributedSampler

    def fresh() -> Any:
        # A list is data enough: the sampler only asks its len(), as in the notebook's cell.
        return DistributedSampler(list(range(16)), num_replicas=2, rank=0, shuffle=True, seed=0)  # type: ignore[arg-type]

    try:
        got = fn(fresh(), 3)
    except Exception as exc:
        return fail(f"your function raised {type(exc).__name__}: {exc}")
    try:
        got = [list(map(int, o)) for o in got]
    except TypeError:
        return fail("return a list with one list of indices per epoch.", "[list(sampler) for each epoch]")
    if len(got) != 3:
        return fail(f"asked for 3 epochs, got {len(got)} orders.")
    if got == _orders(fresh(), 3, False):
        return fail("every epoch still sees the same order.",
                    "the sampler shuffles with seed + epoch; tell it the epoch before iterating it")
    if got != _orders(fresh(), 3, True):
        return fail("the orders differ from what DistributedSampler gives with set_epoch(0), (1), (2).",
                    "call sampler.set_epoch(epoch) at the start of each epoch, then list(sampler)")
    return ok("a new order each epoch, and every rank agrees on it (same seed + epoch).")
