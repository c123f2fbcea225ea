"""The workers of notebook 05 (DistributedDataParallel): collectives, gradients three ways, DDP training.

Each runs in its own process, started by `course_utils.launch.launch` with the process group already set
up, and returns what it saw (printing from several processes would interleave at random). They live in a
module because a spawned process imports the function it runs by name (notebook 05, §1);
`print_source` shows them in the notebook.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .ddp_train import make_dataset, make_model, weights_sha256

__all__ = ["collectives_demo", "compare_gradients", "global_batch", "grads", "local_slice", "print_source",
           "tiny_model", "train_ddp"]


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


def tiny_model(seed: int = 0) -> nn.Module:
    """A small MLP without dropout (so one process and several compute exactly the same function)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))


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


def train_ddp(rank: int, world_size: int, checkpoint_dir: str, epochs: int = 3,
              use_set_epoch: bool = True) -> dict[str, Any]:
    """DDP training on the CPU: DistributedSampler (+ set_epoch), rank-0 checkpoints, barrier."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    data = make_dataset(64)
    sampler: DistributedSampler[Any] = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True,
                                                          seed=0)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    model = DDP(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    torch.manual_seed(rank)  # each rank its own dropout stream
    first_indices, losses = [], []
    for epoch in range(epochs):
        if use_set_epoch:
            sampler.set_epoch(epoch)  # reshuffle: a different order each epoch, the same on every rank
        first_indices.append(list(sampler)[:6])
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        losses.append(round(loss.item(), 2))  # 2 decimals: the same on any CPU
        if rank == 0:  # one writer: the weights are the same on every rank
            torch.save({"epoch": epoch, "model": model.module.state_dict(),
                        "optimizer": opt.state_dict()}, Path(checkpoint_dir) / f"epoch-{epoch}.pt")
        dist.barrier()  # the others wait until the checkpoint is on disk
    return {"rank": rank, "first_indices": first_indices, "losses": losses,
            "sha256": weights_sha256(model.module),
            "files": sorted(p.name for p in Path(checkpoint_dir).glob("epoch-*.pt"))}

