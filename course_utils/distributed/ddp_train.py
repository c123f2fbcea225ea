"""Notebook 05 (DistributedDataParallel): a small, deterministic DDP training job, made to be launched
by ``torchrun``.

    torchrun --standalone --nproc-per-node=2 -m course_utils.distributed.ddp_train --steps 24 --checkpoint-dir DIR

(``python -m torch.distributed.run`` is the same program as ``torchrun``.)

- **Backend chosen by itself**: NCCL when every local rank has a CUDA GPU of its own, else gloo on the CPU.
- **Synthetic data made in code** (a seeded regression problem): nothing is downloaded.
- **Data split across ranks** with `DistributedSampler`, reshuffled each epoch by ``set_epoch``; a global
  batch of ``--global-batch`` samples is split evenly, so every world size of the same value does the same
  arithmetic, whichever hosts the ranks run on.
- **Snapshots** every ``--snapshot-every`` steps, written by rank 0 only, atomically (a temporary file,
  then `os.replace`), with a SHA-256 checksum of their content. They hold the model, the optimizer, the data
  position (global step, hence epoch and batch) and every rank's RNG state. A (re)started job resumes from
  the newest snapshot whose checksum is right; a corrupt or half-written one is reported and skipped.
- **Fault injection**: ``--fail-at-step K`` makes rank 1 exit at step K, on the first attempt only
  (``TORCHELASTIC_RESTART_COUNT`` is 0); with ``torchrun --max-restarts=1`` the job restarts and resumes.
- Rank 0 ends by printing exactly one line ``final weights sha256: <hex>``: a SHA-256 over the bytes of
  the final parameters (CPU float32, in `named_parameters` order). Same hash, same weights, bit for bit.
  Compare hashes only between runs on one machine: another CPU (AVX2, AVX-512, ARM) or BLAS code path
  rounds differently in the last bits, so the same job gives other bytes there.
- Losses are printed with 2 decimals, which do not depend on those last bits.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import io
import os
import re
import sys
import time
from collections.abc import Iterable
from itertools import islice
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ..models import small_mlp

__all__ = [
    "HASH_PREFIX",
    "SnapshotError",
    "find_latest_snapshot",
    "load_snapshot",
    "main",
    "make_dataset",
    "make_model",
    "save_snapshot",
    "snapshot_path",
    "weights_sha256",
]

HASH_PREFIX = "final weights sha256:"
MAGIC = b"COURSE-SNAPSHOT-1\n"
_SNAPSHOT = re.compile(r"^snapshot-(\d{6})\.pt$")
IN_FEATURES = 16  # the inputs of `course_utils.models.small_mlp`


class SnapshotError(ValueError):
    """A snapshot file is truncated, corrupt or not a snapshot at all."""


def make_dataset(n: int = 256, seed: int = 0) -> TensorDataset:
    """A seeded regression problem: ``y = x @ w + noise``, ``n`` samples of 16 features (CPU tensors)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, IN_FEATURES, generator=gen)
    w = torch.randn(IN_FEATURES, 1, generator=gen)
    y = x @ w + 0.1 * torch.randn(n, 1, generator=gen)
    return TensorDataset(x, y)


def make_model(seed: int = 0) -> nn.Module:
    """The same small MLP (with dropout, so the RNG state matters) on every rank: `course_utils.models.small_mlp`
    with ``dropout=0.1``."""
    return small_mlp(seed, dropout=0.1)


def weights_sha256(model: nn.Module) -> str:
    """SHA-256 over every parameter's bytes (CPU float32, contiguous), in `named_parameters` order."""
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode())
        h.update(p.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


# --- snapshots ---------------------------------------------------------------------------------------

def snapshot_path(directory: str | Path, step: int) -> Path:
    return Path(directory) / f"snapshot-{step:06d}.pt"


def save_snapshot(directory: str | Path, step: int, state: dict[str, Any]) -> Path:
    """Write ``state`` atomically: checksummed bytes to a temporary file, flushed, then renamed.

    A crash at any moment leaves either the previous snapshots alone or a ``.tmp`` file that
    `find_latest_snapshot` never looks at; a reader never sees half of a ``snapshot-*.pt``.
    """
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    path = snapshot_path(directory, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def load_snapshot(path: str | Path) -> dict[str, Any]:
    """Read and verify a snapshot. Raises `SnapshotError` saying what is wrong with it."""
    data = Path(path).read_bytes()
    header = len(MAGIC) + 65
    if not data.startswith(MAGIC) or len(data) < header:
        raise SnapshotError(f"{Path(path).name} is not a complete snapshot (bad header)")
    digest, payload = data[len(MAGIC):header - 1].decode("ascii", "replace"), data[header:]
    if hashlib.sha256(payload).hexdigest() != digest:
        raise SnapshotError(f"{Path(path).name} fails its checksum (corrupt or half-written)")
    try:
        return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as exc:  # the checksum matched, so this is a snapshot from another version
        raise SnapshotError(f"{Path(path).name} cannot be loaded: {exc}") from None


def find_latest_snapshot(directory: str | Path, log: Any = None) -> tuple[Path, dict[str, Any]] | None:
    """The newest snapshot in ``directory`` that verifies, as ``(path, state)``; ``None`` if there is none.

    Bad ones are skipped, newest first, each reported through ``log`` (a print-like callable).
    """
    folder = Path(directory)
    if not folder.is_dir():
        return None
    found = sorted((int(m.group(1)), p) for p in folder.iterdir() if (m := _SNAPSHOT.match(p.name)))
    for _step, path in reversed(found):
        try:
            return path, load_snapshot(path)
        except (SnapshotError, OSError) as exc:
            if log is not None:
                log(f"skipping {exc}; trying the previous snapshot")
    return None


# --- the job ------------------------------------------------------------------------------------------

def _parse(argv: Iterable[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m course_utils.distributed.ddp_train",
                                description="Deterministic DDP training job for torchrun (see module doc).")
    p.add_argument("--steps", type=int, required=True, help="total optimizer steps")
    p.add_argument("--checkpoint-dir", required=True, help="folder for snapshots (shared by all nodes)")
    p.add_argument("--snapshot-every", type=int, default=4, help="steps between snapshots (default 4)")
    p.add_argument("--global-batch", type=int, default=16, help="samples per step over all ranks")
    p.add_argument("--samples", type=int, default=256, help="size of the synthetic data set")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto (default): NCCL on GPUs when each local rank has one, else gloo on the CPU. "
                        "Use cpu when several 'nodes' are simulated on one machine: they would share its GPUs")
    p.add_argument("--fail-at-step", type=int, default=None,
                   help="rank 1 exits at this step on the first attempt (fault injection)")
    args = p.parse_args(None if argv is None else list(argv))
    if args.steps < 0 or args.snapshot_every < 1:
        p.error("--steps must be >= 0 and --snapshot-every >= 1")
    return args


def _rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _init_process_group(backend: str, rank: int, world: int, attempt: int, **kwargs: Any) -> None:
    """``dist.init_process_group(backend)``, safe across torchrun restarts.

    torchrun's agent keeps one TCPStore for all attempts (``TORCHELASTIC_USE_AGENT_STORE=True``), and
    the workers' keys are not prefixed by attempt: a restarted worker can read an address its dead
    predecessor left there and fail with "Gloo connectFullMesh failed ... Connection refused". A prefix
    per attempt keeps each attempt's keys apart.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group(backend, **kwargs)
        return
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size=world,
                          is_master=False)
    dist.init_process_group(backend, store=dist.PrefixStore(f"course-attempt-{attempt}", store),
                            rank=rank, world_size=world, **kwargs)


def _train_steps(args: argparse.Namespace, step: int, batches: Any, steps_per_epoch: int, sampler: Any, loader: Any,
                 ddp: nn.Module, model: nn.Module, opt: torch.optim.Optimizer, rank: int, world: int, attempt: int,
                 device: torch.device, log: Any) -> int:
    """The training loop from ``step`` to ``args.steps``; returns the step reached."""
    while step < args.steps:
        epoch, batch = divmod(step, steps_per_epoch)
        if batches is None or batch == 0:
            sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
            batches = islice(iter(loader), batch, None)  # resume mid-epoch at the right batch
        x, y = next(batches)
        if args.fail_at_step == step and rank == 1 and attempt == 0:
            print(f"[rank 1] simulated crash at step {step} (attempt {attempt})", file=sys.stderr, flush=True)
            os._exit(1)
        x, y = x.to(device), y.to(device)
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP averages the gradients over the ranks here
        opt.step()
        step += 1
        if step % args.snapshot_every == 0 or step == args.steps:
            rngs: list[Any] = [None] * world
            dist.all_gather_object(rngs, _rng_state(device))
            if rank == 0:
                save_snapshot(args.checkpoint_dir, step, {
                    "step": step, "world_size": world, "model": model.state_dict(),
                    "optimizer": opt.state_dict(), "rng": rngs})
            dist.barrier()  # nobody runs ahead of a snapshot that is still being written
            log(f"step {step:3d}/{args.steps}  loss {loss.item():.2f}  snapshot saved")
    return step


def _wait_for_torchrun(exc: BaseException) -> None:
    """A collective failed because another rank died (gloo: "Connection closed by peer"). Under torchrun, let
    torchrun see that rank's failure first and stop this one (SIGTERM), rather than dying here in the same
    instant: torchrun names the first failure it observes, and on a busy machine it could then name this rank."""
    message = str(exc)
    if os.environ.get("TORCHELASTIC_RUN_ID") and any(
            words in message for words in ("Connection closed by peer", "Connection reset by peer", "Broken pipe")):
        time.sleep(30)  # torchrun checks its workers every 0.1 s; its SIGTERM ends this sleep


def main(argv: Iterable[str] | None = None) -> int:
    args = _parse(argv)
    # Deterministic cuBLAS needs this before the first CUDA call (it does nothing on the CPU).
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if "RANK" not in os.environ:
        sys.exit("course_utils.distributed.ddp_train is meant to be launched by torchrun, e.g.\n"
                 "  torchrun --standalone --nproc-per-node=2 -m course_utils.distributed.ddp_train --steps 24 "
                 "--checkpoint-dir /tmp/ckpt")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if args.global_batch % world:
        sys.exit(f"--global-batch {args.global_batch} must be divisible by the world size {world}")

    # NCCL when each local rank has a GPU of its own, gloo on the CPU otherwise.
    enough_gpus = torch.cuda.is_available() and torch.cuda.device_count() >= local_world
    if args.device == "cuda" and not enough_gpus:
        sys.exit(f"--device cuda needs {local_world} visible GPU(s) on this node, one per local rank")
    use_cuda = enough_gpus and args.device != "cpu"
    if use_cuda:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        _init_process_group("nccl", rank, world, attempt, device_id=device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
        _init_process_group("gloo", rank, world, attempt)
    torch.use_deterministic_algorithms(True)

    def log(msg: str) -> None:
        if rank == 0:
            print(f"[rank 0] {msg}", flush=True)

    log(f"backend {dist.get_backend()} on {device.type}, world size {world}, attempt {attempt}")
    data = make_dataset(args.samples, args.seed)
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(
        data, num_replicas=world, rank=rank, shuffle=True, seed=args.seed, drop_last=True)
    # The loader gets its own generator: otherwise each iter() would draw from the global RNG and shift
    # the dropout stream, and a resumed job (which starts its iterator mid-epoch) would diverge.
    loader = DataLoader(data, batch_size=args.global_batch // world, sampler=sampler, drop_last=True,
                        generator=torch.Generator().manual_seed(args.seed))
    steps_per_epoch = len(loader)
    model = make_model(args.seed).to(device)
    ddp = DDP(model, device_ids=[device.index] if use_cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    torch.manual_seed(args.seed * 1000 + rank)  # each rank its own dropout stream
    if use_cuda:
        torch.cuda.manual_seed(args.seed * 1000 + rank)

    start = 0
    latest = find_latest_snapshot(args.checkpoint_dir, log)
    if latest is not None:
        path, snap = latest
        if snap["world_size"] != world:
            sys.exit(f"{path.name} was written by a job of world size {snap['world_size']}, this one has "
                     f"{world}: use another --checkpoint-dir")
        model.load_state_dict(snap["model"])
        opt.load_state_dict(snap["optimizer"])
        _set_rng_state(snap["rng"][rank], device)
        start = snap["step"]
        epoch, batch = divmod(start, steps_per_epoch)
        log(f"resumed from {path.name}: step {start}, epoch {epoch}, batch {batch}")
    else:
        log("no snapshot found: starting from step 0")

    step, batches = start, None
    try:
        step = _train_steps(args, step, batches, steps_per_epoch, sampler, loader, ddp, model, opt, rank, world,
                            attempt, device, log)
    except RuntimeError as exc:  # gloo's DistBackendError among them
        _wait_for_torchrun(exc)
        raise

    if rank == 0:
        print(f"{HASH_PREFIX} {weights_sha256(model)}", flush=True)
    # Leave cleanly. DDP holds the process group: free it first, so that destroy_process_group drops the last
    # reference and joins gloo's worker threads now, while Python is fully alive. Left to the interpreter's
    # shutdown, a worker thread that releases a tensor then needs the GIL and aborts the process ("terminate
    # called without an active exception", exit -6).
    del ddp, model, opt
    gc.collect()
    dist.barrier()  # leave together: with gloo, a rank exiting while another still talks to it can abort it
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # Leave without the interpreter's slow teardown (DDP loaded torch._dynamo): seconds per process.
    # Everything that matters is written (snapshots fsynced, output flushed).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
