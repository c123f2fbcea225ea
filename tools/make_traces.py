#!/usr/bin/env python3
"""Record the small GPU profiler traces that the course ships, on a CUDA host, from the repository root:

    python3 tools/make_traces.py            # writes the files below
    python3 tools/make_traces.py --out DIR  # somewhere else

Both are written the way students' own traces are: ``torch.profiler.profile`` with a ``schedule`` and
``tensorboard_trace_handler(..., use_gzip=True)``, so each is a gzipped Chrome trace with ``ProfilerStep#N``
annotations, a Python thread and the autograd engine's backward thread.

- ``course_utils/data/mystery_steps.json.gz``: notebook 07's profile-reading exercise. Three training steps
  of a small CNN whose batches come from a ``DataLoader`` without workers over `DecodedImages` (each item
  costs real CPU work); each step also logs its loss with ``.item()``. Its bottleneck is for the student
  to find, so this docstring does not name it.
- ``tests/data/gpu_sync_steps.json.gz``: the tests of ``course_utils.performance.traces``. Two training steps of the
  small GPT, each ending with one ``loss.item()`` and one ``torch.cuda.synchronize()``: exactly four host
  waits, and backward on a thread of its own.

It refuses to run without a CUDA GPU. After running it, commit the files; `make test` reads them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

ROOT = Path(__file__).resolve().parents[1]
ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
sys.path.insert(0, str(ROOT))
from course_utils.models import GPT, GPTConfig, token_batch  # noqa: E402
from course_utils.performance.datasets import DecodedImages  # noqa: E402


def _profile(steps: int, target: Path, body: Callable[[], None]) -> None:
    """Profile ``steps`` active steps after one warm-up step; write the gzipped trace to ``target``."""
    with tempfile.TemporaryDirectory() as tmp:
        with profile(activities=ACTIVITIES,
                     schedule=schedule(wait=0, warmup=1, active=steps, repeat=1),
                     on_trace_ready=tensorboard_trace_handler(tmp, use_gzip=True)) as prof:
            for _ in range(1 + steps):
                body()
                prof.step()
        (written,) = Path(tmp).glob("*.pt.trace.json.gz")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(written, target)
    print(f"wrote {target} ({target.stat().st_size} bytes)")


def mystery_steps(target: Path) -> None:
    torch.manual_seed(0)
    cnn = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, stride=2), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).cuda()
    opt = torch.optim.SGD(cnn.parameters(), lr=0.01)
    batches = iter(torch.utils.data.DataLoader(DecodedImages(n=256, size=64, work=4), batch_size=32))
    losses = []

    def step() -> None:
        x, y = next(batches)
        loss = F.cross_entropy(cnn(x.cuda()), y.cuda())
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())  # logging

    _profile(3, target, step)


def gpu_sync_steps(target: Path) -> None:
    cfg = GPTConfig()
    torch.manual_seed(0)
    model = GPT(cfg).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = token_batch(cfg, torch.Generator().manual_seed(0)).cuda()

    def step() -> None:
        loss = model.loss(tokens)
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss.item()  # host wait 1
        torch.cuda.synchronize()  # host wait 2

    _profile(2, target, step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="write both files into this folder instead")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("make_traces.py needs a CUDA GPU: these traces show real GPU kernels")
    mystery = args.out / "mystery_steps.json.gz" if args.out else ROOT / "course_utils/data/mystery_steps.json.gz"
    waits = args.out / "gpu_sync_steps.json.gz" if args.out else ROOT / "tests/data/gpu_sync_steps.json.gz"
    mystery_steps(mystery)
    gpu_sync_steps(waits)
    meta = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
            "date": datetime.now(timezone.utc).date().isoformat(), "script": "tools/make_traces.py"}
    (waits.parent / "gpu_traces.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
