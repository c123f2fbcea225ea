"""Notebook 11: choosing a layout — how many GPUs for data (dp), tensor (tp) and pipeline (pp) parallelism —
for training the course's GPT: the model's state each GPU holds, and the bytes each kind of parallelism makes a
GPU send per step. The training plan of notebook 08 (`course_utils.memory.planner`) counts one GPU's whole step;
this module adds the two model-parallel degrees to its count of the model's state (weights, gradients, AdamW's
moments: 4 + 4 + 8 bytes per float32 parameter, as notebook 08's float32 and autocast plans keep them).

Where the parameters go (`params_per_gpu`), following `course_utils.distributed.model_parallel_demos`'
``block_plan`` and ``tensor_parallel_gpt``:
- **tp** splits each block's four linear weights and the biases of the column-wise ones (qkv, the MLP's fc); the
  row-wise layers' biases (proj, the MLP's out) and the two norms are replicated; the head, column-wise over the
  vocabulary for loss parallel, is split too (``vocab_parallel_head``); the embeddings are replicated;
- **pp** gives each stage ``ceil(n_layers / pp)`` blocks; the first stage holds the embeddings too, the last the
  final norm and the head: the most loaded stage decides;
- **dp** with a ZeRO stage (`Layout.zero`): 1 splits AdamW's moments over the dp ranks, 2 the gradients too,
  3 the parameters too (FSDP2's ``fully_shard``, notebook 08).

What a GPU sends per step (`bytes_sent_per_gpu`), for ring collectives, whose every rank sends ``(n − 1)/n`` of
the tensor for an all-gather or a reduce-scatter and twice that for an all-reduce:
- **dp**: the gradients' all-reduce (ZeRO 0, 1), or a reduce-scatter of the gradients and an all-gather of the
  updated parameters (ZeRO 2: the same bytes), or an all-gather in forward and another in backward
  (ZeRO 3: 1.5 times as many, as the ZeRO paper counts);
- **tp**: two all-reduces of the block's activations ``tokens × d_model`` in forward and two in backward per block
  (Megatron-LM; notebook 11 counts them with ``CommDebugMode``); with sequence parallelism each all-reduce is an
  all-gather and a reduce-scatter, the same bytes. Left out: the head's loss-parallel sums (a few numbers per
  token) and, with sequence parallelism, the all-reduce of the norms' gradients (4 · d_model numbers per block);
- **pp**: a stage sends its output activations forward and the gradient of its input backward, ``tokens ×
  d_model`` each; a middle stage does both.

The activations a GPU saves for backward (`activation_bytes_per_gpu`) start from notebook 08's list of what one
block saves (`course_utils.memory.planner.saved_by_a_block`) and divide by tp what each rank holds a share of,
as measured tensor by tensor on gloo ranks (tests/test_model_parallel_demos.py):
- tensor parallelism splits q, k, v, the attention's log-sum-exp (or probabilities) and output, and the GELU's
  input and output; the norms' inputs and statistics and the inputs of qkv and fc (the norms' outputs) stay
  whole on every rank;
- sequence parallelism splits the norms' inputs and statistics too, but PyTorch's ``ColwiseParallel`` saves the
  all-gathered inputs of qkv and fc for its backward: those two stay whole. (Megatron-LM keeps its shard and
  gathers again in backward, which is why Korthikanti et al., 2022, divide every term by t.)
A pipeline stage holds its blocks' activations for every microbatch in flight: all ``m`` with GPipe, at most
``pp`` on the first stage with 1F1B. The embeddings' and the head's activations are left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..models import GPTConfig
from .planner import saved_by_a_block

__all__ = ["Layout", "activation_bytes_per_gpu", "block_activations", "bytes_sent_per_gpu", "params_per_gpu", "state_bytes_per_gpu"]


@dataclass(frozen=True)
class Layout:
    """``dp × tp × pp`` GPUs; ``zero``: the ZeRO stage over the dp ranks (0 to 3); ``sequence_parallel``: the
    norms' regions split along the sequence over the tp ranks."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    zero: int = 0
    sequence_parallel: bool = False

    def __post_init__(self) -> None:
        if min(self.dp, self.tp, self.pp) < 1:
            raise ValueError(f"Layout: dp, tp and pp must be at least 1, got {self}")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"Layout: zero must be 0, 1, 2 or 3 (the ZeRO stage), got {self.zero}")

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp


def _check(cfg: GPTConfig, layout: Layout, vocab_parallel_head: bool) -> None:
    tp = layout.tp
    if cfg.n_heads % tp:
        raise ValueError(f"tp ({tp}) must divide the heads ({cfg.n_heads}): each rank computes whole heads")
    if vocab_parallel_head and cfg.vocab % tp:
        raise ValueError(f"tp ({tp}) must divide the vocabulary ({cfg.vocab}) to split the head over it "
                         "(or pass vocab_parallel_head=False)")
    if layout.pp > cfg.n_layers:
        raise ValueError(f"pp ({layout.pp}) is more stages than blocks ({cfg.n_layers})")


def params_per_gpu(cfg: GPTConfig, layout: Layout, vocab_parallel_head: bool = True) -> int:
    """Parameters the most loaded GPU holds before ZeRO shards anything (see the module's docstring)."""
    _check(cfg, layout, vocab_parallel_head)
    d, v, tp = cfg.d_model, cfg.vocab, layout.tp
    split = 12 * d * d + 3 * d + 4 * d  # the four weights, qkv's and fc's biases
    per_block = split // tp + 2 * d + 4 * d  # + proj's and out's biases, the two norms' weights and biases
    blocks = math.ceil(cfg.n_layers / layout.pp) * per_block
    embeddings = (v + cfg.seq_len) * d
    head = (d * v + v) // tp if vocab_parallel_head else d * v + v
    last = 2 * d + head  # final norm and head
    if layout.pp == 1:
        return blocks + embeddings + last
    return blocks + max(embeddings, last)


def state_bytes_per_gpu(cfg: GPTConfig, layout: Layout, vocab_parallel_head: bool = True) -> dict[str, float]:
    """Bytes of the model's state on the most loaded GPU: float32 ``parameters``, ``gradients`` and AdamW's two
    ``optimizer`` moments, each divided by dp where the ZeRO stage shards it."""
    n = params_per_gpu(cfg, layout, vocab_parallel_head)
    dp, zero = layout.dp, layout.zero
    return {"parameters": 4 * n / (dp if zero >= 3 else 1), "gradients": 4 * n / (dp if zero >= 2 else 1),
            "optimizer": 8 * n / (dp if zero >= 1 else 1)}


def bytes_sent_per_gpu(cfg: GPTConfig, layout: Layout, tokens: int, activation_bytes: int = 2,
                       gradient_bytes: int = 4, vocab_parallel_head: bool = True) -> dict[str, float]:
    """Bytes the most loaded GPU sends in one training step for each kind of parallelism (``"dp"``, ``"tp"``,
    ``"pp"``), ring collectives, when its dp rank processes ``tokens`` tokens per step (all its microbatches
    together); activations of ``activation_bytes`` per number (bf16: 2), gradients and parameters exchanged in
    ``gradient_bytes`` (float32: 4). See the module's docstring for what each counts."""
    if tokens < 1:
        raise ValueError(f"bytes_sent_per_gpu: tokens must be at least 1, got {tokens}")
    n = params_per_gpu(cfg, layout, vocab_parallel_head)
    dp, tp, pp = layout.dp, layout.tp, layout.pp
    ring = (dp - 1) / dp
    dp_bytes = {0: 2, 1: 2, 2: 2, 3: 3}[layout.zero] * ring * gradient_bytes * n
    x = tokens * cfg.d_model * activation_bytes  # one block's input or output
    blocks = math.ceil(cfg.n_layers / pp)
    tp_bytes = blocks * 4 * 2 * (tp - 1) / tp * x  # four all-reduces per block (or their halves, with SP)
    pp_bytes = 0.0 if pp == 1 else (2 * x if pp > 2 else x)
    return {"dp": dp_bytes, "tp": tp_bytes, "pp": pp_bytes}


_SPLIT_BY_TP = ("q, k, v", "attention log-sum-exp", "attention probabilities", "attention output (projection's input)",
                "GELU's input (first MLP layer's output)", "GELU's output (second MLP layer's input)")
_SPLIT_BY_SP = ("first norm's input (the block's input)", "first norm's mean and rstd",
                "second norm's input (the residual)", "second norm's mean and rstd")
_GATHERED = ("qkv layer's input (first norm's output)", "MLP's input (second norm's output)")


def block_activations(cfg: GPTConfig, layout: Layout, act: int = 2, res: int = 4, attention: str = "fused",
                      keep_gathered_inputs: bool = True) -> tuple[tuple[str, float, float], ...]:
    """What one block saves for backward, tensor by tensor: ``(name, bytes per token in one process, bytes per
    token on one of ``layout.tp`` ranks)``, for sequences of ``cfg.seq_len - 1`` tokens; ``act``, ``res`` and
    ``attention`` as `activation_bytes_per_gpu` takes them. With sequence parallelism, ``keep_gathered_inputs``
    is what PyTorch's ``ColwiseParallel`` does (the all-gathered inputs of qkv and fc are saved whole);
    ``False`` is Megatron-LM's choice, which Korthikanti et al. (2022) count: each rank saves its share of the
    sequence and gathers it again in backward, so every tensor of the block is divided by tp."""
    _check(cfg, layout, vocab_parallel_head=False)
    sp, tp = layout.sequence_parallel, layout.tp
    rows = []
    for name, nbytes in saved_by_a_block(cfg.d_model, cfg.n_heads, cfg.seq_len - 1, act, res, attention):
        split = name in _SPLIT_BY_TP or (sp and (name in _SPLIT_BY_SP or
                                                  (name in _GATHERED and not keep_gathered_inputs)))
        rows.append((name, float(nbytes), nbytes / tp if split else float(nbytes)))
    return tuple(rows)


def activation_bytes_per_gpu(cfg: GPTConfig, layout: Layout, microbatch: int, microbatches: int = 1,
                             schedule: str = "1F1B", act: int = 2, res: int = 4, attention: str = "fused") -> float:
    """Bytes of activations the most loaded GPU saves for backward at its peak: its stage's blocks, each over
    ``microbatch`` sequences of ``cfg.seq_len - 1`` tokens, for every microbatch in flight (``schedule``:
    ``"GPipe"`` keeps all ``microbatches``, ``"1F1B"`` at most ``pp``); ``act`` and ``res`` bytes per number
    of what the products make and of the residual stream, ``attention`` as `plan_memory` takes it. Each tensor
    of `saved_by_a_block` is divided by tp where the module's docstring says a rank holds a share of it
    (`block_activations`)."""
    if schedule not in ("GPipe", "1F1B"):
        raise ValueError(f"schedule must be 'GPipe' or '1F1B', got {schedule!r}")
    if microbatch < 1 or microbatches < 1:
        raise ValueError(f"microbatch and microbatches must be at least 1, got {microbatch} and {microbatches}")
    per_token = sum(per_rank for _, _, per_rank in block_activations(cfg, layout, act, res, attention))
    t = cfg.seq_len - 1
    in_flight = microbatches if schedule == "GPipe" else min(microbatches, layout.pp)
    return math.ceil(cfg.n_layers / layout.pp) * microbatch * t * per_token * in_flight
