#!/usr/bin/env python3
"""Notebook 10's inference memory, measured on a CUDA GPU: for each configuration (model, weights' storage,
batch, prompt, cache length), what PyTorch's caching allocator holds after the weights, after the KV cache, at
the peak of the prefill and at the peak of the decode steps, with the CUDA context beside it; the raw figures to
a JSON file with the device, the PyTorch and CUDA versions and the date, to set against the plan
(`course_utils.memory.planner.plan_inference`).

    python benchmarks/inference_memory.py --output build/inference_memory
    python benchmarks/inference_memory.py --output DIR --smoke          # the tiny model on the CPU (a test)

Every figure is ``torch.cuda.max_memory_allocated()`` (reset before each phase) or ``memory_allocated()``, in
bytes; the context is ``mem_get_info``'s used memory less ``memory_reserved()`` after the first CUDA call.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course_utils.inference.int8_weights import quantize_linears  # noqa: E402
from course_utils.inference.kv_cache import StaticKVCache, forward_with_cache  # noqa: E402
from course_utils.models import GPT, GPTConfig  # noqa: E402

MODELS = {
    "6.7b": GPTConfig(vocab=32_000, seq_len=4096, d_model=4096, n_heads=32, n_layers=32, batch=1),
    "1.3b": GPTConfig(vocab=32_000, seq_len=4096, d_model=2048, n_heads=16, n_layers=24, batch=1),
    "small": GPTConfig(vocab=8192, seq_len=1024, d_model=1024, n_heads=16, n_layers=8, batch=1),
    "tiny": GPTConfig(vocab=128, seq_len=64, d_model=64, n_heads=4, n_layers=2, batch=1),
}
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


def build(cfg: GPTConfig, weights: str, device: torch.device) -> GPT:
    torch.manual_seed(0)
    dtype = torch.float32 if weights == "fp32" else torch.bfloat16
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = GPT(cfg).eval()
    finally:
        torch.set_default_dtype(previous)
    if weights == "int8":
        quantize_linears(model, skip=("head",))
    return model


@torch.inference_mode()
def measure(name: str, weights: str, batch: int, prompt: int, max_len: int, device: torch.device,
            steps: int) -> dict[str, Any]:
    cuda = device.type == "cuda"
    allocated = torch.cuda.memory_allocated if cuda else (lambda: 0)
    cfg = MODELS[name]
    before = allocated()
    model = build(cfg, weights, device)
    out: dict[str, Any] = {"model": name, "config": cfg.__dict__, "weights": weights, "batch": batch,
                           "prompt": prompt, "max_len": max_len, "weights_bytes": allocated() - before}
    cache = StaticKVCache(cfg, batch, max_len, dtype=model.tok.weight.dtype, device=device)
    out["cache_bytes"] = allocated() - before - out["weights_bytes"]
    tokens = torch.randint(cfg.vocab, (batch, prompt), generator=torch.Generator().manual_seed(0)).to(device)
    base = allocated()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    logits = forward_with_cache(model, tokens, torch.arange(prompt, device=device), cache, last_only=True)
    if cuda:
        torch.cuda.synchronize(device)
        out["prefill_peak"] = torch.cuda.max_memory_allocated(device) - before
        out["prefill_above_base"] = torch.cuda.max_memory_allocated(device) - base
    token = logits.argmax(-1)
    del logits
    pos = torch.tensor([prompt], device=device)
    base = allocated()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(min(steps, max_len - prompt)):
        token = forward_with_cache(model, token, pos, cache)[:, -1:].argmax(-1)
        pos += 1
    if cuda:
        torch.cuda.synchronize(device)
        out["decode_peak"] = torch.cuda.max_memory_allocated(device) - before
        out["decode_above_base"] = torch.cuda.max_memory_allocated(device) - base
        out["reserved"] = torch.cuda.memory_reserved(device)
    del model, cache, token, tokens
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", type=Path, required=True, help="folder for inference_memory.json")
    parser.add_argument("--steps", type=int, default=4, help="decode steps measured per configuration")
    parser.add_argument("--smoke", action="store_true", help="the tiny model on the CPU (a test)")
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
            row = measure(*config, device=device, steps=args.steps)
        except torch.OutOfMemoryError as exc:
            row = {"config": config, "error": str(exc).splitlines()[0]}
        report["rows"].append(row)
        print(json.dumps(row), flush=True)
        (args.output / "inference_memory.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
