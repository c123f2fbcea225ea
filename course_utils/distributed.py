"""Launch glue and worker functions for notebook 05 (DistributedDataParallel).

Processes started with the *spawn* (or *forkserver*) method do not inherit the notebook's memory: they
unpickle the function they should run by its module and name, so that function must be importable.
A function defined in a notebook cell is not, which is why the workers of the lesson live here.

- `launch(fn, world_size, *args)` starts ``world_size`` processes on this machine, joins them into a
  gloo process group over 127.0.0.1 on a free port, runs ``fn(rank, world_size, *args)`` in each and
  returns the per-rank results (or raises `WorkerError` with the failing rank's traceback).
- Workers: `collectives_demo`, `compare_gradients`, `train_ddp`.
- `torchrun(...)` / `torchrun_two_nodes(...)` run ``python -m torch.distributed.run`` (the program
  behind the ``torchrun`` command) from a cell, with a timeout, and return what the job printed.
"""

from __future__ import annotations

import inspect
import multiprocessing as mp
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .ddp_train import HASH_PREFIX, make_dataset, make_model, weights_sha256

__all__ = [
    "TorchrunResult",
    "WorkerError",
    "collectives_demo",
    "compare_gradients",
    "free_port",
    "launch",
    "measure_data_parallel",
    "measure_ddp",
    "measure_one_gpu",
    "print_source",
    "short_digest",
    "start_worker_pool",
    "tiny_model",
    "torchrun",
    "torchrun_two_nodes",
    "train_ddp",
]


class WorkerError(RuntimeError):
    """A worker process failed, or did not finish in time."""


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now (the OS picks it: bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def short_digest(digest: str | None, digits: int = 12) -> str:
    """The first ``digits`` hex digits of a digest and "…", for the eye; "(none)" when there is none."""
    return f"{digest[:digits]}…" if digest else "(none)"


def print_source(fn: Callable[..., Any]) -> None:
    """Print the source code of ``fn`` (to show a worker that lives in this package)."""
    print(inspect.getsource(fn).rstrip())


# --- launching processes from a notebook -----------------------------------------------------------

def _context(start_method: str | None) -> Any:
    """forkserver where it exists (fast: torch is imported once, in the server), else spawn."""
    if start_method is None:
        start_method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        # DistributedDataParallel imports torch._dynamo (seconds): do it once, in the server.
        ctx.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", "course_utils.distributed"])
    return ctx


def start_worker_pool(start_method: str | None = None) -> None:
    """Start the forkserver now (it imports torch once, in the background); no-op with spawn."""
    ctx = _context(start_method)
    if ctx.get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


def _entry(fn: Callable[..., Any], rank: int, world_size: int, port: int, args: tuple[Any, ...],
           queue: Any, timeout: float, backend: str) -> None:
    """What each launched process runs: join the group, call ``fn``, send back its result."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    try:
        extra: dict[str, Any] = {}
        if backend == "nccl":  # one GPU per process: rank r uses cuda:r
            torch.cuda.set_device(rank)
            extra["device_id"] = torch.device("cuda", rank)
        else:
            torch.set_num_threads(1)
        dist.init_process_group(backend, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout), **extra)
        try:
            queue.put((rank, True, fn(rank, world_size, *args)))
        finally:
            dist.destroy_process_group()
    except BaseException:
        queue.put((rank, False, traceback.format_exc()))


def launch(fn: Callable[..., Any], world_size: int = 2, *args: Any, timeout: float = 60.0,
           start_method: str | None = None, backend: str = "gloo") -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` new processes joined by a process group.

    ``backend`` is ``"gloo"`` (CPU, the default) or ``"nccl"`` (rank r on ``cuda:r``).
    ``fn`` must be importable (defined in a module, not in a notebook cell) and its arguments and
    return value picklable. Returns the results ordered by rank. Raises `WorkerError` with the first
    failing rank's traceback, or when the processes do not finish within ``timeout`` seconds.
    """
    if getattr(fn, "__module__", "__main__") in ("__main__", "__mp_main__"):
        raise WorkerError(f"{getattr(fn, '__name__', fn)!r} is defined in the notebook (module __main__); "
                          "a new process cannot import it. Put it in a module, e.g. course_utils.")
    for attempt in range(3):
        try:
            return _launch_once(fn, world_size, args, timeout, start_method, backend)
        except WorkerError as exc:
            # The free port found a moment ago can be taken by another program before rank 0 listens
            # on it: pick another port and start again.
            if "EADDRINUSE" not in str(exc) or attempt == 2:
                raise
    raise AssertionError("unreachable")


def _launch_once(fn: Callable[..., Any], world_size: int, args: tuple[Any, ...], timeout: float,
                 start_method: str | None, backend: str) -> list[Any]:
    ctx = _context(start_method)
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(fn, r, world_size, port, args, queue, timeout, backend),
                         daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerError(f"{fn.__name__}: only ranks {sorted(results)} of {world_size} finished "
                                  f"within {timeout:.0f} s")
            try:
                rank, good, value = queue.get(timeout=min(left, 1.0))
            except Exception:  # queue.Empty: check that nobody died silently
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in results]
                if dead:
                    raise WorkerError(f"{fn.__name__}: rank {dead[0]} died with exit code "
                                      f"{procs[dead[0]].exitcode}") from None
                continue
            if not good:
                raise WorkerError(_first_failure(fn.__name__, {rank: value}, queue))
            results[rank] = value
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    return [results[r] for r in range(world_size)]


def _first_failure(name: str, failures: dict[int, str], queue: Any, grace: float = 3.0) -> str:
    """The report of the lowest failing rank. When one rank fails, the others usually fail soon after
    with "connection closed by peer"; waiting a moment for their reports and naming the lowest rank
    makes the message point at the cause rather than at whichever echo arrived first."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            rank, good, value = queue.get(timeout=max(0.05, deadline - time.monotonic()))
        except Exception:  # queue.Empty
            break
        if not good:
            failures[rank] = value
    first = min(failures)
    others = sorted(set(failures) - {first})
    also = f"\n(also failed: rank {', '.join(map(str, others))})" if others else ""
    return f"{name} failed on rank {first}:\n{failures[first]}{also}"


# --- workers of the lesson (each runs in its own process, the group already set up) ----------------

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


def _local_slice(t: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    n = t.shape[0] // world_size
    return t[rank * n:(rank + 1) * n]


def compare_gradients(rank: int, world_size: int) -> dict[str, Any]:
    """Gradients three ways: all_reduce by hand, DDP, and one process on the whole batch."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    x, y = global_batch()
    xl, yl = _local_slice(x, rank, world_size), _local_slice(y, rank, world_size)

    # 1. By hand: local backward, then sum the gradients over ranks and divide by the world size.
    manual = tiny_model()
    nn.functional.mse_loss(manual(xl), yl).backward()
    for p in manual.parameters():
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
        p.grad /= world_size

    # 2. DDP: the same all-reduce, done for us during backward (in buckets, overlapped with compute).
    ddp = DDP(tiny_model())
    nn.functional.mse_loss(ddp(xl), yl).backward()

    # 3. One process, whole batch: the reference.
    single = tiny_model()
    nn.functional.mse_loss(single(x), y).backward()

    def diff(a: nn.Module, b: nn.Module) -> float:
        return max((p.grad - q.grad).abs().max().item() for p, q in zip(a.parameters(), b.parameters(), strict=True))

    def close(a: nn.Module, b: nn.Module) -> bool:
        return all(torch.allclose(p.grad, q.grad, atol=1e-6) for p, q in zip(a.parameters(), b.parameters(), strict=True))

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
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
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


# --- torchrun from a cell ---------------------------------------------------------------------------

_KEEP_STDERR = re.compile(r"simulated crash")
_LOG_PREFIX = re.compile(r"^[IWE]\d{4} \d\d:\d\d:\d\d\.\d+ \d+ \S+\] ")


@dataclass
class TorchrunResult:
    """What one ``torchrun`` launch printed. ``sha256`` is the final-weights hash rank 0 printed."""

    command: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    display: str = ""
    extra: list[str] = field(default_factory=list)

    @property
    def sha256(self) -> str | None:
        for line in self.stdout.splitlines():
            if line.startswith(HASH_PREFIX):
                return line[len(HASH_PREFIX):].strip()
        return None

    def notable_stderr(self) -> list[str]:
        """torchrun's own messages worth reading (crash, failure, restart), without log prefixes or pids."""
        keep = []
        for line in self.stderr.splitlines():
            if _KEEP_STDERR.search(line) and not line.startswith("[rank"):
                line = _LOG_PREFIX.sub("", line)
                line = re.sub(r"\(pid: \d+\)", "(pid: <PID>)", line)
                line = re.sub(r"of binary: \S+", "of binary: python", line)
                keep.append(line)
            elif line.startswith("[rank 1] simulated crash"):
                keep.append(line)
        return keep

    def show(self, stderr: bool = True) -> None:
        """Print the command, rank 0's lines, and torchrun's notable messages.

        The final-weights hash is shortened to its first 12 hex digits, followed by "…": the bytes of
        the weights depend on the CPU's instruction set, so the hash is for the eye (and for comparing
        runs on this machine, in code), not a value to expect elsewhere.
        """
        print(f"$ {self.display}")
        for line in self.stdout.splitlines():
            if line.startswith(HASH_PREFIX):
                line = f"{HASH_PREFIX} {short_digest(line[len(HASH_PREFIX):].strip())}"
            print(f"  {line}")
        if stderr:
            for line in self.notable_stderr():
                print(f"  (stderr) {line}")
        print(f"  exit code {self.returncode}")


def _torchrun_cmd(launcher_args: Sequence[str], train_args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *launcher_args,
            "-m", "course_utils.ddp_train", *train_args]


def _display(launcher_args: Sequence[str], train_args: Sequence[str], port: int | None = None) -> str:
    text = " ".join(["torchrun", *launcher_args, "-m", "course_utils.ddp_train", *train_args])
    return text.replace(f":{port}", ":$PORT") if port else text


def _child_env() -> dict[str, str]:
    """The current environment (NCCL/multicast settings kept), with this package importable."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _popen(cmd: list[str], cwd: str | Path) -> subprocess.Popen[str]:
    return subprocess.Popen(cmd, cwd=cwd, env=_child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def _finish(proc: subprocess.Popen[str], timeout: float, t0: float, cmd: list[str],
            display: str) -> TorchrunResult:
    try:
        out, err = proc.communicate(timeout=max(1.0, timeout - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and every worker it started
        out, err = proc.communicate()
        err += f"\ntimeout: the job did not finish within {timeout:.0f} s and was killed\n"
        return TorchrunResult(cmd, -9, out, err, time.monotonic() - t0, display)
    return TorchrunResult(cmd, proc.returncode, out, err, time.monotonic() - t0, display)


def torchrun(launcher_args: Sequence[str], train_args: Sequence[str], cwd: str | Path = ".",
             timeout: float = 120.0) -> TorchrunResult:
    """Run ``torchrun LAUNCHER_ARGS -m course_utils.ddp_train TRAIN_ARGS`` and wait for it.

    Uses ``python -m torch.distributed.run`` of this interpreter (no PATH set-up needed). The job and
    all its workers are killed after ``timeout`` seconds.
    """
    cmd = _torchrun_cmd(launcher_args, train_args)
    t0 = time.monotonic()
    return _finish(_popen(cmd, cwd), timeout, t0, cmd, _display(launcher_args, train_args))


def torchrun_two_nodes(train_args: Sequence[str], nproc_per_node: int = 2, cwd: str | Path = ".",
                       timeout: float = 120.0) -> list[TorchrunResult]:
    """Two ``torchrun`` launches on this machine acting as two nodes of one job (c10d rendezvous).

    Each launch is what you would type on one host of a real cluster; here both hosts are 127.0.0.1 and
    the rendezvous port is a free one. Returns the results of node 0's and node 1's launch.
    """
    port = free_port()
    launcher = ["--nnodes=2", f"--nproc-per-node={nproc_per_node}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=course-05"]
    cmd = _torchrun_cmd(launcher, train_args)
    t0 = time.monotonic()
    procs = [_popen(cmd, cwd) for _ in range(2)]
    results: list[TorchrunResult | None] = [None, None]

    def wait(i: int) -> None:
        results[i] = _finish(procs[i], timeout, t0, cmd, _display(launcher, train_args, port))

    threads = [threading.Thread(target=wait, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for r in results if r is not None]


# --- DP vs DDP on real GPUs (used by a %%gpu cell; needs 2 CUDA GPUs) --------------------------------

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
    from .timing import benchmark

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
