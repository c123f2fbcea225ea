#!/usr/bin/env python3
"""Notebook 10's decode ladder on a CUDA GPU: ms per token, tokens/s and MBU of each rung, a batch sweep, kernel
counts from a profile; the raw figures to a JSON file with the device, the PyTorch and CUDA versions and the date.

Rungs, each on the course's GPT (`course_utils.models.GPT`) initialised on the GPU from its shape, batch 1,
greedy decoding with the static KV cache of `course_utils.inference.kv_cache` (prefill, then one token a step):

- ``eager-fp32``: the model as built, in float32, under ``torch.inference_mode``;
- ``eager-bf16``: bf16 weights and cache, under ``torch.inference_mode``;
- ``compiled-bf16``: the decode step through ``torch.compile(mode="reduce-overhead")`` (CUDA graphs), the position
  a tensor so that nothing recompiles;
- ``int8-by-hand``: `course_utils.inference.int8_weights` (int8 weights, per-channel scales), compiled the same way;
- ``torchao-int8`` / ``torchao-int4``: torchao's ``quantize_`` with its weight-only configs, compiled, when torchao
  is installed (and, for int4, when its kernel runs on this GPU; the reason is recorded when not).

    python benchmarks/decode_ladder.py --output build/decode_ladder             # the 6.7 B and the small model
    python benchmarks/decode_ladder.py --output DIR --models small --rungs eager-bf16,compiled-bf16
    python benchmarks/decode_ladder.py --output DIR --smoke                     # a tiny model on the CPU (a test)

MBU counts the bytes `course_utils.inference.roofline.model_step_bytes` says a step reads (the weights as they
are stored, torchao's packed ones included, and the whole static cache, which the masked attention reads) over
the step's time and the GPU's peak bandwidth (``--peak-gbps``, default the H200's 4800 GB/s). Each rung is timed
by `course_utils.inference.decode_timing.seconds_per_step`: ``--tokens`` decode steps after a warm-up generation,
in ``--rounds`` rounds (median, min and max kept), ``torch.cuda.synchronize()`` before and after each round.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course_utils.inference.decode_timing import seconds_per_step, step_profile  # noqa: E402
from course_utils.inference.int8_weights import quantize_linears  # noqa: E402
from course_utils.inference.kv_cache import forward_with_cache  # noqa: E402
from course_utils.inference.roofline import mbu, model_step_bytes, weight_bytes  # noqa: E402
from course_utils.memory.planner import parameter_count  # noqa: E402
from course_utils.models import GPT, GPTConfig  # noqa: E402

MODELS = {
    # About 6.7 B parameters: LLaMA-7B's width and depth on the course's block (GELU MLP of 4·d, biases).
    "6.7b": GPTConfig(vocab=32_000, seq_len=2048, d_model=4096, n_heads=32, n_layers=32, batch=1),
    "1.3b": GPTConfig(vocab=32_000, seq_len=2048, d_model=2048, n_heads=16, n_layers=24, batch=1),
    "small": GPTConfig(vocab=8192, seq_len=1024, d_model=1024, n_heads=16, n_layers=8, batch=1),  # notebook 07's
    "tiny": GPTConfig(vocab=128, seq_len=64, d_model=64, n_heads=4, n_layers=2, batch=1),  # --smoke
}
RUNGS = ("eager-fp32", "eager-bf16", "compiled-bf16", "int8-by-hand", "torchao-int8", "torchao-int4")
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def build(cfg: GPTConfig, device: torch.device, dtype: torch.dtype) -> GPT:
    """The model initialised where it runs, in ``dtype``: a 6.7 B model never exists in float32 on the host."""
    torch.manual_seed(0)
    with torch.device(device):
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            return GPT(cfg).eval()
        finally:
            torch.set_default_dtype(previous)


def quantize_with_torchao(model: GPT, bits: int) -> str | None:
    """torchao's weight-only quantization in place; the reason as text when it cannot run here."""
    try:
        from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_
    except ImportError as exc:
        return f"torchao is not installed ({exc})"
    try:
        quantize_(model, Int8WeightOnlyConfig() if bits == 8 else Int4WeightOnlyConfig(group_size=128))
    except Exception as exc:  # an unsupported GPU or kernel: say which, the ladder goes on
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    return None


def rung(name: str, base: GPT) -> tuple[GPT | None, str | None]:
    """The model of a rung (a copy of ``base``: float32 for eager-fp32, else bf16), or None and why it cannot run."""
    if name == "eager-fp32":
        return copy.deepcopy(base).float(), None
    model = copy.deepcopy(base).to(torch.bfloat16)
    if name == "int8-by-hand":
        quantize_linears(model, skip=("head",))
    elif name.startswith("torchao"):
        if (why := quantize_with_torchao(model, 8 if name.endswith("int8") else 4)) is not None:
            return None, why
    return model, None


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device("cpu" if args.smoke else "cuda")
    peak = args.peak_gbps * 1e9
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "date": datetime.date.today().isoformat(), "peak_gbps": args.peak_gbps, "models": {}}
    for model_name in args.models:
        cfg = MODELS[model_name]
        base = build(cfg, device, torch.float32 if args.smoke else torch.bfloat16)
        entry: dict[str, Any] = {"config": cfg.__dict__, "parameters": parameter_count(cfg), "rungs": {}}
        for name in args.rungs:
            if name == "eager-fp32" and parameter_count(cfg) * 4 > args.fp32_limit_gb * 2**30:
                entry["rungs"][name] = {"skipped": f"float32 weights over {args.fp32_limit_gb} GB"}
                continue
            model, why = rung(name, base)
            if model is None:
                entry["rungs"][name] = {"skipped": why}
                continue
            compiled = not name.startswith("eager") and not args.smoke
            step = (torch.compile(forward_with_cache, mode="reduce-overhead", fullgraph=True) if compiled
                    else forward_with_cache)
            seconds = seconds_per_step(model, 1, args.prompt, args.tokens, args.rounds, step)
            median = statistics.median(seconds)
            moved = model_step_bytes(model, 1, args.prompt + args.tokens + 1)
            entry["rungs"][name] = {
                "ms_per_token": median * 1e3, "ms_range": [min(seconds) * 1e3, max(seconds) * 1e3],
                "tokens_per_s": 1 / median, "bytes_per_step": moved, "mbu": mbu(moved, median, peak),
                "weight_bytes": weight_bytes(model), "compiled": compiled,
                "profile": step_profile(model, step) if args.profile else None}
            print(f"{model_name} {name}: {median * 1e3:.2f} ms/token, {1 / median:.1f} tokens/s, "
                  f"MBU {mbu(moved, median, peak):.1%}", flush=True)
            del model
            torch._dynamo.reset()
        if args.sweep and not args.smoke:
            entry["sweep"] = sweep(base, cfg, device, args)
        report["models"][model_name] = entry
        del base
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return report


def sweep(base: GPT, cfg: GPTConfig, device: torch.device, args: argparse.Namespace) -> list[dict[str, float]]:
    """The compiled bf16 rung at each batch of `BATCHES`: ms per step, tokens/s (batch / step time), MBU."""
    step = torch.compile(forward_with_cache, mode="reduce-overhead", fullgraph=True)
    rows = []
    for batch in BATCHES:
        seconds = seconds_per_step(base, batch, args.prompt, args.tokens, args.rounds, step)
        median = statistics.median(seconds)
        moved = model_step_bytes(base, batch, args.prompt + args.tokens + 1)
        rows.append({"batch": batch, "ms_per_step": median * 1e3, "tokens_per_s": batch / median,
                     "mbu": mbu(moved, median, args.peak_gbps * 1e9),
                     "flops_per_s": 2 * parameter_count(cfg) * batch / median})
        print(f"  batch {batch}: {median * 1e3:.2f} ms/step, {batch / median:.0f} tokens/s", flush=True)
    torch._dynamo.reset()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", type=Path, required=True, help="folder for decode_ladder.json")
    parser.add_argument("--models", default="6.7b,small", help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--rungs", default=",".join(RUNGS), help=f"comma-separated, of {', '.join(RUNGS)}")
    parser.add_argument("--prompt", type=int, default=128, help="prompt length (prefill)")
    parser.add_argument("--tokens", type=int, default=128, help="decode steps timed per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--peak-gbps", type=float, default=4800.0, help="the GPU's peak memory bandwidth, GB/s")
    parser.add_argument("--fp32-limit-gb", type=float, default=40.0, help="skip eager-fp32 above this weight size")
    parser.add_argument("--no-sweep", dest="sweep", action="store_false", help="skip the batch sweep")
    parser.add_argument("--profile", action="store_true", help="kernels per token and GPU busy time per rung")
    parser.add_argument("--smoke", action="store_true", help="the tiny model on the CPU, no compiling (a test)")
    args = parser.parse_args()
    args.models = ["tiny"] if args.smoke else args.models.split(",")
    args.rungs = args.rungs.split(",")
    unknown = [m for m in args.models if m not in MODELS] + [r for r in args.rungs if r not in RUNGS]
    if unknown:
        parser.error(f"unknown model or rung: {unknown}")
    if not args.smoke and not torch.cuda.is_available():
        print("decode_ladder.py measures a CUDA GPU; this machine has none (--smoke runs a tiny model on the CPU)")
        return 2
    report = run(args)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "decode_ladder.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
