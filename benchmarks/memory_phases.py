#!/usr/bin/env python3
"""Notebook 08's memory plan against the allocator, phase by phase, on a CUDA GPU.

For each job (a `GPT` shape, a batch, a precision, activation checkpointing, a ZeRO stage on one GPU, an AdamW
implementation), `course_utils.memory_plan.measure_peak` measures the allocator's peak in each phase of a step
(forward, the loss's backward, backward through the blocks, the optimizer's step) and
`course_utils.memory_plan.plan_memory` predicts them. The table and the raw figures go to a JSON file with
the device, the PyTorch and CUDA versions and the date.

    python benchmarks/memory_phases.py --output build/memory_phases        # every job: phases.json
    python benchmarks/memory_phases.py --output DIR --snapshots            # and an allocator history per
                                                                           # snapshot job (snapshot-NAME.pickle)

``--snapshots`` also writes probes.json: what the plan's small terms rest on (the cuBLAS workspaces a forward
and a backward allocate, the dtypes of LayerNorm's saved statistics, what autocast does to each norm).
Exits with status 2 on a machine without a CUDA GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course_utils.memory_plan import MEASURED_PHASES, measure_peak, plan_memory  # noqa: E402
from course_utils.models import GPTConfig  # noqa: E402

SHAPES = {
    "A": GPTConfig(vocab=8192, seq_len=1024, d_model=1024, n_heads=16, n_layers=8, batch=16),  # notebook 07's
    "B": GPTConfig(vocab=50_304, seq_len=1024, d_model=768, n_heads=12, n_layers=12, batch=8),  # GPT-2 small
    "C": GPTConfig(vocab=8192, seq_len=512, d_model=2048, n_heads=16, n_layers=6, batch=16),  # wide, short
    "D": GPTConfig(vocab=8192, seq_len=1024, d_model=2048, n_heads=16, n_layers=12, batch=4),
    "E": GPTConfig(vocab=8192, seq_len=1024, d_model=3072, n_heads=24, n_layers=8, batch=4),
    "F": GPTConfig(vocab=8192, seq_len=1024, d_model=1024, n_heads=16, n_layers=16, batch=4),
    "X": GPTConfig(vocab=8192, seq_len=1024, d_model=2048, n_heads=16, n_layers=4, batch=2),  # for snapshots
}
# (shape, batch, precision, checkpointing, stage, fused AdamW, mixed precision)
JOBS = [
    ("A", 16, "fp32", False, 0, False, None), ("A", 8, "fp32", False, 0, True, None),
    ("A", 16, "bf16", False, 0, False, None), ("A", 16, "bf16", True, 0, False, None),
    ("B", 8, "bf16", False, 0, True, None), ("B", 4, "fp32", True, 0, False, None),
    ("C", 16, "fp32", True, 0, False, None),
    ("D", 4, "bf16", True, 0, True, None), ("D", 8, "bf16", True, 0, False, None),
    ("E", 4, "bf16", True, 0, False, None), ("F", 4, "bf16", True, 0, False, None),
    ("D", 4, "bf16", True, 3, False, "policy"), ("A", 16, "bf16", False, 3, False, "policy"),
    ("A", 16, "fp32", False, 3, True, None), ("D", 4, "bf16", True, 3, False, "autocast"),
    ("A", 8, "bf16", False, 2, False, "policy"),
]
SNAPSHOT_JOBS = [
    ("X", 2, "bf16", True, 0, False, None), ("X", 2, "bf16", False, 0, False, None),
    ("X", 2, "fp32", False, 0, False, None), ("X", 2, "bf16", True, 3, False, "policy"),
    ("X", 2, "bf16", False, 3, False, "policy"), ("X", 2, "fp32", False, 3, False, None),
    ("X", 2, "bf16", True, 3, False, "autocast"), ("X", 2, "bf16", False, 2, False, "policy"),
]

PROBE = r"""
import json, torch, torch.nn.functional as F
out = {}
def mib(): return torch.cuda.memory_allocated()
x = torch.randn(512, 512, device="cuda", requires_grad=True)
w = torch.randn(512, 512, device="cuda", requires_grad=True)
torch.cuda.synchronize(); a0 = mib()
y = x @ w
out["first matmul (forward thread)"] = mib() - a0 - y.nbytes
a1 = mib()
y.sum().backward()
out["backward (autograd's thread)"] = mib() - a1 - x.grad.nbytes - w.grad.nbytes
a2 = mib()
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    z = x @ w
out["a matmul on a second stream"] = mib() - a2 - z.nbytes
a3 = mib()
h = x.detach().bfloat16() @ w.detach().bfloat16()
out["a bf16 matmul after them"] = mib() - a3 - h.nbytes
xb = torch.randn(8, 64, device="cuda", dtype=torch.bfloat16)
_, mean, rstd = torch.native_layer_norm(xb, (64,), torch.ones(64, device="cuda", dtype=torch.bfloat16), None, 1e-5)
out["layer_norm statistics for bf16 input"] = str(mean.dtype)
xf = torch.randn(8, 64, device="cuda")
with torch.autocast("cuda", dtype=torch.bfloat16):
    out["autocast layer_norm output"] = str(F.layer_norm(xf, (64,)).dtype)
    out["autocast rms_norm output"] = str(F.rms_norm(xf, (64,)).dtype)
    out["autocast rms_norm of bf16 input"] = str(F.rms_norm(xf.bfloat16(), (64,)).dtype)
print(json.dumps(out))
"""


def job_name(job: tuple) -> str:
    shape, batch, precision, ckpt, stage, fused, mixed = job
    return (f"{shape} b{batch} {precision}{f' {mixed}' if mixed else ''}{' ckpt' if ckpt else ''}"
            f"{f' stage {stage}' if stage else ''}{' fused' if fused else ''}")


def run(job: tuple, snapshot: Path | None = None) -> dict:
    shape, batch, precision, ckpt, stage, fused, mixed = job
    cfg = replace(SHAPES[shape], batch=batch)
    got = measure_peak(cfg, precision, ckpt, stage, fused, mixed, snapshot=snapshot)
    row = {"job": job_name(job), "config": asdict(cfg), "options": list(job[2:]), "measured": got}
    try:
        plan = plan_memory(cfg, precision, ckpt, stage, 1, fused, mixed_precision=mixed)
        row["predicted"] = {p: sum(t.nbytes for t in terms) for p, terms in plan.phases.items()}
        row["predicted_peak_phase"] = plan.peak_phase
    except (TypeError, ValueError) as exc:  # a plan without that option: the measurement still counts
        row["predicted"] = f"{type(exc).__name__}: {exc}"
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, required=True, help="folder for phases.json (and snapshots)")
    parser.add_argument("--snapshots", action="store_true", help="also the snapshot jobs and the probes")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("memory_phases.py needs a CUDA GPU: none is visible", file=sys.stderr)
        return 2
    args.output.mkdir(parents=True, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "date": datetime.date.today().isoformat()}
    results: dict = {"meta": meta, "jobs": []}
    if args.snapshots:
        probe = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=False)
        (args.output / "probes.json").write_text(probe.stdout or probe.stderr)
        print(probe.stdout or probe.stderr, flush=True)
    todo = [(j, None) for j in JOBS]
    if args.snapshots:
        todo += [(j, args.output / f"snapshot-{i}.pickle") for i, j in enumerate(SNAPSHOT_JOBS)]
    for job, snapshot in todo:
        try:
            row = run(job, snapshot)
        except Exception as exc:  # keep going: one job's failure must not lose the others' figures
            row = {"job": job_name(job), "error": f"{type(exc).__name__}: {exc}"}
        row["snapshot"] = snapshot.name if snapshot else None
        results["jobs"].append(row)
        (args.output / "phases.json").write_text(json.dumps(results, indent=1))
        if "error" in row:
            print(f"{row['job']:<36} {row['error']}", flush=True)
            continue
        cells = [f"{row['measured'][p] / 2**30:6.2f}" for p in MEASURED_PHASES]
        print(f"{row['job']:<36} " + " ".join(cells) + f"   peak {row['measured']['peak'] / 2**30:6.2f} GiB",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
