#!/usr/bin/env python3
"""Notebook 10's decode ladder on a CUDA GPU: ms per token, tokens/s and MBU of each rung, a batch sweep, kernel
counts from a profile; the raw figures to a JSON file with the device, the PyTorch and CUDA versions and the date.

Rungs, each on the course's GPT (`course_utils.models.GPT`) initialised on the GPU from its shape, batch 1,
greedy decoding with the static KV cache of `course_utils.inference.kv_cache` (prefill, then one token a step):

- ``eager-fp32``: the model as built, in float32, under ``torch.inference_mode``;
- ``eager-bf16``: bf16 weights and cache, under ``torch.inference_mode``;
- ``graphed-bf16``: the eager bf16 step captured in a CUDA graph (`course_utils.inference.graphed_step`);
- ``compiled-bf16``: the decode step through ``torch.compile(mode="reduce-overhead")`` (CUDA graphs), the position
  a tensor so that nothing recompiles; ``-cdt`` and ``-cdt-mm`` variants (see `RUNGS`);
- ``int8-by-hand``: `course_utils.inference.int8_weights` (int8 weights, per-channel scales), compiled the same way
  with coordinate-descent tuning;
- ``torchao-int8`` / ``torchao-int4`` / ``torchao-int4-plain``: torchao's ``quantize_`` with its weight-only configs
  (int4 in tinygemm's layout, or its default plain one), compiled, when torchao is installed (and, for int4, when
  its kernel runs on this GPU; the reason is recorded when not).

``--profile`` adds each rung's kernels per step, GPU busy time and its split by kind of kernel
(`course_utils.inference.decode_timing.step_profile`); ``--kernels`` the slowest kernels by name.

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
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course_utils.inference.decode_timing import KERNEL_KINDS, seconds_per_step, step_profile  # noqa: E402
from course_utils.inference.graphed_step import GraphedStep  # noqa: E402
from course_utils.inference.int8_weights import quantize_linears  # noqa: E402
from course_utils.inference.kv_cache import StaticKVCache, forward_with_cache  # noqa: E402
from course_utils.inference.roofline import mbu, model_step_bytes, weight_bytes  # noqa: E402
from course_utils.memory.planner import parameter_count  # noqa: E402
from course_utils.models import GPT, GPTConfig  # noqa: E402

MODELS = {
    # About 6.7 B parameters: LLaMA-7B's width and depth on the course's block (GELU MLP of 4·d, biases).
    "6.7b": GPTConfig(vocab=32_000, seq_len=2048, d_model=4096, n_heads=32, n_layers=32, batch=1),
    # The 6.7 B model's shapes with a quarter of its blocks: every kernel the same, compiled four times faster.
    "6.7b-8blocks": GPTConfig(vocab=32_000, seq_len=2048, d_model=4096, n_heads=32, n_layers=8, batch=1),
    "1.3b": GPTConfig(vocab=32_000, seq_len=2048, d_model=2048, n_heads=16, n_layers=24, batch=1),
    "small": GPTConfig(vocab=8192, seq_len=1024, d_model=1024, n_heads=16, n_layers=8, batch=1),  # notebook 07's
    "tiny": GPTConfig(vocab=128, seq_len=64, d_model=64, n_heads=4, n_layers=2, batch=1),  # --smoke
}
RUNGS = ("eager-fp32", "eager-bf16", "graphed-bf16", "compiled-bf16", "compiled-bf16-cdt", "compiled-bf16-cdt-mm",
         "int8-by-hand", "torchao-int8", "torchao-int4", "torchao-int4-plain")
"""``-cdt``: Inductor's coordinate-descent tuning on (as gpt-fast and torchao set it), which also makes Inductor
turn a matrix-vector ``mm`` into a fused reduction; ``-mm``: every linear layer's bias added after ``F.linear``
without it, so that the product is an ``mm``, not an ``addmm`` (which Inductor leaves to cuBLAS)."""
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


class LinearThenBias(nn.Linear):
    """`nn.Linear` computing ``F.linear(x, weight) + bias``: the same numbers, but the product is an ``mm``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        return y if self.bias is None else y + self.bias


def bias_after_product(model: nn.Module) -> None:
    """Make every `nn.Linear` of ``model`` a `LinearThenBias` (same parameters, in place)."""
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = LinearThenBias


def quantize_with_torchao(model: GPT, kind: str) -> str | None:
    """torchao's weight-only quantization in place (the head left out, as the by-hand rung does); the reason as
    text when it cannot run here."""
    try:
        import torchao
        from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_
    except ImportError as exc:
        return f"torchao is not installed ({exc})"
    config: Any
    if kind == "int8":
        config = Int8WeightOnlyConfig(set_inductor_config=False)
    elif kind == "int4":
        config = Int4WeightOnlyConfig(group_size=128, int4_packing_format="tile_packed_to_4d")
    else:
        config = Int4WeightOnlyConfig(group_size=128)
    try:
        quantize_(model, config, filter_fn=lambda m, fqn: isinstance(m, nn.Linear) and fqn != "head")
    except Exception as exc:  # an unsupported GPU or kernel: say which, the ladder goes on
        return f"torchao {torchao.__version__}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    return None


def rung(name: str, base: GPT) -> tuple[GPT | None, str | None]:
    """The model of a rung (a copy of ``base``: float32 for eager-fp32, else bf16), or None and why it cannot run."""
    if name == "eager-fp32":
        return copy.deepcopy(base).float(), None
    model = copy.deepcopy(base).to(torch.bfloat16)
    if name.endswith("-mm"):
        bias_after_product(model)
    if name == "int8-by-hand":
        quantize_linears(model, skip=("head",))
    elif name.startswith("torchao"):
        kind = name.split("-", 1)[1]
        if (why := quantize_with_torchao(model, kind)) is not None:
            return None, why
    return model, None


def top_kernels(model: GPT, step: Any, prompt_len: int, max_len: int, steps: int = 4, top: int = 12
                ) -> list[dict[str, Any]]:
    """The GPU kernels of ``steps`` decode steps at batch 1, grouped by name: calls and µs per step, most first."""
    from torch.profiler import ProfilerActivity, profile

    device = model.tok.weight.device
    cache = StaticKVCache(model.cfg, 1, max_len, dtype=model.tok.weight.dtype, device=device)
    with torch.inference_mode():
        prompt = torch.zeros(1, prompt_len, dtype=torch.long, device=device)
        logits = forward_with_cache(model, prompt, torch.arange(prompt_len, device=device), cache, last_only=True)
        token, pos = logits.argmax(-1), torch.tensor([prompt_len], device=device)
        for _ in range(3):
            token = step(model, token, pos, cache)[:, -1:].argmax(-1)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                token = step(model, token, pos, cache)[:, -1:].argmax(-1)
            torch.cuda.synchronize()
    rows: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            r = rows.setdefault(e.name[:90], [0, 0.0])
            r[0] += 1
            r[1] += e.device_time
    ranked = sorted(rows.items(), key=lambda kv: -kv[1][1])[:top]
    return [{"kernel": k, "calls_per_step": c / steps, "us_per_step": t / steps} for k, (c, t) in ranked]


def set_inductor(cdt: bool) -> None:
    import torch._inductor.config as inductor

    inductor.coordinate_descent_tuning = cdt
    inductor.coordinate_descent_check_all_directions = cdt
    inductor.triton.unique_kernel_names = True


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
        report["models"][model_name] = entry
        for name in args.rungs:
            if name == "eager-fp32" and parameter_count(cfg) * 4 > args.fp32_limit_gb * 2**30:
                entry["rungs"][name] = {"skipped": f"float32 weights over {args.fp32_limit_gb} GB"}
                continue
            if name == "graphed-bf16" and device.type != "cuda":
                entry["rungs"][name] = {"skipped": "CUDA graphs need a CUDA GPU"}
                continue
            model, why = rung(name, base)
            if model is None:
                entry["rungs"][name] = {"skipped": why}
                print(f"{model_name} {name}: skipped, {why}", flush=True)
                continue
            compiled = not name.startswith(("eager", "graphed")) and not args.smoke
            set_inductor(cdt="cdt" in name or name.startswith(("int8", "torchao")))
            step: Any = forward_with_cache
            if compiled:
                step = torch.compile(forward_with_cache, mode="reduce-overhead", fullgraph=True)
            elif name.startswith("graphed"):
                step = GraphedStep()
            started = time.perf_counter()
            seconds = seconds_per_step(model, 1, args.prompt, args.tokens, args.rounds, step)
            total = time.perf_counter() - started
            median = statistics.median(seconds)
            max_len = args.prompt + args.tokens + 1
            moved = model_step_bytes(model, 1, max_len)
            entry["rungs"][name] = {
                "ms_per_token": median * 1e3, "ms_range": [min(seconds) * 1e3, max(seconds) * 1e3],
                "tokens_per_s": 1 / median, "bytes_per_step": moved, "mbu": mbu(moved, median, peak),
                "weight_bytes": weight_bytes(model), "compiled": compiled, "seconds_with_warmup": total,
                "profile": step_profile(model, step, min(8, args.tokens), args.prompt, max_len) if args.profile
                else None,
                "top_kernels": top_kernels(model, step, args.prompt, max_len) if args.kernels and device.type == "cuda"
                else None}
            print(f"{model_name} {name}: {median * 1e3:.3f} ms/token, {1 / median:.1f} tokens/s, "
                  f"MBU {mbu(moved, median, peak):.1%} ({total:.0f} s with warm-up)", flush=True)
            if (prof := entry["rungs"][name]["profile"]) and prof["gpu_busy_s"] > 0:
                print("  GPU time per step: " + ", ".join(
                    f"{kind} {prof[kind + '_s'] * 1e3:.3f} ms ({prof[kind + '_kernels']:.0f} kernels)"
                    for kind in KERNEL_KINDS), flush=True)
            for row in entry["rungs"][name]["top_kernels"] or []:
                print(f"  {row['us_per_step']:8.1f} us {row['calls_per_step']:5.1f}x {row['kernel']}", flush=True)
            del model
            torch._dynamo.reset()
            save(args, report)
        if args.sweep and not args.smoke:
            entry["sweep"] = {}
            for mode in args.sweep_modes:
                entry["sweep"][mode] = sweep(base, cfg, args, mode)
                save(args, report)
        del base
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return report


def sweep(base: GPT, cfg: GPTConfig, args: argparse.Namespace, mode: str) -> list[dict[str, float]]:
    """Decode steps at each batch of ``args.batches``: ms per step, tokens/s (batch / step time), MBU, FLOP/s.
    ``mode``: ``graphed`` (eager captured in CUDA graphs), ``compiled-dynamic`` (one compilation for every batch,
    reduce-overhead) or ``compiled-static`` (a compilation per batch, coordinate-descent tuning on)."""
    rows = []
    set_inductor(cdt=mode == "compiled-static")
    step: Any = GraphedStep()
    if mode == "compiled-dynamic":
        step = torch.compile(forward_with_cache, mode="reduce-overhead", fullgraph=True, dynamic=True)
    model = base
    if mode == "compiled-static":
        model = copy.deepcopy(base)
        bias_after_product(model)
    for batch in args.batches:
        if mode == "compiled-static":
            torch._dynamo.reset()
            step = torch.compile(forward_with_cache, mode="reduce-overhead", fullgraph=True)
        started = time.perf_counter()
        seconds = seconds_per_step(model, batch, args.prompt, args.tokens, args.rounds, step)
        median = statistics.median(seconds)
        moved = model_step_bytes(base, batch, args.prompt + args.tokens + 1)
        rows.append({"batch": batch, "ms_per_step": median * 1e3, "tokens_per_s": batch / median,
                     "mbu": mbu(moved, median, args.peak_gbps * 1e9),
                     "flops_per_s": 2 * parameter_count(cfg) * batch / median,
                     "seconds_with_warmup": time.perf_counter() - started})
        print(f"  {mode} batch {batch}: {median * 1e3:.2f} ms/step, {batch / median:.0f} tokens/s "
              f"({rows[-1]['seconds_with_warmup']:.0f} s)", flush=True)
    torch._dynamo.reset()
    return rows


def save(args: argparse.Namespace, report: dict[str, Any]) -> None:
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "decode_ladder.json").write_text(json.dumps(report, indent=1))


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
    parser.add_argument("--kernels", action="store_true", help="the top GPU kernels of a decode step per rung")
    parser.add_argument("--sweep-modes", default="graphed", help="comma-separated: graphed, compiled-dynamic, "
                        "compiled-static")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)), help="batches of the sweep")
    parser.add_argument("--smoke", action="store_true", help="the tiny model on the CPU, no compiling (a test)")
    args = parser.parse_args()
    args.sweep_modes = args.sweep_modes.split(",")
    args.batches = [int(b) for b in args.batches.split(",")]
    args.models = ["tiny"] if args.smoke else args.models.split(",")
    args.rungs = args.rungs.split(",")
    unknown = [m for m in args.models if m not in MODELS] + [r for r in args.rungs if r not in RUNGS]
    if unknown:
        parser.error(f"unknown model or rung: {unknown}")
    if not args.smoke and not torch.cuda.is_available():
        print("decode_ladder.py measures a CUDA GPU; this machine has none (--smoke runs a tiny model on the CPU)")
        return 2
    save(args, run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
