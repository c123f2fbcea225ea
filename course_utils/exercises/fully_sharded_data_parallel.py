"""Checkers for notebook 08 (when the model does not fit). They run on the CPU, so every student gets feedback.

The memory model is the notebook's: float32 parameters, gradients and AdamW's two moments (4 + 4 + 8 bytes
per parameter), sharded by the ZeRO stage over the ranks, plus the activations of the rank's own batch.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from ..models import GPTConfig
from . import Verdict, fail, ok

__all__ = ["activation_bytes", "check_load_on_one_process", "check_memory_plan", "check_per_rank_bytes",
           "parameter_count", "reference_per_rank_bytes"]

SHARDED = {0: "nothing (DDP)", 1: "the optimizer state", 2: "the optimizer state and the gradients",
           3: "the optimizer state, the gradients and the parameters"}


# --- the reference memory model -------------------------------------------------------------------------

def parameter_count(cfg: GPTConfig) -> int:
    """Parameters of `course_utils.models.GPT` of shape ``cfg``, from its shapes."""
    d, v = cfg.d_model, cfg.vocab
    block = (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d) + 2 * 2 * d
    return v * d + cfg.seq_len * d + cfg.n_layers * block + 2 * d + (d * v + v)


def activation_bytes(cfg: GPTConfig, checkpointed: bool = False) -> int:
    """Bytes autograd saves for backward in `GPT.loss` on a batch of ``cfg.batch`` sequences (float32).
    With ``checkpointed``, each block keeps only its input; the rest is recomputed in backward."""
    b, t, d, h, v = cfg.batch, cfg.seq_len - 1, cfg.d_model, cfg.n_heads, cfg.vocab
    per_block = 4 * (16 * b * t * d + 4 * b * t + b * h * t)
    outside = 4 * (2 * b * t * d + 2 * b * t + b * t * v + 1) + 8 * (b * (t + 1) + b * t + t)
    blocks = cfg.n_layers * (4 * b * t * d if checkpointed else per_block)
    return blocks + outside


def reference_per_rank_bytes(n_params: int, world_size: int, stage: int) -> float:
    """Bytes of parameters, gradients and AdamW state one rank holds with ZeRO ``stage`` on ``world_size``."""
    if stage not in (0, 1, 2, 3) or world_size < 1:
        raise ValueError(f"ZeRO stages are 0 to 3 and a world has at least 1 rank; got stage {stage}, "
                         f"world size {world_size}")
    params, grads, adam = 4.0 * n_params, 4.0 * n_params, 8.0 * n_params
    if stage >= 1:
        adam /= world_size
    if stage >= 2:
        grads /= world_size
    if stage >= 3:
        params /= world_size
    return params + grads + adam


def _valid_call(fn: Any, name: str) -> Verdict | None:
    if not callable(fn):
        return fail(f"expected your function, got {type(fn).__name__}.", f"pass the function itself: {name}")
    return None


# --- 1. per-rank memory for N ranks and a ZeRO stage -------------------------------------------------------

_TERMS = ("weights", "gradients", "optimizer state")
_NOTEBOOK_BYTES = (4.0, 4.0, 8.0)  # float32 weights and gradients, AdamW's two float32 moments
_KNOWN_BYTES = {(2.0, 2.0, 12.0): "the ZeRO paper's mixed-precision Adam (Rajbhandari et al., K = 12: fp16 "
                                  "weights and gradients, an fp32 master copy and two fp32 moments)",
                (2.0, 2.0, 8.0): "bf16 weights and gradients with fp32 moments but no master copy",
                (4.0, 4.0, 12.0): "float32 training that also keeps a master copy"}


def _bytes_per_parameter(fn: Callable[[int, int, int], float]) -> tuple[float, float, float] | None:
    """The bytes per parameter of weights, gradients and optimizer state that ``fn``'s answers imply, if they
    fit the ZeRO sharding (stage s shards the last s terms) with some byte counts; else None."""
    n, w = 1_000_000_000, 4
    try:
        s0, s1, s2, s3 = (float(fn(n, w, stage)) / n for stage in range(4))
        opt, grads, weights = (s0 - s1) * w / (w - 1), (s1 - s2) * w / (w - 1), (s2 - s3) * w / (w - 1)
        fits = all(math.isclose(float(fn(n, ranks, stage)) / n,
                                sum(b / (ranks if i >= 3 - stage else 1) for i, b in enumerate((weights, grads, opt))),
                                rel_tol=1e-6, abs_tol=1e-6)
                   for ranks in (1, 2, 8) for stage in range(4))
    except Exception:  # the student's code: a failure here only means no diagnosis
        return None
    return (weights, grads, opt) if fits and min(weights, grads, opt) >= 0 else None


def _which_terms_differ(fn: Callable[[int, int, int], float]) -> str | None:
    found = _bytes_per_parameter(fn)
    if found is None or all(math.isclose(a, b) for a, b in zip(found, _NOTEBOOK_BYTES, strict=True)):
        return None
    named = _KNOWN_BYTES.get(tuple(round(b, 6) for b in found), "")  # type: ignore[arg-type]
    differ = ", ".join(f"{t} {got:g} (here {want:g})" for t, got, want in zip(_TERMS, found, _NOTEBOOK_BYTES, strict=True)
                       if not math.isclose(got, want))
    return (f"your answers shard like ZeRO, with {found[0]:g} + {found[1]:g} + {found[2]:g} bytes per parameter"
            + (f": {named}" if named else "") + f". This exercise is the float32 training measured above, 4 + 4 + 8 "
            f"bytes (weights, gradients, AdamW's two moments, no master copy); the terms that differ: {differ}.")


def check_per_rank_bytes(fn: Callable[[int, int, int], float]) -> Verdict:
    """Exercise: ``fn(n_params, world_size, stage)`` returns the bytes of parameters, gradients and AdamW
    state (float32) that one rank holds with ZeRO ``stage`` (0 = DDP, 1, 2, 3 = FSDP) on ``world_size``."""
    bad = _valid_call(fn, "check_per_rank_bytes(per_rank_bytes)")
    if bad is not None:
        return bad
    cases = [(n, w, s) for n in (137_216, 1_000_000_000) for w in (1, 2, 4, 8) for s in (0, 1, 2, 3)]
    for n, w, s in cases:
        try:
            got = fn(n, w, s)
        except Exception as exc:  # the student's code: report any failure as feedback
            return fail(f"per_rank_bytes({n}, {w}, {s}) raised {type(exc).__name__}: {exc}")
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            return fail(f"per_rank_bytes({n}, {w}, {s}) returned {type(got).__name__}; expected a number of bytes.")
        want = reference_per_rank_bytes(n, w, s)
        if not math.isclose(got, want, rel_tol=1e-6, abs_tol=1):
            hint = (f"ZeRO stage {s} shards {SHARDED[s]}: that part is divided by the world size, the rest is "
                    "held whole on every rank. Per parameter: 4 bytes of weight, 4 of gradient, 8 of AdamW "
                    "state (two float32 moments).")
            counted_parameters = math.isclose(got, want / 4, rel_tol=1e-6) or math.isclose(got, want * 4, rel_tol=1e-6)
            if counted_parameters:
                hint = "count bytes, not parameters: a float32 number takes 4 bytes."
            terms = None if counted_parameters else _which_terms_differ(fn)
            if terms is not None:
                return fail(f"for {n:,} parameters on {w} rank(s) at stage {s} your answer is {got:,.0f} bytes, "
                            f"not {want:,.0f}: {terms}", "use the byte counts of the training this notebook runs.")
            return fail(f"for {n:,} parameters on {w} rank(s) at stage {s} your answer, {got:,.0f} bytes, is "
                        f"{'more' if got > want else 'less'} than a rank holds.", hint)
    return ok(f"all {len(cases)} cases agree with the formulas (stages 0 to 3, 1 to 8 ranks). The FSDP2 run "
              "above measured stage 3 on 2 and 4 ranks, and ZeroRedundancyOptimizer stage 1.")


# --- 2. what to shard or checkpoint for a budget ------------------------------------------------------------

def _reference_plan(cfg: GPTConfig, world_size: int, budget: float) -> tuple[int, bool] | None:
    n = parameter_count(cfg)
    for checkpointed in (False, True):
        for stage in range(4):
            if reference_per_rank_bytes(n, world_size, stage) + activation_bytes(cfg, checkpointed) <= budget:
                return stage, checkpointed
    return None


def _plan_bytes(cfg: GPTConfig, world_size: int, plan: tuple[int, bool]) -> float:
    return reference_per_rank_bytes(parameter_count(cfg), world_size, plan[0]) + activation_bytes(cfg, plan[1])


PLAN_CASES: tuple[tuple[GPTConfig, int, float], ...] = (
    (GPTConfig(vocab=50_304, seq_len=1024, d_model=768, n_heads=12, n_layers=12, batch=8), 8, 80 * 2**30),
    (GPTConfig(vocab=50_304, seq_len=1024, d_model=768, n_heads=12, n_layers=12, batch=8), 8, 8 * 2**30),
    (GPTConfig(vocab=50_304, seq_len=2048, d_model=2048, n_heads=16, n_layers=24, batch=4), 8, 32 * 2**30),
    (GPTConfig(vocab=50_304, seq_len=2048, d_model=2048, n_heads=16, n_layers=24, batch=4), 4, 24 * 2**30),
    (GPTConfig(vocab=50_304, seq_len=2048, d_model=4096, n_heads=32, n_layers=32, batch=8), 8, 26 * 2**30),
    (GPTConfig(vocab=50_304, seq_len=2048, d_model=4096, n_heads=32, n_layers=32, batch=1), 8, 40 * 2**30),
    (GPTConfig(vocab=50_304, seq_len=2048, d_model=4096, n_heads=32, n_layers=32, batch=1), 2, 24 * 2**30),
)
"""(model with the per-rank batch, ranks, bytes per GPU) of exercise 2; the notebook prints them."""


def check_memory_plan(fn: Callable[[GPTConfig, int, float], tuple[int, bool] | None]) -> Verdict:
    """Exercise: ``fn(cfg, world_size, budget_bytes)`` returns ``(stage, checkpointed)``, the least sharding
    that fits (stage 0 before 1, 2, 3; activation checkpointing only when no stage fits without it), or
    None when nothing fits."""
    bad = _valid_call(fn, "check_memory_plan(plan)")
    if bad is not None:
        return bad
    for cfg, w, budget in PLAN_CASES:
        where = (f"d_model {cfg.d_model}, {cfg.n_layers} blocks, batch {cfg.batch} × {cfg.seq_len} per rank, "
                 f"{w} ranks, {budget / 2**30:.0f} GiB per GPU")
        try:
            got = fn(cfg, w, budget)
        except Exception as exc:  # the student's code: report any failure as feedback
            return fail(f"for {where}, your function raised {type(exc).__name__}: {exc}")
        want = _reference_plan(cfg, w, budget)
        if got is None or want is None:
            if got is None and want is not None:
                return fail(f"for {where} you found no plan, but one fits.",
                            "try every stage without checkpointing first, then every stage with it.")
            if got is not None and want is None:
                return fail(f"for {where} nothing fits, even stage 3 with checkpointing; you returned {got!r}.",
                            "return None when no plan fits: the job needs more ranks, a smaller batch, or "
                            "offloading.")
            continue
        if (not isinstance(got, tuple) or len(got) != 2 or type(got[0]) is not int or got[0] not in (0, 1, 2, 3)
                or not isinstance(got[1], bool)):
            return fail(f"for {where} you returned {got!r}; expected (stage, checkpointed): stage 0 to 3 and "
                        "True or False, or None.")
        need = _plan_bytes(cfg, w, got)
        if need > budget:
            return fail(f"for {where}, your plan {got} needs {need / 2**30:.1f} GiB per GPU: it does not fit.",
                        "add the activations of one rank's batch to the sharded states.")
        if got[1] and not want[1]:
            return fail(f"for {where}, your plan {got} checkpoints activations, but a ZeRO stage fits without "
                        "recomputing them.", "checkpointing costs a forward pass more per step: try every "
                        "stage without it first.")
        if got[0] > want[0] and got[1] == want[1]:
            return fail(f"for {where}, your plan {got} fits, but a lower stage fits too.",
                        "each stage adds communication or latency: take the first one that fits.")
        if got != want:
            return fail(f"for {where}, your plan {got} is not the least one that fits.",
                        "try stages 0 to 3 without checkpointing, then stages 0 to 3 with it.")
    return ok(f"all {len(PLAN_CASES)} jobs get the least plan that fits, and None where nothing does.")


# --- 3. a 4-rank checkpoint loaded in one process -----------------------------------------------------------

def check_load_on_one_process(fn: Callable[[str | os.PathLike[str]], nn.Module],
                              folder: str | os.PathLike[str], expected: dict[str, torch.Tensor]) -> Verdict:
    """Exercise: ``fn(folder)`` returns a plain (unsharded) model holding the weights of the DCP checkpoint in
    ``folder``, loaded in this process without a process group; ``expected`` is its full state dict."""
    bad = _valid_call(fn, "check_load_on_one_process(load_on_one_process, folder, expected)")
    if bad is not None:
        return bad
    try:
        model = fn(folder)
    except (IsADirectoryError, PermissionError) as exc:
        return fail(f"your function raised {type(exc).__name__}: {exc}",
                    "the checkpoint is a folder written by torch.distributed.checkpoint, not a torch.save "
                    "file: load it with dcp.load (or load_sharded) into a state dict of the same structure.")
    except (Exception, dcp.CheckpointException) as exc:  # the student's code: any failure is feedback
        # dcp's CheckpointException (a BaseException) carries each rank's own error
        errors = [e for e, _ in exc.failures.values()] if isinstance(exc, dcp.CheckpointException) else [exc]
        first = errors[0] if errors else exc
        text = str(first).splitlines()[0][:300] if str(first) else ""
        hint = ""
        if "Missing key" in str(first):
            hint = ("the checkpoint was saved as {'model': model.state_dict()}: its keys start with 'model.'; "
                    "load into a dict of the same structure.")
        return fail(f"your function raised {type(first).__name__}: {text}", hint)
    if dist.is_available() and dist.is_initialized():
        return fail("your function started a process group.", "one process needs none: dcp.load reads "
                    "every shard file itself when no process group exists.")
    if not isinstance(model, nn.Module):
        return fail(f"your function returned {type(model).__name__}; expected the model (an nn.Module).")
    state = model.state_dict()
    if set(state) != set(expected):
        return fail(f"your model's keys differ from the checkpoint's: {sorted(set(state) ^ set(expected))[:4]}.")
    wrong = [k for k in expected if not torch.equal(state[k].detach().cpu(), expected[k].cpu())]
    if wrong:
        return fail(f"{len(wrong)} of {len(expected)} tensors differ from the checkpoint's (first: {wrong[0]}).",
                    "dcp.load fills the tensors of the state dict you give it; give it the model's own "
                    "state_dict() (or call load_state_dict with the loaded one).")
    shards = len([p for p in os.listdir(folder) if p.endswith(".distcp")])
    return ok(f"all {len(expected)} tensors equal the checkpoint's, read from its {shards} shard file(s) in one "
              "process.")
