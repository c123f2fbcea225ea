"""DataParallel against DistributedDataParallel on real GPUs: notebook 05's ``%%gpu`` cell (2+ CUDA GPUs).

The same compute-bound MLP and global batch trained on one GPU, with ``nn.DataParallel`` over N GPUs (one
process, threads, GPU 0 scatters and gathers) and with DDP over N GPUs (N processes, NCCL): samples per
second and peak memory per GPU. Step times come from `course_utils.benchmark`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .launch import launch

__all__ = ["gpu_model", "measure_data_parallel", "measure_ddp", "measure_ddp_worker", "measure_one_gpu"]


def gpu_model(width: int = 4096, depth: int = 8, seed: int = 0) -> nn.Module:
    """A compute-bound MLP (``depth`` square layers of ``width``), the same on every process."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


def _timed_steps(model: nn.Module, x: torch.Tensor, steps: int, warmup: int = 5) -> float:
    """Seconds per training step (forward, backward, SGD step), timed by `course_utils.benchmark`.

    The number of steps per sample is fixed (no calibration), so that every DDP rank takes exactly the
    same number of steps: each one all-reduces gradients with the others.
    """
    from ..timing import benchmark

    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).float().pow(2).mean().backward()
        opt.step()

    repeat = 3
    return benchmark(step, device=x.device, warmup=warmup, repeat=repeat,
                     number=max(1, steps // repeat)).median


def measure_one_gpu(batch: int, steps: int = 20, width: int = 4096) -> dict[str, Any]:
    """Samples/s and peak memory of plain training on cuda:0 with the whole global batch."""
    torch.cuda.reset_peak_memory_stats(0)
    model = gpu_model(width).to("cuda:0")
    x = torch.randn(batch, width, device="cuda:0")
    sec = _timed_steps(model, x, steps)
    return {"mode": "1 GPU", "samples_per_s": batch / sec, "peak_gib": [torch.cuda.max_memory_allocated(0) / 2**30]}


def measure_data_parallel(batch: int, gpus: int = 2, steps: int = 20, width: int = 4096) -> dict[str, Any]:
    """The same with ``nn.DataParallel`` over ``gpus`` GPUs (one process, threads; GPU 0 gathers)."""
    for i in range(gpus):
        torch.cuda.reset_peak_memory_stats(i)
    model = nn.DataParallel(gpu_model(width).to("cuda:0"), device_ids=list(range(gpus)))
    x = torch.randn(batch, width, device="cuda:0")
    sec = _timed_steps(model, x, steps)
    return {"mode": f"DataParallel, {gpus} GPUs", "samples_per_s": batch / sec,
            "peak_gib": [torch.cuda.max_memory_allocated(i) / 2**30 for i in range(gpus)]}


def measure_ddp_worker(rank: int, world_size: int, batch: int, steps: int = 20,
                       width: int = 4096) -> dict[str, Any]:
    """Worker for ``launch(..., backend="nccl")``: DDP on cuda:rank with batch // world_size samples."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = torch.device("cuda", rank)
    torch.cuda.reset_peak_memory_stats(dev)
    model = DDP(gpu_model(width).to(dev), device_ids=[rank])
    x = torch.randn(batch // world_size, width, device=dev)
    dist.barrier()
    sec = _timed_steps(model, x, steps)
    slowest = torch.tensor([sec], device=dev)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return {"rank": rank, "sec_per_step": slowest.item(),
            "peak_gib": torch.cuda.max_memory_allocated(dev) / 2**30}


def measure_ddp(batch: int, gpus: int = 2, steps: int = 20, width: int = 4096) -> dict[str, Any]:
    """DDP over ``gpus`` GPUs, one process each (NCCL), the same global batch."""
    rows = launch(measure_ddp_worker, gpus, batch, steps, width, backend="nccl", timeout=300)
    return {"mode": f"DDP, {gpus} GPUs", "samples_per_s": batch / rows[0]["sec_per_step"],
            "peak_gib": [r["peak_gib"] for r in rows]}

