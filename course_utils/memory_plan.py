"""Notebook 08: will a training job fit? A memory plan that predicts the **peak** bytes per GPU, term by term.

`plan_memory(cfg, ...)` predicts the peak of one training step (forward, backward, AdamW step) of
`course_utils.models.GPT` of shape ``cfg`` (or any decoder-only transformer with the same numbers: token and
learned position embeddings, pre-norm blocks with LayerNorm, attention through a fused kernel, a 4·d GELU
MLP, an untied head), for:

- a precision: ``"fp32"``, or ``"bf16"`` (``torch.autocast`` to bfloat16 with float32 weights, gradients
  and AdamW state: the usual mixed precision);
- activation checkpointing of every block (``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``);
- a ZeRO stage (0: DDP or one GPU; 1: optimizer state sharded, as DDP with ``ZeroRedundancyOptimizer``; 2: and
  gradients; 3: and parameters, as FSDP2's ``fully_shard`` on every block does) on ``world_size`` GPUs,
  ``cfg.batch`` being one GPU's batch. Stages 0 and 1 on several GPUs count DDP's gradient buckets (a second
  copy of the gradients, unless DDP is built with ``gradient_as_bucket_view=True``);
- AdamW's implementation: ``foreach`` (the default on CUDA) or ``fused``.

The peak is the largest of the step's phases, each a sum of terms (`MemoryPlan.phases`): the end of forward,
the start of backward (the loss's gradient), backward through each block (with checkpointing: the block
recomputed), and the optimizer's step. Every term is a count of tensors from the model's shapes; none is
fitted. Two terms lie outside what PyTorch's allocator counts and are stated separately: the CUDA context,
and a margin for the caching allocator's rounding and fragmentation (`MemoryPlan.total`).

`measure_peak(cfg, ...)` measures the same step on a CUDA GPU: ``torch.cuda.max_memory_allocated()`` per
phase, above what was allocated before the model was made, after warm-up steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .models import GPT, GPTConfig, token_batch

__all__ = ["CONTEXT_BYTES", "MARGIN", "PRECISIONS", "WORKSPACE_BYTES", "MemoryPlan", "Term", "measure_peak",
           "parameter_count", "plan_memory"]

PRECISIONS = ("fp32", "bf16")
WORKSPACE_BYTES = 32 * 2**20 + 128 * 2**10
"""cuBLAS's workspace on Hopper GPUs, which PyTorch allocates through its caching allocator (so
``max_memory_allocated`` counts it) at the first matrix product on a stream: 32 MiB + 128 KiB
(``CUBLAS_WORKSPACE_CONFIG`` ``:4096:8`` and ``:16:8``; 8 MiB + 128 KiB on older GPUs)."""
CONTEXT_BYTES = 512 * 2**20
"""The CUDA context (driver state, loaded kernels): memory the GPU loses that PyTorch's allocator does not
see, about 0.5 GiB with CUDA 12–13 and lazy module loading. Measure yours: ``torch.cuda.mem_get_info()``
after the first CUDA call, against ``torch.cuda.memory_reserved()``."""
MARGIN = 0.10
"""The share of the allocated peak to keep free for the caching allocator: it rounds sizes up (to 512 B,
and large blocks to 2 MiB segments) and fragments, so it reserves more than it hands out."""


def parameter_count(cfg: GPTConfig) -> int:
    """Parameters of `course_utils.models.GPT` of shape ``cfg``: embeddings, blocks, final norm and head."""
    d, v = cfg.d_model, cfg.vocab
    return v * d + cfg.seq_len * d + cfg.n_layers * _block_params(d) + 2 * d + (d * v + v)


def _block_params(d: int) -> int:
    return (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d) + 2 * 2 * d


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
                world_size: int = 1, fused_adamw: bool = False, workspace: float = WORKSPACE_BYTES,
                context: float = CONTEXT_BYTES, margin: float = MARGIN) -> MemoryPlan:
    """Predict the memory of one training step of `GPT` of shape ``cfg`` on each of ``world_size`` GPUs
    (``cfg.batch`` sequences per GPU), phase by phase. See the module's docstring for the options."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS} ('bf16': autocast with float32 weights), "
                         f"got {precision!r}")
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stages are 0 (none), 1, 2 and 3 (FSDP2's fully_shard), got {stage!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    b, t, d, h, v, L = cfg.batch, cfg.seq_len - 1, cfg.d_model, cfg.n_heads, cfg.vocab, cfg.n_layers
    bf16 = precision == "bf16"
    e = 2 if bf16 else 4  # bytes of the activations the matrix products make
    n = parameter_count(cfg)
    n_block = _block_params(d)
    n_head = d * v + v + 2 * d  # head and final norm: their gradients come first in backward
    w_block = 12 * d * d  # the weights of a block's four linear layers (autocast keeps bf16 copies of these)
    shard = {k: (world_size if stage >= k else 1) for k in (1, 2, 3)}

    # --- what is always there between steps -----------------------------------------------------------
    base = [Term("parameters", 4 * n / shard[3], f"float32, {n / 1e6:.1f} M" + _per(shard[3])),
            Term("AdamW state", 8 * n / shard[1], "two float32 moments" + _per(shard[1])),
            Term("the batch", 8 * b * (t + 1), "int64 token ids"),
            Term("cuBLAS workspace", workspace, "allocated at the first matrix product")]
    if stage <= 1 and world_size > 1:
        base.append(Term("DDP gradient buckets", 4 * n, "a second copy of the gradients, for the all-reduce "
                         "(gradient_as_bucket_view=False, the default)"))
    if stage == 3:
        # FSDP2: the root (embeddings, final norm, head) stays gathered from forward to backward
        # (reshard_after_forward is False for it), and two blocks are gathered at a time (one prefetched)
        root = n - L * n_block
        base.append(Term("gathered root", 4 * root * (1 - 1 / world_size), "root parameters kept whole"))
        gathered = [Term("gathered blocks", 2 * 4 * n_block, "two blocks' parameters all-gathered")]
    else:
        gathered = []

    # --- activations: what autograd saves for backward --------------------------------------------------
    if bf16:  # residual stream and LayerNorms in float32; the linear layers' inputs and outputs in bf16
        per_block = 8 * b * t * d + 28 * b * t * d + 16 * b * t + 4 * b * h * t
        outside = 4 * b * t * d + 8 * b * t + 2 * b * t * d + 4 * b * t * v + 4 + 8 * (b * t + t)
    else:  # 16·b·t·d numbers per block (notebook 08, section 1)
        per_block = 4 * (16 * b * t * d + 4 * b * t + b * h * t)
        outside = 4 * (2 * b * t * d + 2 * b * t + b * t * v + 1) + 8 * (b * t + t)
    kept = 4 * b * t * d if checkpointing else per_block  # per block, until its backward
    acts = Term("activations", L * kept, ("each block's input (checkpointed)" if checkpointing else
                                           f"{L} blocks × {per_block / 2**20:,.0f} MiB saved for backward"))
    outside_t = Term("activations outside blocks", outside, "final norm, head input, log-softmax of the logits")
    copies = [Term("bf16 weight copies", 2 * (L * (0 if checkpointing else w_block) + d * v),
                   "autocast's casts, saved by the linear layers")] if bf16 else []
    logits_fwd = Term("logits", b * t * v * (e + (4 if bf16 else 0)),
                      "the head's output" + (" and its float32 copy for the loss" if bf16 else ""))
    logits_bwd = Term("gradient of the logits", 2 * 4 * b * t * v, "two float32 b·t·vocab tensors in the "
                      "loss's backward (nll_loss's and log_softmax's)")
    phases: dict[str, tuple[Term, ...]] = {
        "forward (the loss)": (*base, *gathered, acts, outside_t, *copies, logits_fwd),
        "backward (the loss)": (*base, *gathered, acts, outside_t, *copies, logits_bwd),
    }

    # --- backward through the blocks, last first: gradients grow, activations shrink --------------------
    transient = (4 + 4 * e) * b * t * d + 4 * b * t * d  # the gradients in flight through a block's MLP
    for i in (L - 1, 0):  # the sums are linear in i: the extremes hold the maximum
        done = n_head + (L - 1 - i) * n_block  # parameters whose gradients exist already
        terms = [*base, *gathered, Term("gradients so far", 4 * done / shard[2], "float32" + _per(shard[2]))]
        if stage == 3:
            terms.append(Term("unsharded block gradient", 4 * n_block, "before its reduce-scatter"))
        terms.append(Term("activations", (i + 1) * kept, f"of blocks 0 to {i}"))
        if checkpointing:
            terms.append(Term("recomputed block", per_block, "its forward run again, everything saved"))
        if bf16:
            terms.append(Term("bf16 weight copies", 2 * w_block * (1 if checkpointing else i + 1),
                              "of the blocks not yet through backward"))
        terms.append(Term("gradients in flight", transient, "the MLP's input and output gradients"))
        phases[f"backward (block {i})"] = tuple(terms)

    # --- the optimizer's step ---------------------------------------------------------------------------
    opt = [*base, Term("gradients", 4 * n / shard[2], "float32" + _per(shard[2]))]
    if not fused_adamw:
        opt.append(Term("AdamW temporaries", 4 * n / shard[1], "foreach: sqrt of the second moment, one "
                        "float32 tensor per parameter"))
    phases["optimizer step"] = tuple(opt)

    job = (f"{n / 1e9:.2f} B parameters, batch {b} × {cfg.seq_len}, {precision}"
           f"{', every block checkpointed' if checkpointing else ''}, ZeRO stage {stage} on {world_size} GPU(s)"
           f", AdamW {'fused' if fused_adamw else 'foreach'}")
    return MemoryPlan(job, phases, context, margin)


def _per(k: int) -> str:
    return f", 1/{k} per GPU" if k > 1 else ""


def measure_peak(cfg: GPTConfig, precision: str = "fp32", checkpointing: bool = False, fused_adamw: bool = False,
                 warmup: int = 2, device: str = "cuda") -> dict[str, int]:
    """One GPU: build `GPT` of shape ``cfg`` and AdamW, train ``warmup`` steps, then measure one step's phases.

    Returns the bytes above what was allocated before the model was made: ``"forward"``, ``"backward"`` and
    ``"optimizer step"`` (``torch.cuda.max_memory_allocated()`` during each), ``"peak"`` (their largest),
    ``"between steps"`` (allocated after ``zero_grad``) and ``"reserved"`` (the most the allocator reserved
    from the GPU in the step, all of it, not only above the start)."""
    from torch.nn import functional as F
    from torch.utils.checkpoint import checkpoint

    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if not torch.cuda.is_available():
        raise RuntimeError("measure_peak needs a CUDA GPU: the caching allocator's counters are CUDA's")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    start = torch.cuda.memory_allocated()
    torch.manual_seed(0)
    model = GPT(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused_adamw or None)
    tokens = token_batch(cfg, torch.Generator().manual_seed(0)).to(device)

    def loss_fn() -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            if not checkpointing:
                return model.loss(tokens)
            inputs, targets = tokens[:, :-1], tokens[:, 1:]
            x = model.tok(inputs) + model.pos(torch.arange(inputs.shape[1], device=tokens.device))
            for block in model.blocks:
                x = checkpoint(block, x, use_reentrant=False)
            logits = model.head(model.norm(x))
            return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    for _ in range(warmup):
        loss_fn().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    out: dict[str, int] = {}
    reserved = 0
    loss = None
    for phase in ("forward", "backward", "optimizer step"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        if phase == "forward":
            loss = loss_fn()
        elif phase == "backward":
            loss.backward()  # type: ignore[union-attr]
            loss = None
        else:
            opt.step()
        torch.cuda.synchronize()
        out[phase] = torch.cuda.max_memory_allocated() - start
        reserved = max(reserved, torch.cuda.max_memory_reserved())
    opt.zero_grad(set_to_none=True)
    out["peak"] = max(out.values())
    out["between steps"] = torch.cuda.memory_allocated() - start
    out["reserved"] = reserved
    model = opt = tokens = None  # type: ignore[assignment]
    torch.cuda.empty_cache()
    return out
