#!/usr/bin/env python3
"""Notebook 10's inference memory, measured on a CUDA GPU: for each configuration (model, weights' storage,
batch, prompt, cache length), what PyTorch's caching allocator holds after the weights, after the KV cache, at
the peak of the prefill and at the peak of the decode steps, with the CUDA context beside it; the raw figures to
a JSON file with the device, the PyTorch and CUDA versions and the date, to set against the plan
(`course_utils.memory.inference_plan.plan_inference`).

    python benchmarks/inference_memory.py --output build/inference_memory
    python benchmarks/inference_memory.py --output DIR --smoke          # the tiny model's plan only (a test)

Each job's measurement is `course_utils.memory.inference_plan.measure_inference` (``max_memory_allocated``, reset
before each phase, above what the allocator held before), set beside `plan_inference`'s prediction; the context
is ``mem_get_info``'s used memory less ``memory_reserved()`` after the first CUDA call.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course_utils.memory.inference_plan import measure_inference, plan_inference  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from decode_ladder import MODELS as LADDER_MODELS  # noqa: E402

# decode_ladder.py's shapes; the two large ones with a 4,096-position table, for the longer caches below
MODELS = {name: replace(LADDER_MODELS[name], seq_len=4096) if name in ("6.7b", "1.3b") else LADDER_MODELS[name]
          for name in ("6.7b", "1.3b", "small", "tiny")}
# (model, weights, batch, prompt, cache length): weights "bf16", "int8" (by hand, head in bf16) or "fp32"
CONFIGS = [
    ("6.7b", "bf16", 1, 128, 2048),
    ("6.7b", "bf16", 16, 1024, 2048),
    ("6.7b", "bf16", 64, 512, 1024),
    ("6.7b", "bf16", 8, 4096, 4096),
    ("6.7b", "int8", 8, 2048, 2048),
    ("6.7b", "int8", 128, 256, 1024),
    ("1.3b", "bf16", 64, 2048, 2048),
    ("1.3b", "bf16", 256, 256, 512),
    ("1.3b", "int8", 32, 1024, 4096),
    ("small", "fp32", 32, 512, 1024),
    ("small", "bf16", 128, 1024, 1024),
]
SMOKE = [("tiny", "fp32", 2, 8, 16), ("tiny", "int8", 3, 4, 32)]


def row(name: str, weights: str, batch: int, prompt: int, max_len: int, steps: int) -> dict[str, Any]:
    """One job: the plan's bytes per phase (the cuBLAS workspace left out, as `measure_inference` leaves it out)
    and, on a CUDA GPU, what `measure_inference` measures."""
    cfg = MODELS[name]
    plan = plan_inference(cfg, batch, max_len, prompt, weights)
    out: dict[str, Any] = {"model": name, "config": cfg.__dict__, "weights": weights, "batch": batch,
                           "prompt": prompt, "max_len": max_len, "peak_phase": plan.peak_phase,
                           "predicted": {phase: sum(t.nbytes for t in terms if t.name != "cuBLAS workspace")
                                         for phase, terms in plan.phases.items()}}
    if torch.cuda.is_available():
        out["measured"] = measure_inference(cfg, batch, max_len, prompt, weights, steps=min(steps, max_len - prompt))
        out["predicted_over_measured"] = {phase: out["predicted"][phase] / out["measured"][phase]
                                          for phase in ("prefill", "decode")}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", type=Path, required=True, help="folder for inference_memory.json")
    parser.add_argument("--steps", type=int, default=4, help="decode steps measured per configuration")
    parser.add_argument("--smoke", action="store_true", help="the tiny model's plan on the CPU, nothing measured (a test)")
    args = parser.parse_args()
    if not args.smoke and not torch.cuda.is_available():
        print("inference_memory.py measures a CUDA GPU; this machine has none (--smoke runs on the CPU)")
        return 2
    device = torch.device("cpu" if args.smoke else "cuda")
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                              "torch": torch.__version__, "cuda": torch.version.cuda,
                              "date": datetime.date.today().isoformat(), "rows": []}
    if device.type == "cuda":
        torch.zeros(1, device=device)
        free, total = torch.cuda.mem_get_info(device)
        report["context_bytes"] = total - free - torch.cuda.memory_reserved(device)
        report["total_bytes"] = total
        report["capability"] = torch.cuda.get_device_capability(device)
    args.output.mkdir(parents=True, exist_ok=True)
    for config in SMOKE if args.smoke else CONFIGS:
        try:
            result = row(*config, steps=args.steps)
        except torch.OutOfMemoryError as exc:
            result = {"config": config, "error": str(exc).splitlines()[0]}
        report["rows"].append(result)
        print(json.dumps(result), flush=True)
        (args.output / "inference_memory.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
