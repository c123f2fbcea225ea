#!/usr/bin/env python3
"""`make gpu-check GPU_BUDGET_GB=15`: run a command with only that much GPU memory left free on each visible
GPU, as on a student's smaller card (a Colab T4 has about 15 GiB). A helper process takes the rest of each
GPU's free memory and holds it until the command ends.

    python tools/gpu_budget.py --leave-gib 15 -- python -m pytest --nbval-lax notebooks

The command sees the same GPU with less memory free: ``torch.cuda.mem_get_info()`` reports what is left, and
an allocation beyond it fails with CUDA's out-of-memory error, as it would on the smaller card (the command's
own CUDA context comes out of the budget too, as it does there). What this cannot imitate: the smaller card's
speed, its compute capability (a T4 has no bf16 tensor cores), or its total memory as
``torch.cuda.get_device_properties(i).total_memory`` reports it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

GIB = 2**30
READY = "gpu_budget: holding"


def bytes_to_hold(free: int, leave: int) -> int:
    """How many bytes to take from a GPU with ``free`` bytes free so that ``leave`` stay free (0 when fewer
    than ``leave`` are free already)."""
    if leave <= 0:
        raise ValueError(f"the memory to leave free must be positive, got {leave} bytes")
    return max(0, free - leave)


def hold(leave: int) -> None:  # pragma: no cover - needs a GPU
    """In the helper process: take all but ``leave`` bytes of each GPU, say so, and wait for stdin to close."""
    import torch

    if not torch.cuda.is_available():
        sys.exit("gpu_budget needs a CUDA GPU: none is visible")
    kept = []
    for i in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(i)
        n = bytes_to_hold(free, leave)
        if n:
            kept.append(torch.empty(n, dtype=torch.uint8, device=f"cuda:{i}"))
        free_after, _ = torch.cuda.mem_get_info(i)
        print(f"{READY} {n / GIB:.1f} GiB of GPU {i} ({torch.cuda.get_device_name(i)}, {total / GIB:.1f} GiB): "
              f"{free_after / GIB:.1f} GiB left free", flush=True)
    print(f"{READY}: ready", flush=True)
    sys.stdin.read()  # until the command has ended and the parent closes the pipe


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leave-gib", type=float, required=True, help="GiB to leave free on each GPU")
    parser.add_argument("--hold", action="store_true", help=argparse.SUPPRESS)  # the helper process itself
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to run")
    args = parser.parse_args(argv)
    leave = int(args.leave_gib * GIB)
    bytes_to_hold(GIB, leave)  # a bad --leave-gib fails here, before any process starts
    if args.hold:  # pragma: no cover - needs a GPU
        hold(leave)
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    helper = subprocess.Popen([sys.executable, __file__, "--hold", "--leave-gib", str(args.leave_gib)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert helper.stdin is not None and helper.stdout is not None
    for line in helper.stdout:
        print(line.rstrip(), flush=True)
        if line.startswith(f"{READY}: ready"):
            break
    else:  # the helper ended without holding anything: say why, run nothing
        return helper.wait() or 1
    try:
        return subprocess.run(command).returncode
    finally:
        helper.stdin.close()
        helper.wait()


if __name__ == "__main__":
    sys.exit(main())
