"""Checkers for notebook 08 (when the model does not fit). They run on the CPU, so every student gets feedback.

Exercise 1 shards the states by the ZeRO stages with the bytes per parameter it is given; exercise 2 plans a
job by its predicted peak (`course_utils.memory_plan`); exercise 3 resumes training in one process from a
sharded checkpoint of model and optimizer.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from fractions import Fraction
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from ..memory_plan import parameter_count, plan_memory
from ..models import GPT, GPTConfig, token_batch
from . import Verdict, fail, ok

__all__ = ["FEWEST_CASES", "PLAN_CASES", "activation_bytes", "check_fewest_gpus", "check_memory_plan",
           "check_resume_on_one_process", "parameter_count", "reference_fewest_gpus", "reference_per_rank_bytes"]


# --- the reference memory model -------------------------------------------------------------------------

def activation_bytes(cfg: GPTConfig, checkpointed: bool = False) -> int:
    """Bytes autograd saves for backward in `GPT.loss` on a batch of ``cfg.batch`` sequences (float32), the
    token batch included: the memory plan's saved terms. With ``checkpointed``, each block keeps only its input."""
    saved = ("activations", "activations outside blocks", "the batch")
    phase = plan_memory(cfg, "fp32", checkpointed).phases["backward (the loss)"]
    return int(sum(t.nbytes for t in phase if t.name in saved))


def reference_per_rank_bytes(n_params: int, world_size: int, stage: int) -> float:
    """Bytes of parameters, gradients and AdamW state one rank holds with ZeRO ``stage`` on ``world_size``."""
    if stage not in (0, 1, 2, 3) or world_size < 1:
        raise ValueError(f"ZeRO stages are 0 to 3 and a world has at least 1 rank; got stage {stage}, "
                         f"world size {world_size}")
    return _states_per_gpu(n_params, stage, (4.0, 4.0, 8.0), world_size)  # float32: weights, gradients, AdamW


def _valid_call(fn: Any, name: str) -> Verdict | None:
    if not callable(fn):
        return fail(f"expected your function, got {type(fn).__name__}.", f"pass the function itself: {name}")
    return None


# --- 1. the fewest GPUs for a ZeRO stage ------------------------------------------------------------------

def _states_per_gpu(n: int, stage: int, counts: tuple[float, float, float], world: int) -> float:
    return sum(b * n / (world if i >= 3 - stage else 1) for i, b in enumerate(counts))


def reference_fewest_gpus(n_params: int, gpu_bytes: float, stage: int, weights: float = 2, grads: float = 2,
                          optimizer: float = 12) -> int | None:
    """The fewest GPUs on which one GPU's share of the states (``weights``, ``grads`` and ``optimizer`` bytes per
    parameter, the last including any master copy) fits in ``gpu_bytes`` at ZeRO ``stage``; None if none does."""
    per_parameter = (weights, grads, optimizer)
    whole = Fraction(sum(per_parameter[:3 - stage])) * n_params  # what every GPU holds whole at this stage
    sharded = Fraction(sum(per_parameter[3 - stage:])) * n_params
    room = Fraction(gpu_bytes) - whole
    if room < 0 or (room == 0 and sharded > 0):
        return None
    return 1 if sharded == 0 else max(1, math.ceil(sharded / room))


FEWEST_CASES: tuple[tuple[int, float, int, tuple[float, float, float]], ...] = tuple(
    (n, gpu, stage, counts)
    for n, gpu in ((1_000_000_000, 24e9), (7_500_000_000, 80e9), (70_000_000_000, 80e9), (7_500_000_000, 40e9))
    for stage in range(4) for counts in ((2, 2, 12), (4, 4, 8)))
"""(parameters, bytes per GPU, stage, bytes per parameter: weights, gradients, optimizer state) of exercise 1."""


def check_fewest_gpus(fn: Callable[..., int | None]) -> Verdict:
    """Exercise: ``fn(n_params, gpu_bytes, stage, weights, grads, optimizer)`` returns the fewest GPUs on which
    each GPU's share of the states fits at that ZeRO stage, or None when no number of GPUs is enough."""
    bad = _valid_call(fn, "check_fewest_gpus(fewest_gpus)")
    if bad is not None:
        return bad
    for n, gpu, stage, counts in FEWEST_CASES:
        call = f"fewest_gpus({n:_}, {gpu / 1e9:g}e9, {stage}, weights={counts[0]}, grads={counts[1]}, optimizer={counts[2]})"
        try:
            got = fn(n, gpu, stage, *counts)
        except Exception as exc:  # the student's code: report any failure as feedback
            return fail(f"{call} raised {type(exc).__name__}: {exc}")
        want = reference_fewest_gpus(n, gpu, stage, *counts)
        if got is not None and (not isinstance(got, int) or isinstance(got, bool) or got < 1):
            return fail(f"{call} returned {got!r}; expected a whole number of GPUs (at least 1), or None.")
        if got == want:
            continue
        per_gpu = partial(_states_per_gpu, n, stage, counts)
        if want is None:
            return fail(f"{call} returned {got}, but no number of GPUs is enough: every GPU holds "
                        f"{per_gpu(10**12) / 1e9:,.1f} GB whole at stage {stage}, more than its {gpu / 1e9:.0f} GB.",
                        "the part a stage does not shard stays whole on every GPU, however many there are.")
        ignored = reference_fewest_gpus(n, gpu, stage, 4, 4, 8) == got or reference_fewest_gpus(n, gpu, stage) == got
        hint = ("use the bytes per parameter the call passes in, not fixed ones." if ignored else
                "solve the stage's formula for the number of GPUs: what it shards, divided by N_d, must fit in "
                "what the unsharded part leaves of the GPU.")
        if got is None:
            return fail(f"{call} returned None, but {want} GPUs are enough ({per_gpu(want) / 1e9:,.2f} GB each).", hint)
        if got < want:
            return fail(f"{call} returned {got}: on {got} GPUs each holds {per_gpu(got) / 1e9:,.2f} GB, more than "
                        f"{gpu / 1e9:.0f} GB.", hint)
        return fail(f"{call} returned {got}, but {got - 1} GPUs are enough ({per_gpu(got - 1) / 1e9:,.2f} GB each).",
                    hint)
    return ok(f"all {len(FEWEST_CASES)} cases agree: 4 pairs of a model size and a GPU, stages 0 to 3, the ZeRO paper's "
              "mixed-precision bytes (2 + 2 + 12) and float32's (4 + 4 + 8).")


# --- 2. what to shard or checkpoint for a budget: the peak, not the states ---------------------------------

PLAN_PRECISION = "bf16"
"""Exercise 2's jobs train in bf16 as notebook 08 teaches: DDP with autocast for stages 0 and 1, FSDP2 with its
mixed-precision policy for stages 2 and 3 (`plan_memory`'s default); float32 master weights and AdamW state."""


def _reference_plan(cfg: GPTConfig, world_size: int, budget: float) -> tuple[int, bool] | None:
    for checkpointed in (False, True):
        for stage in range(4):
            if plan_memory(cfg, PLAN_PRECISION, checkpointed, stage, world_size).fits(budget):
                return stage, checkpointed
    return None


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
    whose predicted need (`course_utils.memory_plan.plan_memory`: the peak, its margin and the CUDA context)
    fits (stage 0 before 1, 2, 3; activation checkpointing only when no stage fits without it), or None."""
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
        if got is not None and (not isinstance(got, tuple) or len(got) != 2 or type(got[0]) is not int
                                or got[0] not in (0, 1, 2, 3) or not isinstance(got[1], bool)):
            return fail(f"for {where} you returned {got!r}; expected (stage, checkpointed): stage 0 to 3 and "
                        "True or False, or None.")
        if got == want:
            continue
        if got is None:
            return fail(f"for {where} you found no plan, but {want} fits.",
                        "try every stage without checkpointing first, then every stage with it.")
        plan = plan_memory(cfg, PLAN_PRECISION, got[1], got[0], w)
        if not plan.fits(budget):
            need = (f"{plan.total / 2**30:.1f} GiB per GPU: its largest phase, {plan.peak_phase}, allocates "
                    f"{plan.peak / 2**30:.1f} GiB, and the GPU also holds the CUDA context "
                    f"({plan.context / 2**30:.1f} GiB) and the allocator's margin ({plan.margin:.0%} of the peak)")
            if plan.peak <= budget:
                return fail(f"for {where}, your plan {got} needs {need}. The allocated peak alone fits in "
                            f"{budget / 2**30:.0f} GiB; the rest does not.",
                            "a GPU holds more than the tensors PyTorch allocates: what does the plan add to "
                            "its peak, and why?")
            states = reference_per_rank_bytes(parameter_count(cfg), w, got[0])
            saved = sum(t.nbytes for t in plan.phases["backward (the loss)"] if t.name.startswith("activations"))
            if states + saved <= budget:
                return fail(f"for {where}, your plan {got} needs {need}. Counting only the states and the "
                            f"saved activations ({(states + saved) / 2**30:.1f} GiB) misses what lives for a "
                            "moment: the logits' gradient, the gradients in flight, a recomputed block, "
                            "AdamW's temporaries, the gathered units.",
                            "a GPU runs out at the step's largest moment, not at what the step keeps: which "
                            "tensors exist during one phase only?")
            return fail(f"for {where}, your plan {got} needs {need}: it does not fit.",
                        "check each plan in the order asked, and keep the first that fits.")
        assert want is not None  # the student's plan fits, so the reference finds one
        if got[1] and not want[1]:
            return fail(f"for {where}, your plan {got} checkpoints activations, but a ZeRO stage fits without "
                        "recomputing them.", "checkpointing costs a forward pass more per step: try every "
                        "stage without it first.")
        if got[0] > want[0] and got[1] == want[1]:
            return fail(f"for {where}, your plan {got} fits, but a lower stage fits too.",
                        "take the first that fits, in the order asked: stage 3 all-gathers the weights again in "
                        "every forward and backward, and the lower stages need no such gathering.")
        return fail(f"for {where}, your plan {got} is not the least one that fits.",
                    "try stages 0 to 3 without checkpointing, then stages 0 to 3 with it.")
    return ok(f"all {len(PLAN_CASES)} jobs get the least plan that fits at its peak, and None where nothing does.")


# --- 3. resume in one process from a 4-rank checkpoint ------------------------------------------------------

RESUME_STEPS = (3, 5)
"""Exercise 3's checkpoint holds the state after step 3 of the job's 5."""


def check_resume_on_one_process(fn: Callable[[str | os.PathLike[str]], tuple[nn.Module, torch.optim.Optimizer]],
                                folder: str | os.PathLike[str], expected: dict[str, torch.Tensor],
                                tolerance: float = 1e-4) -> Verdict:
    """Exercise: ``fn(folder)`` returns ``(model, optimizer)``: a plain `GPT` and AdamW (lr 1e-3) holding the
    state of the DCP checkpoint in ``folder`` (``{"model": ..., "optim": ...}`` after step 3), loaded in this
    process without a process group. The checker trains them through steps 4 and 5 on the job's batches (the
    ``token_batch`` stream of seed 1) and compares with ``expected``, the weights of the run that never stopped."""
    bad = _valid_call(fn, "check_resume_on_one_process(resume_on_one_process, folder, expected)")
    if bad is not None:
        return bad
    try:
        got = fn(folder)
    except (IsADirectoryError, PermissionError) as exc:
        return fail(f"your function raised {type(exc).__name__}: {exc}",
                    "the checkpoint is a folder written by torch.distributed.checkpoint, not a torch.save "
                    "file: load it with dcp.load into a state dict of the same structure.")
    except (Exception, dcp.CheckpointException) as exc:  # the student's code: any failure is feedback
        # dcp's CheckpointException (a BaseException) carries each rank's own error
        errors = [e for e, _ in exc.failures.values()] if isinstance(exc, dcp.CheckpointException) else [exc]
        first = errors[0] if errors else exc
        text = str(first).splitlines()[0][:300] if str(first) else ""
        hint = ("the checkpoint holds {'model': ..., 'optim': ...}: load into a dict of the same structure."
                if "Missing key" in str(first) else "")
        return fail(f"your function raised {type(first).__name__}: {text}", hint)
    if dist.is_available() and dist.is_initialized():
        return fail("your function started a process group.", "one process needs none: dcp.load reads "
                    "every shard file itself when no process group exists.")
    if (not isinstance(got, tuple) or len(got) != 2 or not isinstance(got[0], nn.Module)
            or not isinstance(got[1], torch.optim.Optimizer)):
        return fail(f"your function returned {type(got).__name__}; expected (model, optimizer).")
    model, optimizer = got
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if {id(p) for p in params} != {id(p) for p in model.parameters()}:
        return fail("your optimizer does not update the parameters of the model you returned.",
                    "build the optimizer on model.parameters() of the model you return.")
    missing = sum(1 for p in params if not optimizer.state.get(p))
    if missing:
        return fail(f"your optimizer has no state for {missing} of {len(params)} parameters: a fresh AdamW "
                    "would start again from zero moments and step 1.",
                    "a resume needs everything the next step depends on, and AdamW's moments and step count "
                    "are in the checkpoint too: section 4's resume loads them with the model's.")
    steps = {int(s["step"]) for s in optimizer.state.values() if "step" in s}
    if steps != {RESUME_STEPS[0]}:
        return fail(f"your optimizer's step counts are {sorted(steps)}, not {RESUME_STEPS[0]}: its state is not "
                    "the checkpoint's.", "load the optimizer's state from the checkpoint, not from a new step.")
    if not isinstance(model, GPT):
        return fail(f"your model is a {type(model).__name__}, not the course's GPT.", "start from GPT(SMALL).")
    g = torch.Generator().manual_seed(1)
    for step in range(1, RESUME_STEPS[1] + 1):
        tokens = token_batch(model.cfg, g)
        if step > RESUME_STEPS[0]:
            model.loss(tokens).backward()
            optimizer.step()
            optimizer.zero_grad()
    state = model.state_dict()
    if set(state) != set(expected):
        return fail(f"your model's keys differ from the checkpoint's: {sorted(set(state) ^ set(expected))[:4]}.")
    difference = max((state[k].detach().cpu() - expected[k].cpu()).abs().max().item() for k in expected)
    if not difference < tolerance:
        return fail(f"after steps 4 and 5 your model is up to {difference:.2g} away from the run that never "
                    f"stopped (tolerance {tolerance:g}).",
                    "both the weights and AdamW's state must come from the checkpoint.")
    shards = len([p for p in os.listdir(folder) if p.endswith(".distcp")])
    return ok(f"resumed from {shards} shard file(s) in one process: after steps 4 and 5 every tensor is within "
              f"{tolerance:g} of the run that never stopped.")
