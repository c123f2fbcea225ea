"""The workers of notebook 05 (DistributedDataParallel; notebook 09 prints their source): collectives, gradients three ways, and what
production DDP needs (no_sync, BatchNorm and SyncBatchNorm, unused parameters, a hung rank, debug reports).

Each runs in its own process, started by `course_utils.distributed.launch.launch` with the process group already set
up, and returns what it saw (printing from several processes would interleave at random). They live in a
module because a spawned process imports the function it runs by name (notebook 05, §1);
`print_source` shows them in the notebook.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from contextlib import nullcontext
from functools import cache, partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..formatting import error_message
from ..models import small_mlp as tiny_model  # the small MLP without dropout, under the name the workers use

__all__ = ["TwoHeads", "accumulate_gradients", "batchnorm_demo", "collectives_demo",
           "compare_gradients", "global_batch", "grads", "local_slice", "mismatched_collectives",
           "print_source", "skip_a_collective", "tiny_model", "unused_parameters"]


def print_source(fn: Callable[..., Any]) -> None:
    """Print the source code of ``fn`` (to show a worker that lives in this package)."""
    print(inspect.getsource(fn).rstrip())



def collectives_demo(rank: int, world_size: int) -> list[str]:
    """all_reduce, broadcast and all_gather on small tensors; returns what this rank saw."""
    seen = []
    t = torch.tensor([rank + 1.0, 10.0 * (rank + 1)])  # rank 0: [1, 10], rank 1: [2, 20]
    seen.append(f"rank {rank} starts with      {t.tolist()}")
    dist.all_reduce(t, op=dist.ReduceOp.SUM)  # in place: every rank ends with the sum
    seen.append(f"rank {rank} after all_reduce {t.tolist()}")
    b = torch.tensor([float(rank)] * 2)
    dist.broadcast(b, src=0)  # every rank gets rank 0's tensor
    seen.append(f"rank {rank} after broadcast  {b.tolist()}")
    parts = [torch.zeros(1) for _ in range(world_size)]
    dist.all_gather(parts, torch.tensor([rank * 100.0]))  # every rank gets everyone's tensor
    seen.append(f"rank {rank} after all_gather {[p.item() for p in parts]}")
    return seen


def global_batch(size: int = 8, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """The same seeded batch on every rank; each rank then takes its own slice."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(size, 16, generator=gen), torch.randn(size, 1, generator=gen)


def local_slice(t: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    n = t.shape[0] // world_size
    return t[rank * n:(rank + 1) * n]


def grads(model: nn.Module) -> list[torch.Tensor]:
    """Every parameter's ``.grad``, in order; raises if one has none (call ``backward()`` first)."""
    found = [p.grad for p in model.parameters()]
    if any(g is None for g in found):
        raise ValueError("a parameter has no .grad: call backward() first")
    return [g for g in found if g is not None]


def compare_gradients(rank: int, world_size: int) -> dict[str, Any]:
    """Gradients three ways: all_reduce by hand, DDP, and one process on the whole batch."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    x, y = global_batch()
    xl, yl = local_slice(x, rank, world_size), local_slice(y, rank, world_size)

    # 1. By hand: local backward, then sum the gradients over ranks and divide by the world size.
    manual = tiny_model()
    nn.functional.mse_loss(manual(xl), yl).backward()
    for p in manual.parameters():
        assert p.grad is not None  # backward() filled it
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
        p.grad /= world_size

    # 2. DDP: the same all-reduce, done for us during backward (in buckets, overlapped with compute).
    ddp = DDP(tiny_model())
    nn.functional.mse_loss(ddp(xl), yl).backward()

    # 3. One process, whole batch: the reference.
    single = tiny_model()
    nn.functional.mse_loss(single(x), y).backward()

    def diff(a: nn.Module, b: nn.Module) -> float:
        return max((g - h).abs().max().item() for g, h in zip(grads(a), grads(b), strict=True))

    def close(a: nn.Module, b: nn.Module) -> bool:
        return all(torch.allclose(g, h, atol=1e-6) for g, h in zip(grads(a), grads(b), strict=True))

    return {"rank": rank,
            "manual_vs_single": close(manual, single), "ddp_vs_single": close(ddp.module, single),
            "manual_vs_ddp": close(manual, ddp.module), "max_diff": max(diff(manual, single),
                                                                       diff(ddp.module, single))}


# --- what production DDP needs ------------------------------------------------------------------------


def _ddp(model: nn.Module, **kwargs: Any) -> nn.Module:
    """``model`` wrapped in DDP on this rank's device: ``cuda:<rank>`` under NCCL, else the CPU."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    if dist.get_backend() == "nccl":
        rank = dist.get_rank()
        return DDP(model.to(f"cuda:{rank}"), device_ids=[rank], **kwargs)
    return DDP(model, **kwargs)


def accumulate_gradients(rank: int, world_size: int, micro_batches: int = 4) -> dict[str, Any]:
    """Gradient accumulation over ``micro_batches`` backward passes, without and with ``no_sync()``.

    A communication hook counts DDP's all-reduces (one per gradient bucket; this model fits in one).
    Returns, for each way, how many all-reduces ran and whether the accumulated gradients equal the
    gradients of one process on the whole batch.
    """
    x, y = global_batch(16)  # 8 samples per rank, in micro-batches of 2
    xl, yl = local_slice(x, rank, world_size), local_slice(y, rank, world_size)
    single = tiny_model()
    nn.functional.mse_loss(single(x), y).backward()

    found: dict[str, Any] = {"rank": rank}
    for way in ("every backward", "no_sync"):
        model = tiny_model()
        ddp = _ddp(model)
        calls: list[int] = []  # the hook's state: one entry per all-reduce
        ddp.register_comm_hook(calls, _counting_allreduce)  # type: ignore[operator]
        for i, (xm, ym) in enumerate(zip(xl.chunk(micro_batches), yl.chunk(micro_batches), strict=True)):
            last = i == micro_batches - 1
            with ddp.no_sync() if way == "no_sync" and not last else nullcontext():  # type: ignore[operator]
                loss = nn.functional.mse_loss(ddp(xm), ym) / micro_batches  # the mean over the big batch
                loss.backward()
        same = all(torch.allclose(g, h, atol=1e-6) for g, h in zip(grads(model), grads(single), strict=True))
        found[way] = {"all_reduces": len(calls), "equals_big_batch": same}
    return found


def _counting_allreduce(calls, bucket):
    # type: (list[int], dist.GradBucket) -> torch.futures.Future[torch.Tensor]
    """A DDP communication hook: note the bucket, then do what DDP does by default (all-reduce, divide
    by the world size).

    Its types are in a type comment, for mypy: DDP checks a hook's annotations at run time against the
    classes themselves, and this module's annotations would be strings (``from __future__ import
    annotations``); setting the classes into ``__annotations__`` would be work done at import."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    calls.append(bucket.index())
    return allreduce_hook(None, bucket)  # type: ignore[arg-type]  # None: the default process group


@cache
def _sync_buffers_flag() -> str:
    """DDP's flag for copying rank 0's buffers to every rank before each forward: ``forward_sync_buffers``
    in recent releases (torch 2.13 calls ``broadcast_buffers`` deprecated, with a warning), else
    ``broadcast_buffers``. Looked up on first use (not at import, which would import DDP), then cached."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    params = inspect.signature(DDP).parameters
    return "forward_sync_buffers" if "forward_sync_buffers" in params else "broadcast_buffers"


def _bn_model() -> nn.Module:
    """A small MLP with a BatchNorm layer: 16 features → 8 → 1."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1))


def batchnorm_demo(rank: int, world_size: int, sync: bool = False, steps: int = 3) -> dict[str, Any]:
    """BatchNorm under DDP: batch statistics per rank, and DDP's buffer sync (``broadcast_buffers``).

    ``sync=False``: a plain BatchNorm1d, trained ``steps`` steps with DDP's buffer sync on (the default)
    and off (see `_sync_buffers_flag`); a forward pre-hook records the running mean each forward starts
    with, and the ranks compare theirs. ``sync=True``: the model converted with ``convert_sync_batchnorm``
    (made for GPUs and NCCL: on the CPU, DDP refuses it, and so does the converted model's own forward;
    both messages are returned). Both report whether the first step's gradients equal those of one
    process on the whole batch.
    """
    device = torch.device(f"cuda:{rank}") if dist.get_backend() == "nccl" else torch.device("cpu")
    x, y = global_batch(16, seed=2)
    single = _bn_model().to(device)
    nn.functional.mse_loss(single(x.to(device)), y.to(device)).backward()
    xl, yl = local_slice(x, rank, world_size).to(device), local_slice(y, rank, world_size).to(device)

    found: dict[str, Any] = {"rank": rank}
    for sync_buffers in (True, False):
        model = _bn_model()
        if sync:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
            found["converted"] = type(list(model.children())[1]).__name__
        try:
            ddp = _ddp(model, **{_sync_buffers_flag(): sync_buffers})
        except ValueError as exc:  # DDP refuses SyncBatchNorm on the CPU; and SyncBatchNorm itself?
            found["error"] = error_message(exc)
            try:
                model(xl)
                found["forward_error"] = "none"
            except ValueError as forward_exc:
                found["forward_error"] = error_message(forward_exc)
            return found
        starts: list[torch.Tensor] = []  # the running mean each forward starts with
        list(model.children())[1].register_forward_pre_hook(partial(_record_running_mean, starts))
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for step in range(steps):
            opt.zero_grad()
            nn.functional.mse_loss(ddp(xl), yl).backward()
            if step == 0:
                found["grads_equal_big_batch"] = all(
                    torch.allclose(g, h, atol=1e-5)
                    for g, h in zip(grads(model), grads(single), strict=True))
            opt.step()
        mine = torch.stack(starts)
        everyone = [torch.empty_like(mine) for _ in range(world_size)]
        dist.all_gather(everyone, mine)
        found[f"sync_buffers={sync_buffers}"] = {
            "same_running_mean_at_each_forward": all(torch.equal(e, mine) for e in everyone)}
        if sync:
            break
    return found


def _record_running_mean(starts: list[torch.Tensor], module: nn.Module, args: Any) -> None:
    starts.append(module.running_mean.clone())  # type: ignore[operator]


class TwoHeads(nn.Module):
    """A trunk and two heads; ``forward`` uses only head ``a`` (head ``b`` is for another task)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.trunk = nn.Linear(16, 8)
        self.a = nn.Linear(8, 1)
        self.b = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(torch.relu(self.trunk(x)))


def unused_parameters(rank: int, world_size: int, find_unused: bool = False, steps: int = 2) -> str:
    """Train `TwoHeads` under DDP for ``steps`` steps; return the error of the step that failed, or a
    report of the steps that ran."""
    x, y = global_batch(8)
    model = TwoHeads()
    ddp = _ddp(model, find_unused_parameters=find_unused)
    for step in range(steps):
        try:
            nn.functional.mse_loss(ddp(local_slice(x, rank, world_size)), local_slice(y, rank, world_size)).backward()
        except RuntimeError as exc:
            return f"step {step}: {error_message(exc)}"
    unused = [name for name, p in model.named_parameters() if p.grad is None]
    return f"{steps} steps ran; parameters without a gradient: {unused}"


def skip_a_collective(rank: int, world_size: int, stall: float = 5.0) -> str:
    """Rank 1 never calls the ``all_reduce`` that the others call (it is busy for ``stall`` seconds, as
    if stuck in its data loader); the others wait, until the process group's timeout raises."""
    t = torch.ones(1)
    if rank == 1:
        time.sleep(stall)
        return f"rank {rank}: skipped the all_reduce"
    start = time.monotonic()
    try:
        dist.all_reduce(t)
    except RuntimeError as exc:
        return f"rank {rank} after {time.monotonic() - start:.0f} s: {error_message(exc)}"
    return f"rank {rank}: all_reduce returned {t.tolist()}"


def mismatched_collectives(rank: int, world_size: int) -> str:
    """Rank 0 calls ``all_reduce``, the others ``broadcast``: a bug that only ``TORCH_DISTRIBUTED_DEBUG=DETAIL``
    reports as such (without it the ranks wait for each other until the timeout, or worse)."""
    t = torch.ones(2)
    try:
        if rank == 0:
            dist.all_reduce(t)
        else:
            dist.broadcast(t, src=0)
    except RuntimeError as exc:
        return f"rank {rank}: {error_message(exc)}"
    return f"rank {rank}: no error, t = {t.tolist()}"
