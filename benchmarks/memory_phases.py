#!/usr/bin/env python3
"""Notebook 08's memory plan against the allocator, phase by phase, on a CUDA GPU.

For each job (a `GPT` shape, a batch, a precision, activation checkpointing, a ZeRO stage on one GPU, an AdamW
implementation), `course_utils.memory.planner.measure_peak` measures the allocator's peak in each phase of a step
(forward, the loss's backward, backward through the blocks, the optimizer's step) and
`course_utils.memory.planner.plan_memory` predicts them. The table and the raw figures go to a JSON file with
the device, the PyTorch and CUDA versions and the date.

    python benchmarks/memory_phases.py --output build/memory_phases        # every job: phases.json
    python benchmarks/memory_phases.py --output DIR --snapshots            # and an allocator history per
                                                                           # snapshot job (snapshot-N.pickle)
    python benchmarks/memory_phases.py --output DIR --cpu-ranks            # FSDP2 on 2 and 4 gloo ranks

``--snapshots`` also writes probes.json: what the plan's small terms rest on (the cuBLAS workspaces a forward
and a backward allocate, the dtypes of LayerNorm's saved statistics, what autocast does to each norm).
``--cpu-ranks`` needs no GPU: FSDP2's terms that depend on the world size (the all-gather buffers, the shards,
the reduce-scatter inputs), measured by each rank's CPU allocator (cpu-ranks.json; workspaces 0, fused AdamW).
Without ``--cpu-ranks``, exits with status 2 on a machine without a CUDA GPU.
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

from course_utils.distributed.launch import launch  # noqa: E402
from course_utils.memory.planner import MEASURED_PHASES, measure_peak, measure_rank, plan_memory  # noqa: E402
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
    plan = plan_memory(cfg, precision, ckpt, stage, 1, fused, mixed_precision=mixed)
    row["predicted"] = plan.by_measured_phase
    row["plan phases"] = {p: sum(t.nbytes for t in terms) for p, terms in plan.phases.items()}
    return row


CPU_RANK_SHAPE = GPTConfig(vocab=512, seq_len=128, d_model=128, n_heads=4, n_layers=4, batch=8)
CPU_RANK_JOBS = [("fp32", False, 3, None), ("fp32", True, 3, None), ("bf16", False, 3, "policy"),
                 ("bf16", True, 3, "policy"), ("fp32", False, 2, None), ("bf16", True, 2, "policy")]


def cpu_ranks(output: Path) -> int:
    """FSDP2 on W gloo ranks of this machine's CPU: each rank's phases against the plan for world size W."""
    rows = []
    for world in (2, 4):
        for precision, ckpt, stage, mixed in CPU_RANK_JOBS:
            options = {"precision": precision, "checkpointing": ckpt, "stage": stage, "fused_adamw": True,
                       "mixed_precision": mixed, "device": "cpu"}
            measured = launch(measure_rank, world, CPU_RANK_SHAPE, options, timeout=300, quiet=True)
            plan = plan_memory(CPU_RANK_SHAPE, precision, ckpt, stage, world, True, mixed, workspace=0)
            rows.append({"world": world, "options": options, "predicted": plan.by_measured_phase,
                         "measured": measured})
            errors = [plan.by_measured_phase[p] / measured[0][p] - 1 for p in MEASURED_PHASES]
            print(f"{world} ranks, {precision} {mixed or ''} {'ckpt ' if ckpt else ''}stage {stage}: rank 0 "
                  + "  ".join(f"{e:+.1%}" for e in errors), flush=True)
    (output / "cpu-ranks.json").write_text(json.dumps(rows, indent=1))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, required=True, help="folder for phases.json (and snapshots)")
    parser.add_argument("--snapshots", action="store_true", help="also the snapshot jobs and the probes")
    parser.add_argument("--cpu-ranks", action="store_true", help="FSDP2 on 2 and 4 gloo ranks of the CPU instead")
    args = parser.parse_args()
    if args.cpu_ranks:
        args.output.mkdir(parents=True, exist_ok=True)
        return cpu_ranks(args.output)
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
        cells = [f"{row['predicted'][p] / 2**30:6.2f}/{row['measured'][p] / 2**30:6.2f}" for p in MEASURED_PHASES]
        print(f"{row['job']:<36} " + " ".join(cells) + "  GiB predicted/measured", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
