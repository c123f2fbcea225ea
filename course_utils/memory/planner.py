"""Notebook 08 (and 07, for how much memory a cell needs): will a training job fit? A memory plan that predicts
each **phase** of a step, term by term.

`plan_memory(cfg, ...)` predicts the memory of one training step (forward, backward, AdamW step) of
`course_utils.models.GPT` of shape ``cfg`` (or any decoder-only transformer with the same numbers: token and
learned position embeddings, pre-norm blocks with LayerNorm, a 4·d GELU MLP, an untied head unless
``tied_head=True``, attention through a fused kernel or, with ``attention="math"``, PyTorch's reference
implementation), for:

- a precision: ``"fp32"``, or ``"bf16"`` with float32 master weights and AdamW state, applied one of two
  ways (`MIXED_PRECISION`): ``"autocast"`` (``torch.autocast`` casts the weights as they are used and caches
  the casts until it exits; ``autocast_cache=False`` stands for ``cache_enabled=False``) or ``"policy"``
  (FSDP2's ``MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)``: weights cast as
  they are gathered, every operation in bf16). Left out, the setup notebook 08 teaches: autocast for stages 0
  and 1, the policy for stages 2 and 3;
- activation checkpointing of every block (``checkpoint(..., use_reentrant=False)``, `GPT(cfg, checkpointed=True)`);
- a ZeRO stage on ``world_size`` GPUs, ``cfg.batch`` being one GPU's batch: 0 (one GPU, or DDP), 1 (DDP with
  ``ZeroRedundancyOptimizer``), 2 (FSDP2's ``fully_shard(..., reshard_after_forward=False)``: parameters,
  gradients and optimizer state sharded between steps, every block gathered from forward to backward), 3
  (``fully_shard``: blocks gathered one at a time). Stages 0 and 1 on several GPUs count DDP's gradient
  buckets; stages 2 and 3 count the gathered root and blocks, the unsharded block gradient and the float32
  reduce-scatter buffers, and on several GPUs the all-gather's output buffer (from FSDP2's source);
- AdamW's implementation: ``foreach`` (CUDA's default) or ``fused``.

Each phase is a sum of terms (`MemoryPlan.phases`): the end of the last block's forward and the end of forward
(the loss), the start of backward (the loss's gradient), backward through each block (and, with FSDP2, the
reduce-scatter that follows each), and the optimizer's step; `MemoryPlan.by_measured_phase`
groups them as `measure_peak` measures. Every term is a count of tensors from the model's shapes; none is
fitted. Two terms lie outside what PyTorch's allocator counts and are stated separately: the CUDA context, and
a margin for the caching allocator's rounding and fragmentation (`MemoryPlan.total`).

`measure_peak(cfg, ...)` measures the same step, phase by phase: on a CUDA GPU with the caching allocator's
peak counter, on the CPU with the CPU allocator's running total (the profiler's memory events); stages 2 and 3
with FSDP2 on a one-rank group (or each rank of a job that `course_utils.distributed.launch.launch` started:
`measure_rank`).
"""

from __future__ import annotations

import gc
import os
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from ..devices import DeviceError, available_devices, find_device
from ..models import GPT, GPTConfig, token_batch

__all__ = ["ATTENTION", "CONTEXT_BYTES", "MARGIN", "MEASURED_PHASES", "MIXED_PRECISION", "PRECISIONS", "WORKSPACE_BYTES",
           "MemoryPlan", "Term", "cublas_workspace_bytes", "measure_peak", "measure_rank", "parameter_count",
           "plan_memory", "saved_by_a_block"]

PRECISIONS = ("fp32", "bf16")
MIXED_PRECISION = ("autocast", "policy")
"""How bf16 is applied: ``"autocast"`` (``torch.autocast`` over float32 weights, as notebook 07 trains) or
``"policy"`` (FSDP2's ``MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)``: the
weights are cast to bf16 as they are gathered, and every operation runs in bf16)."""
ATTENTION = ("fused", "math")
"""``"fused"``: a fused kernel (flash or memory-efficient), which saves one log-sum-exp per head and token;
``"math"``: PyTorch's reference implementation, which saves the t × t attention probabilities of every head."""


def cublas_workspace_bytes(major: int = 9) -> int:
    """The cuBLAS workspace PyTorch allocates through its caching allocator for each thread (and stream) that
    runs matrix products, on a GPU of compute capability ``major``.x, in recent PyTorch: 32 MiB on Hopper and
    Blackwell (9, 10, 12; older releases gave 32 MiB to sm_90 only), 8 MiB + 128 KiB before
    (``parseChosenWorkspaceSize`` in ``aten/src/ATen/cuda/CublasHandlePool.cpp``; ``CUBLAS_WORKSPACE_CONFIG``
    overrides it). A training step has two: the forward's thread and autograd's (measured on the H200)."""
    return 32 * 2**20 if major in (9, 10, 12) else 8 * 2**20 + 128 * 2**10


WORKSPACE_BYTES = cublas_workspace_bytes(9)
"""One cuBLAS workspace on the H200 that validated the plan (Hopper: 32 MiB)."""
CONTEXT_BYTES = 512 * 2**20
"""The CUDA context (driver state, loaded kernels): memory the GPU loses that PyTorch's allocator does not
see, about 0.5 GiB with CUDA 12–13 and lazy module loading. Measure yours: ``torch.cuda.mem_get_info()``
after the first CUDA call, against ``torch.cuda.memory_reserved()``."""
MARGIN = 0.10
"""The share of the allocated peak to keep free for the caching allocator: it rounds sizes up (to 512 B,
and large blocks to 2 MiB segments) and fragments, so it reserves more than it hands out."""


def parameter_count(cfg: GPTConfig, tied_head: bool = False) -> int:
    """Parameters of `course_utils.models.GPT` of shape ``cfg``: embeddings, blocks, final norm and head
    (``tied_head``: the head's weight is the token embedding's, counted once)."""
    d, v = cfg.d_model, cfg.vocab
    return v * d + cfg.seq_len * d + cfg.n_layers * _block_params(d) + 2 * d + (0 if tied_head else d * v) + v


def _block_params(d: int) -> int:
    return (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d) + 2 * 2 * d


def saved_by_a_block(d: int, h: int, t: int, act: int, res: int,
                      attention: str) -> tuple[tuple[str, int], ...]:
    """The tensors one `course_utils.models.Block` saves for its backward, in the order its forward makes them:
    ``(name, bytes per token)``, for ``d`` features, ``h`` heads, sequences of ``t`` tokens, ``act`` bytes per
    number of what the matrix products make, ``res`` of the residual stream; ``attention`` as `plan_memory`
    takes it. A tensor that several operations save counts once, as autograd holds it once: a fused kernel saves
    q, k and v as views of the qkv layer's output, and its output is the projection's input; the math one saves
    copies (q and k scaled, v reshaped) and copies its output into the projection's input, the same bytes.
    LayerNorm's statistics are float32 whatever the precision. `plan_memory`'s activations per block are the
    sum, times the tokens of the batch."""
    attention_saves = (("attention log-sum-exp", 4 * h) if attention == "fused"  # float32, per head
                       else ("attention probabilities", act * h * t))  # t per head: the t × t matrix's row
    return (("first norm's input (the block's input)", res * d),
            ("first norm's mean and rstd", 4 + 4),
            ("qkv layer's input (first norm's output)", act * d),
            ("q, k, v", 3 * act * d),
            attention_saves,
            ("attention output (projection's input)", act * d),
            ("second norm's input (the residual)", res * d),
            ("second norm's mean and rstd", 4 + 4),
            ("MLP's input (second norm's output)", act * d),
            ("GELU's input (first MLP layer's output)", 4 * act * d),
            ("GELU's output (second MLP layer's input)", 4 * act * d))


@dataclass(frozen=True)
class Term:
    """One term of a phase: its name, its bytes, and why they are there."""

    name: str
    nbytes: float
    why: str


@dataclass(frozen=True)
class MemoryPlan:
    """A predicted training step: the terms of each phase (bytes per GPU, as the allocator counts them), the
    phase with the largest sum (`peak_phase`), and the two terms outside the allocator."""

    job: str
    phases: dict[str, tuple[Term, ...]]
    context: float = CONTEXT_BYTES
    margin: float = MARGIN

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=lambda p: sum(t.nbytes for t in self.phases[p]))

    @property
    def terms(self) -> tuple[Term, ...]:
        """The terms of the peak phase."""
        return self.phases[self.peak_phase]

    @property
    def peak(self) -> float:
        """The predicted ``torch.cuda.max_memory_allocated()`` of the step (above what was there before)."""
        return sum(t.nbytes for t in self.terms)

    @property
    def total(self) -> float:
        """What the GPU must have: the peak, the allocator's margin on it, and the CUDA context."""
        return self.peak * (1 + self.margin) + self.context

    @property
    def by_measured_phase(self) -> dict[str, float]:
        """The predicted peak of each of `MEASURED_PHASES` (the largest of the plan's phases within it), to
        set beside what `measure_peak` returns."""
        groups = {"forward": "forward", "backward (the loss)": "backward (the loss)",
                  "backward (blocks)": "backward (block", "optimizer step": "optimizer step"}
        return {m: max(sum(t.nbytes for t in terms) for p, terms in self.phases.items() if p.startswith(prefix))
                for m, prefix in groups.items()}

    def fits(self, gpu_bytes: float) -> bool:
        return self.total <= gpu_bytes

    def table(self) -> str:
        """The peak phase's terms, then the margin and the context, one line each, in GiB."""
        lines = [f"{self.job}", f"peak in: {self.peak_phase}"]
        for t in self.terms:
            lines.append(f"  {t.name:<28} {t.nbytes / 2**30:8.2f} GiB  {t.why}")
        lines.append(f"  {'= allocated peak':<28} {self.peak / 2**30:8.2f} GiB")
        lines.append(f"  {'+ allocator margin':<28} {self.peak * self.margin / 2**30:8.2f} GiB  "
                     f"{self.margin:.0%} of the peak: rounding and fragmentation")
        lines.append(f"  {'+ CUDA context':<28} {self.context / 2**30:8.2f} GiB  outside the allocator")
        lines.append(f"  {'= needed on the GPU':<28} {self.total / 2**30:8.2f} GiB")
        return "\n".join(lines)


def plan_memory(cfg: GPTConfig, precision: str = "fp32", checkpointing: bool = False, stage: int = 0,
                world_size: int = 1, fused_adamw: bool = False, mixed_precision: str | None = None, *,
                tied_head: bool = False, attention: str = "fused", autocast_cache: bool = True,
                workspace: float = WORKSPACE_BYTES, context: float = CONTEXT_BYTES,
                margin: float = MARGIN) -> MemoryPlan:
    """Predict the memory of one training step of `GPT` of shape ``cfg`` on each of ``world_size`` GPUs
    (``cfg.batch`` sequences per GPU), phase by phase. See the module's docstring for the options."""
    mixed = _resolve(precision, stage, world_size, mixed_precision)
    if attention not in ATTENTION:
        raise ValueError(f"attention must be one of {ATTENTION}, got {attention!r}")
    b, t, d, h, v, L = cfg.batch, cfg.seq_len - 1, cfg.d_model, cfg.n_heads, cfg.vocab, cfg.n_layers
    W, btd, fsdp = world_size, cfg.batch * (cfg.seq_len - 1) * cfg.d_model, stage >= 2
    # bytes per number: `act` for what the matrix products make and save, `res` for the residual stream and
    # the norms' inputs, `p` for gathered parameters and the gradients autograd computes for them
    act = 4 if mixed == "fp32" else 2
    res = p = 2 if mixed == "policy" else 4
    dtype = "bf16" if p == 2 else "float32"
    n, n_block = parameter_count(cfg, tied_head), _block_params(d)
    n_root = n - L * n_block  # embeddings, final norm, head: FSDP2's root unit
    n_head = d * v + v + 2 * d  # head and final norm: their gradients come first in backward
    linear_block = 12 * d * d + 9 * d  # a block's four linear layers, weights and biases (autocast casts these)
    # what each stage divides by W: 1 the optimizer state, 2 the gradients, 3 the parameters. Stages 2 and 3
    # are FSDP2's fully_shard, which keeps parameters sharded between steps at both
    shard = {1: W if stage >= 1 else 1, 2: W if stage >= 2 else 1, 3: W if fsdp else 1}

    # --- what is there in every phase --------------------------------------------------------------------
    base = [Term("parameters", 4 * n / shard[3], f"float32, {n / 1e6:.1f} M" + _per(shard[3])),
            Term("AdamW state", 8 * n / shard[1], "two float32 moments" + _per(shard[1])),
            Term("the batch", 8 * b * (t + 1), "int64 token ids"),
            Term("cuBLAS workspaces", 2 * workspace, "one per thread that multiplies matrices: the forward's "
                 "and autograd's")]
    if stage <= 1 and W > 1:
        base.append(Term("DDP gradient buckets", 4 * n, "a second copy of the gradients, for the all-reduce "
                         "(gradient_as_bucket_view=False, the default)"))
    # FSDP2 keeps the root gathered from its forward to the end of backward (the root's
    # reshard_after_forward is False), in the policy's param_dtype
    root = [Term("gathered root", p * n_root, f"embeddings, final norm and head, {dtype}")] if fsdp else []
    # On several GPUs FSDP2 all-gathers into a buffer and copies out of it: in forward the last unit's buffer
    # is kept until the next unit is gathered; in backward the next unit's all-gather is issued early
    buffer = p * n_block if fsdp and W > 1 else 0

    # --- activations: what autograd saves for backward --------------------------------------------------
    per_block = b * t * sum(nbytes for _name, nbytes in saved_by_a_block(d, h, t, act, res, attention))
    kept = res * btd if checkpointing else per_block  # per block, until its backward
    acts = Term("activations", L * kept, ("each block's input (checkpointed)" if checkpointing else
                                          f"{L} blocks × {per_block / 2**20:,.0f} MiB saved for backward"))
    outside = Term("activations outside blocks", (res + act) * btd + 8 * b * t + 4 * b * t * v + 4 + 8 * (b * t + t),
                   "final norm, head input, log-softmax of the logits, targets, positions")
    logits = Term("logits", b * t * v * (act + (4 if act == 2 else 0)),
                  "the head's output" + (" and its float32 copy for the loss" if act == 2 else ""))
    # autocast's bf16 copies of the weights: cached until autocast exits (unless cache_enabled=False), and
    # saved by the linear layers for backward (the blocks' only when they are not checkpointed)
    cached = mixed == "autocast" and autocast_cache
    copies = ([Term("bf16 weight copies", 2 * ((0 if checkpointing else L * 12 * d * d) + d * v),
                    "saved by the linear layers" + (" (the head's: the blocks' are recomputed)"
                                                   if checkpointing else ""))] if mixed == "autocast" else [])
    cache = ([Term("autocast's cast cache", 2 * (L * linear_block + d * v + v), "bf16 copies of every linear "
                   "layer's weights and biases, kept until autocast exits")] if cached else copies)
    gathered_fwd = ([Term("gathered blocks", p * L * n_block, "every block, gathered until its backward "
                          "(reshard_after_forward=False)")] if stage == 2 else [])

    # the end of the last block's forward; checkpointed, its inside is alive only while it runs
    in_block = [*base, *root, *gathered_fwd, Term("activations", L * kept, "of the blocks before and this one")]
    if stage == 3:
        in_block.append(Term("gathered block", p * n_block + buffer, "the last block's parameters" +
                             (" and its all-gather buffer" if buffer else "")))
    if stage == 2 and buffer:
        in_block.append(Term("all-gather buffer", buffer, "the last block's, kept until the root's forward ends"))
    if checkpointing:  # at its GELU: q, k, v and the attention's output (Python locals), the residual, the
        # second norm's output (and its bf16 copy under autocast), the first MLP layer's output and the GELU's
        norm_out = {"fp32": 4, "autocast": 4 + 2, "policy": 2}[mixed]
        in_block.append(Term("block in flight", (4 * act + res + norm_out + 8 * act) * btd,
                             "the last block's forward, not saved"))
    if mixed == "autocast" and (cached or not checkpointing):
        in_block.append(Term("bf16 weight copies", 2 * L * (linear_block if cached else 12 * d * d),
                             "of the blocks' weights: " + ("autocast's cache" if cached else "saved for backward")))
    phases: dict[str, tuple[Term, ...]] = {
        "forward (last block)": tuple(in_block),
        "forward (the loss)": (*base, *root, *gathered_fwd, acts, outside, *cache, logits),
    }

    # --- the start of backward: the loss's gradient ------------------------------------------------------
    prefetched = ([Term("prefetched block", buffer, "the last block's all-gather, issued early")]
                  if stage == 3 and buffer else [])
    phases["backward (the loss)"] = (*base, *root, *gathered_fwd, *prefetched, acts, outside, *copies,
                                     Term("gradient of the logits", 2 * 4 * b * t * v, "two float32 b·t·vocab "
                                          "tensors in the loss's backward (nll_loss's and log_softmax's)"))

    # --- backward through the blocks, last first: gradients grow, activations shrink --------------------
    # Inside block i's backward the peak comes in its MLP (backward starts there): the block recomputed (when
    # checkpointed), the MLP's weight gradients already made, and the gradients flowing through the MLP (the
    # residual's, a 4·d-wide one, a d-wide one). With FSDP2 a second moment follows once the block is done:
    # its gathered weights are freed, and its gradient is copied into a float32 reduce-scatter input.
    in_flight = (res + 4 * act + act) * btd
    mlp = 8 * d * d + 5 * d  # the MLP's parameters: their gradients come first in a block's backward
    for i in reversed(range(L)):  # every block: the previous block's buffer joins from the second one on
        done = (L - 1 - i) * n_block  # blocks whose gradients are complete
        terms = [*base, *root]
        if stage == 2:
            terms.append(Term("gathered blocks", p * (i + 1) * n_block, f"blocks 0 to {i}, still gathered"))
        if stage == 3:
            terms.append(Term("gathered blocks", p * n_block + buffer, "this block" +
                              (" and the next one, prefetched" if buffer else "")))
        if fsdp:
            grads = [Term("root gradients", p * n_head, f"the head's and final norm's, {dtype}, unsharded "
                          "until backward ends"),
                     Term("gradients so far", 4 * done / W, "float32, reduce-scattered" + _per(W))]
            terms += [*grads, Term("block gradient", p * mlp, f"this block's MLP's, {dtype}")]
            if i < L - 1:
                terms.append(Term("reduce-scatter buffer", 4 * n_block, "the previous block's float32 "
                                  "reduce-scatter input, kept until this block's is issued"))
        else:
            terms.append(Term("gradients so far", 4 * (n_head + done + mlp) / shard[2],
                              "float32, this block's MLP's included" + _per(shard[2])))
        terms.append(Term("activations", (i + 1) * kept, f"of blocks 0 to {i}"))
        if checkpointing:
            terms.append(Term("recomputed block", per_block, "its forward run again, everything saved"))
        if mixed == "autocast":
            terms.append(Term("bf16 weight copies", 2 * 12 * d * d * (1 if checkpointing else i + 1),
                              "of the blocks not yet through backward"))
        terms.append(Term("gradients in flight", in_flight, "through the MLP"))
        phases[f"backward (block {i})"] = tuple(terms)
        if fsdp:  # the block is done: reshard it, then reduce-scatter its gradient (the previous input freed)
            after = [*base, *root, *grads,
                     Term("reduce-scatter input", 4 * n_block, "this block's gradient in float32"),
                     Term("block gradient or its shard", max(p * n_block, 4 * n_block / W),
                          f"the {dtype} gradient until copied, then the float32 reduce-scatter output"),
                     Term("activations", i * kept, f"of blocks 0 to {i - 1}"),
                     Term("gradient in flight", res * btd, "the residual's, to the block before")]
            if stage == 2:
                after.append(Term("gathered blocks", p * i * n_block, f"blocks 0 to {i - 1}, still gathered"))
            if stage == 3 and buffer:
                after.append(Term("prefetched block", buffer, "the next block's all-gather"))
            phases[f"backward (block {i}, reduce-scatter)"] = tuple(after)

    # --- the optimizer's step ---------------------------------------------------------------------------
    opt = [*base, Term("gradients", 4 * n / shard[2], "float32" + _per(shard[2]))]
    if not fused_adamw:
        opt.append(Term("AdamW temporaries", 4 * n / shard[1], "foreach: sqrt of the second moment, one "
                        "float32 tensor per parameter"))
    phases["optimizer step"] = tuple(opt)

    how = {"fp32": "fp32", "autocast": "bf16 (autocast)", "policy": "bf16 (FSDP2 MixedPrecisionPolicy)"}[mixed]
    job = (f"{n / 1e9:.2f} B parameters, batch {b} × {cfg.seq_len}, {how}"
           f"{', every block checkpointed' if checkpointing else ''}, ZeRO stage {stage} on {W} GPU(s)"
           f", AdamW {'fused' if fused_adamw else 'foreach'}")
    return MemoryPlan(job, phases, context, margin)


def _resolve(precision: str, stage: int, world_size: int, mixed_precision: str | None) -> str:
    """"fp32", "autocast" or "policy", with a clear error for a combination no course setup trains with."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stages are 0 (none), 1, 2 and 3 (FSDP2's fully_shard), got {stage!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if precision == "fp32":
        if mixed_precision is not None:
            raise ValueError(f"mixed_precision={mixed_precision!r} is for precision 'bf16'; fp32 has none")
        return "fp32"
    mixed = mixed_precision or ("autocast" if stage <= 1 else "policy")
    if mixed not in MIXED_PRECISION:
        raise ValueError(f"mixed_precision must be one of {MIXED_PRECISION} or None, got {mixed_precision!r}")
    if mixed == "policy" and stage <= 1:
        raise ValueError(f"stage {stage} trains with DDP, which has no MixedPrecisionPolicy: the policy belongs "
                         "to FSDP2's fully_shard (stages 2 and 3); use mixed_precision='autocast'")
    return mixed


def _per(k: int) -> str:
    return f", 1/{k} per GPU" if k > 1 else ""


MEASURED_PHASES = ("forward", "backward (the loss)", "backward (blocks)", "optimizer step")
"""The phases `measure_peak` reports, in the order a step runs them."""


def measure_peak(cfg: GPTConfig, precision: str = "fp32", checkpointing: bool = False, stage: int = 0,
                 fused_adamw: bool = False, mixed_precision: str | None = None, warmup: int = 2,
                 device: str = "cuda", snapshot: str | os.PathLike[str] | None = None,
                 autocast_cache: bool = True) -> dict[str, int]:
    """Build `GPT` of shape ``cfg`` and AdamW, train ``warmup`` steps, then measure one step's phases.

    ``stage`` 0 trains the model as it is; 2 and 3 shard it with FSDP2's ``fully_shard`` (each block, then the
    root; ``reshard_after_forward=False`` for stage 2) over the process group that is initialised, or over a
    one-rank group made for the measurement (NCCL on a GPU, gloo on the CPU), so that the gathered parameters,
    the reduce-scatter buffers and the mixed-precision casts are FSDP2's own. ``mixed_precision`` is resolved
    as `plan_memory` resolves it; ``autocast_cache=False`` passes ``cache_enabled=False`` to autocast;
    ``cfg.batch`` is this process's batch.

    ``device="cuda"`` reads the caching allocator's counters (``torch.cuda.max_memory_allocated()``), after
    freeing the cuBLAS workspaces so that the step allocates its own; ``device="cpu"`` reads the CPU
    allocator's running total from the profiler's memory events (``profile_memory=True``).

    Returns the bytes above what was allocated before the model was made: each of `MEASURED_PHASES` (the
    largest amount during it; backward is split where the gradient reaches the last block's output),
    ``"peak"`` (their largest), ``"between steps"`` (allocated after ``zero_grad``), and on a GPU
    ``"reserved"`` (the most the allocator reserved from the GPU in the step, all of it). ``snapshot`` (GPU
    only): a file for the measured step's allocator history (``torch.cuda.memory._dump_snapshot``; open it
    on https://pytorch.org/memory_viz), with a 1 KiB marker tensor where each phase ends."""
    import torch.distributed as dist

    mixed = _resolve(precision, stage, 1, mixed_precision)
    if stage == 1:
        raise ValueError("stage 1 is DDP with ZeroRedundancyOptimizer; measure_peak trains stages 0, 2 and 3 "
                         "(the model as it is, and FSDP2's fully_shard)")
    where = find_device(device)  # CUDA's index filled in; a name that is no device: DeviceError (course_utils.devices)
    if where is None:
        raise DeviceError(f"measure_peak(device={str(device)!r}): this machine has no such device (it has "
                          f"{', '.join(available_devices())}); device='cpu' measures the CPU's allocator")
    if where.type not in ("cuda", "cpu"):
        raise ValueError(f"measure_peak reads the allocators of 'cuda' and 'cpu', not {where.type!r}")
    if snapshot is not None and where.type != "cuda":
        raise ValueError("snapshot= records the CUDA caching allocator's history: it needs device='cuda'")
    own_group = stage >= 2 and not dist.is_initialized()
    if own_group:
        dist.init_process_group("nccl" if where.type == "cuda" else "gloo", store=dist.HashStore(), rank=0,
                                world_size=1, device_id=where if where.type == "cuda" else None)
    counter = _CudaCounter(where, snapshot) if where.type == "cuda" else _CpuCounter()
    try:
        return _measure(cfg, mixed, checkpointing, stage, fused_adamw, warmup, where, counter, autocast_cache)
    finally:
        if own_group:
            dist.destroy_process_group()
        gc.collect()  # FSDP2's modules hold reference cycles: free them before anything else is measured
        if where.type == "cuda":
            torch.cuda.empty_cache()


class _CudaCounter:
    """Phase peaks from the caching allocator's peak counter, reset at the start of each phase."""

    def __init__(self, device: torch.device, snapshot: str | os.PathLike[str] | None) -> None:
        self.device, self.snapshot, self.reserved = device, snapshot, 0
        self.peaks: dict[str, int] = {}
        gc.collect()
        torch.cuda.synchronize(device)
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:  # the step allocates its own: one for this thread, one for autograd's
            clear()
            x = torch.zeros(1, device=device, requires_grad=True)
            y = x * 1
            y.register_hook(lambda grad: clear())  # runs on autograd's thread for this device
            y.sum().backward()
            del x, y
            torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        self.start = torch.cuda.memory_allocated(device)

    def begin_step(self, measured: bool) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        if measured and self.snapshot is not None:
            torch.cuda.memory._record_memory_history(max_entries=200_000)
        self.measured = measured

    def close(self, phase: str) -> None:
        if self.measured:
            self.peaks[phase] = torch.cuda.max_memory_allocated(self.device) - self.start
            if self.snapshot is not None:  # a marker in the history: a 1 KiB tensor per phase
                torch.empty(1024 * len(self.peaks), dtype=torch.uint8, device=self.device)
        torch.cuda.reset_peak_memory_stats(self.device)

    def end_step(self) -> None:
        if self.measured:
            self.reserved = torch.cuda.max_memory_reserved(self.device)
            if self.snapshot is not None:
                torch.cuda.memory._dump_snapshot(str(self.snapshot))
                torch.cuda.memory._record_memory_history(enabled=None)

    def finish(self) -> dict[str, int]:
        return {"between steps": torch.cuda.memory_allocated(self.device) - self.start, "reserved": self.reserved}


class _CpuCounter:
    """Phase peaks from the CPU allocator's running total (`course_utils.memory.accounting.CpuAllocations`),
    counted from before the model was made."""

    def __init__(self) -> None:
        from .accounting import CpuAllocations

        gc.collect()
        self.peaks: dict[str, int] = {}
        self.cpu = CpuAllocations().__enter__()

    def begin_step(self, measured: bool) -> None:
        self.measured = measured
        if measured:
            self.cpu.mark("the step starts")

    def close(self, phase: str) -> None:
        if self.measured:
            self.cpu.mark(phase)

    def end_step(self) -> None:
        pass

    def finish(self) -> dict[str, int]:
        self.cpu.__exit__(None, None, None)
        self.peaks = {phase: self.cpu.peak[phase] for phase in MEASURED_PHASES}
        return {"between steps": self.cpu.at["end"]}


def _measure(cfg: GPTConfig, mixed: str, checkpointing: bool, stage: int, fused_adamw: bool, warmup: int,
             device: torch.device, counter: _CudaCounter | _CpuCounter, autocast_cache: bool) -> dict[str, int]:
    torch.manual_seed(0)
    model = GPT(cfg, checkpointed=checkpointing).to(device)
    if stage >= 2:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
                  if mixed == "policy" else MixedPrecisionPolicy())
        # the mesh names the device: without it fully_shard takes the machine's accelerator, CUDA on a GPU
        # host, even for a model measured on the CPU
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        for block in model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=stage == 3)
        fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=None if stage == 3 else False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused_adamw or None)
    tokens = token_batch(cfg, torch.Generator().manual_seed(0)).to(device)
    watch = {"on": False}

    def on_last_block(_module: torch.nn.Module, _args: object, out: torch.Tensor) -> None:
        if watch["on"] and out.requires_grad:  # not in a checkpointed block's recomputation
            out.register_hook(lambda _grad: counter.close("backward (the loss)"))

    hook = model.blocks[-1].register_forward_hook(on_last_block)
    with warnings.catch_warnings():  # FSDP2 warns that the logits are a view (harmless here: notebook 08, §3)
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
        for step in range(warmup + 1):
            counter.begin_step(measured=step == warmup)
            watch["on"] = step == warmup
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=mixed == "autocast",
                                cache_enabled=autocast_cache):
                loss = model.loss(tokens)
            watch["on"] = False
            counter.close("forward")
            loss.backward()
            del loss
            counter.close("backward (blocks)")
            opt.step()
            counter.close("optimizer step")
            opt.zero_grad(set_to_none=True)
            counter.end_step()
    hook.remove()
    out = counter.finish()
    del model, opt, tokens
    phases = {phase: counter.peaks[phase] for phase in MEASURED_PHASES}
    return {**phases, "peak": max(phases.values()), **out}


def measure_rank(rank: int, world_size: int, cfg: GPTConfig, options: dict[str, Any]) -> dict[str, int]:
    """`measure_peak` on one rank of a job that `course_utils.distributed.launch.launch` started (the process group is
    joined): ``options`` are its keyword arguments. Each rank measures its own process's allocator."""
    return measure_peak(cfg, **options)
